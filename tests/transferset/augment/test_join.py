"""transferset/augment/join.py: joined rows of 2 to join_max originals, drawn by seeded randomness alone."""
import statistics

import numpy as np
import pytest

from transferset.augment import join
from transferset.augment.seeding import rng_for


@pytest.mark.parametrize("n, join_max", [(0, 3), (1, 3), (2, 2), (7, 3), (64, 3), (64, 5)])
def test_groups_are_disjoint_of_2_to_join_max_and_a_lone_leftover_joins_nothing(n, join_max):
    rows = [(f"s{i}", f"text {i}") for i in range(n)]
    groups = join.join(rows=rows, rng=rng_for(0, "b", 0), join_max=join_max)
    used = [i for g in groups for i in g]
    assert len(used) == len(set(used)) and set(used) <= set(range(n))
    assert all(2 <= len(g) <= join_max for g in groups)
    assert n - len(used) <= 1  # at most the one left alone
    if n >= 2:
        assert groups


def _sliced(n, rng, join_max):
    """The groups rows of distinct sources get: the seeded permutation cut in runs of 2 to join_max, a lone
    leftover joining nothing."""
    order, groups, i = rng.permutation(n), [], 0
    while i < n:
        k = int(rng.integers(2, join_max + 1))
        if n - i >= 2:
            groups.append([int(x) for x in order[i:i + k]])
        i += k
    return groups


@pytest.mark.parametrize("n, join_max", [(7, 3), (64, 3), (64, 5)])
def test_distinct_rows_are_grouped_as_the_permutation_cut_in_runs(n, join_max):
    rows = [(f"s{i}", f"text {i}") for i in range(n)]
    assert join.join(rows=rows, rng=rng_for(2, "b", 0), join_max=join_max) == _sliced(n, rng_for(2, "b", 0), join_max)


@pytest.mark.parametrize("seed", range(20))
def test_no_group_holds_a_source_twice_when_originals_repeat_in_a_bucket(seed):
    # a small set (one bucket) with joins 2: each original goes in 5 times; one original 6 times
    rows = sorted([(f"s{i}", f"text {i}") for i in range(6) for _ in range(5)] + [("s9", "text 9")] * 6)
    groups = join.join(rows=rows, rng=rng_for(seed, "bucket-0", 0), join_max=3)
    used = [i for g in groups for i in g]
    assert len(used) == len(set(used))
    assert all(2 <= len(g) <= 3 and len({rows[i][0] for i in g}) == len(g) for g in groups)
    left = {rows[i][0] for i in set(range(len(rows))) - set(used)}
    assert len(left) <= 1  # what is left over is one source's entries, which cannot join each other
    assert len(used) >= len(rows) - 6
    rows2 = [("a", "x"), ("a", "x"), ("a", "x")]
    assert join.join(rows=rows2, rng=rng_for(seed, "b", 0), join_max=3) == []


def test_entries_average_joins_times_the_mean_group_size_and_skip_pairs():
    counts = [len(join.entries(f"id{i}", "some words", None, seed=3, joins=0.5, join_max=3)) for i in range(4000)]
    assert statistics.mean(counts) == pytest.approx(0.5 * 2.5, rel=0.05) and set(counts) == {1, 2}
    assert join.entries("id1", "premise", "hypothesis", seed=3, joins=0.5, join_max=3) == []
    assert join.entries("id1", "words", None, seed=3, joins=0.0, join_max=3) == []
    again = join.entries("id7", "some words", None, seed=3, joins=0.5, join_max=3)
    assert again == join.entries("id7", "some words", None, seed=3, joins=0.5, join_max=3)  # seeded, not drawn
    assert again != join.entries("id7", "some words", None, seed=4, joins=0.5, join_max=3) or len(again) == 1


def test_buckets_hold_about_bucket_entries_each():
    keys = [int(k) for k in np.random.default_rng(0).integers(0, 2**62, size=6400)]
    sizes = np.bincount([join.bucket_of(k, len(keys)) for k in keys])
    assert len(sizes) == 6400 // join.BUCKET_ENTRIES and sizes.mean() == join.BUCKET_ENTRIES
    assert {join.bucket_of(k, 10) for k in keys} == {0}  # few entries: one bucket


def test_joined_rows_are_their_parts_texts_in_order_without_a_label_whatever_the_delivery_order():
    members = [(f"src{i}", f"phrase number {i}") for i in range(10)]
    rows = join.joined_rows(5, members, seed=1, join_max=3)
    assert rows == join.joined_rows(5, list(reversed(members)), seed=1, join_max=3)
    assert rows != join.joined_rows(6, members, seed=1, join_max=3)
    texts = dict(members)
    for row in rows:
        parts = row.source_id.split(join.SEPARATOR)
        assert 2 <= len(parts) <= 3 and row.text == " ".join(texts[p] for p in parts)
        assert (row.ops, row.label, row.text_b, row.is_original) == (("join",), None, None, False)
    assert len({row.id for row in rows}) == len(rows) >= 3
