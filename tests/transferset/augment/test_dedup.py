"""transferset/augment/dedup.py: rows keyed by a digest of the normalized text, the winner kept, counts summed."""
from transferset.augment import variant_rows
from transferset.config import AugmentConfig


def test_rows_cross_the_dedup_grouping_packed_and_keyed_by_a_digest_of_the_normalized_text():
    from transferset.augment.compose import original_row
    from transferset.augment.dedup import dedup_digest, dedup_key, pack, resolve, resolve_packed, unpack

    original = original_row("train.tsv:3", "A  Fine film", "and cast", 1)
    variant = next(iter(variant_rows("train.tsv:3", "a fine film", "and cast", cfg=AugmentConfig(n_iter=1, seed=0),
                                     context={"tags": ["DET", "ADJ", "NOUN"]})))
    for row in (original, variant):
        assert unpack(pack(row)) == (row, 1) and unpack(pack(row, 3)) == (row, 3) and len(pack(row)) < 200
    # texts equal once normalized share a key; another text or another second sentence does not
    assert dedup_digest("A  Fine film", "and cast") == dedup_digest("a fine film", "AND cast")
    assert len({dedup_digest("a fine film", "and cast"), dedup_digest("a fine film"),
                dedup_digest("a fine film", "and crew"), dedup_digest("a fine flim", "and cast")}) == 4
    assert dedup_key("A  Fine film") == "a fine film"
    assert resolve([variant, original], False) == (original, 1, 0)
    assert resolve_packed([pack(variant, 2), pack(original)], False) == (original, 2, 0)
    assert resolve_packed([pack(variant, 2), pack(original)], True) == (None, 0, 3)
    assert resolve_packed([], False) == (None, 0, 0)


def test_collapsing_an_examples_repeats_first_keeps_the_winner_and_every_count():
    """dedup.collapse then resolve_packed (two rounds) == resolve over all rows at once (one round)."""
    import random

    from transferset.augment.compose import Row
    from transferset.augment.dedup import collapse, dedup_digest, pack, resolve, resolve_packed

    rnd = random.Random(0)
    texts = ["a fine film", "A  fine film", "dull", "a fine", "fine film"]
    examples = [[Row(f"id{rnd.randrange(10**6)}", f"s{e}", rnd.choice(texts), None, (), None, rnd.choice([-1, 0, 1, 2]))
                 for _ in range(rnd.randrange(1, 8))] for e in range(40)]
    everything = [r for rows in examples for r in rows]
    collapsed = [c for rows in examples for c in collapse(rows)]
    assert len(collapsed) < len(everything)  # repeats inside an example were collapsed
    for excluded in (False, True):
        for text in texts:
            d = dedup_digest(text)
            one_round = resolve([r for r in everything if dedup_digest(r.text) == d], excluded)
            two_rounds = resolve_packed([pack(row, n) for digest, row, n in collapsed if digest == d], excluded)
            assert two_rounds == one_round
    assert sum(n for _, _, n in collapse(examples[0])) == len(examples[0])


def test_dedup_through_bucket_files_equals_resolve_over_all_rows(tmp_path):
    """SpillWriter then dedup_spilled per bucket == resolve over every row at once, with the counts."""
    import random

    import pyarrow.ipc as ipc

    from transferset.augment.compose import Row
    from transferset.augment.dedup import SpillWriter, bucket_of, dedup_digest, dedup_spilled, pack, resolve

    rnd = random.Random(1)
    texts = [f"text {i}" for i in range(60)]
    rows = [Row(f"id{i}", f"s{i % 7}", rnd.choice(texts), None, (), None, rnd.choice([-1, 0, 1])) for i in range(500)]
    writer = SpillWriter(str(tmp_path / "spill"), buckets=4, flush_rows=16)
    written = [w for row in rows for w in [writer.add(dedup_digest(row.text), pack(row))] if w] + writer.close()
    assert len(written) == writer.files > 4  # buckets flushed at 16 rows, then the rest at close
    paths = {}
    for bucket, path in written:
        table = ipc.open_file(str(path)).read_all()
        assert 0 < table.num_rows <= 16 and {bucket_of(d, 4) for d in table.column("digest").to_pylist()} == {bucket}
        paths.setdefault(bucket, []).append(path)
    assert sum(ipc.open_file(p).read_all().num_rows for ps in paths.values() for p in ps) == len(rows)
    excluded = {dedup_digest("text 3"), dedup_digest("text 40")}
    got = [r for ps in paths.values() for r in dedup_spilled(ps, excluded)]
    want = [resolve([r for r in rows if r.text == t], dedup_digest(t) in excluded) for t in texts
            if any(r.text == t for r in rows)]
    assert sorted(got, key=str) == sorted(want, key=str)
    kept = [w for w, _, _ in got if w is not None]
    assert len(kept) + sum(d for _, d, _ in got) + sum(x for _, _, x in got) == len(rows)  # every row accounted for
    assert sum(x for _, _, x in got) == sum(r.text in ("text 3", "text 40") for r in rows) > 0
