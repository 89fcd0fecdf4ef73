"""Joined rows: texts made of 2 to join_max original rows drawn at random, which the teacher labels.

A set of phrases (SST-2's train file: 9.7 words a row) holds few long texts, and a student distilled on it is
weakest where its test data is longest (SST-2's dev file: whole sentences, 19 words a row). Joining originals
gives it long inputs with the teacher's view of them. A "rows" op: it reads several rows, not one, so the
pipeline runs it on random buckets of originals (`entries` → `bucket_of` → `joined_rows`), never inside one
example's variants. Rows with a second text (sentence pairs) are not joined.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from transferset.augment.compose import Row
from transferset.augment.registry import ROWS, register
from transferset.augment.seeding import rng_for, row_id
from transferset.runtime.typed import AtLeast, NonNegative

OP = "join"
BUCKET_ENTRIES = 64  # originals per random bucket, on average: the pool each bucket's joins draw from
SEPARATOR = "+"  # a joined row's source_id: its parts' ids, in the order of its text


@dataclass(frozen=True)
class JoinSettings:
    joins: NonNegative = 0.5  # joined rows per original row (0.5: one for every two originals)
    join_max: AtLeast(2) = 3  # a joined row is 2 to join_max original rows, the number uniform in that range


@register(OP, kind=ROWS, settings=JoinSettings)
def join(*, rows: Sequence[tuple[str, str]], rng: np.random.Generator, join_max: int) -> list[list[int]]:
    """A bucket's (source_id, text) rows → groups of 2 to join_max of their indices, in a random order, no source
    twice in a group (an original goes into the buckets several times when `joins` is large, and a small set is
    one bucket); rows left over that cannot make a group of two sources join nothing."""
    order = [int(x) for x in rng.permutation(len(rows))]
    groups = []
    while len(order) >= 2:
        k = int(rng.integers(2, join_max + 1))
        group, rest, sources = [], [], set()
        for i in order:  # the next k of the order, a source already in the group left for a later one
            if len(group) < k and rows[i][0] not in sources:
                group.append(i)
                sources.add(rows[i][0])
            else:
                rest.append(i)
        if len(group) < 2:
            break  # what is left is one source's entries
        groups.append(group)
        order = rest
    return groups


def entries(source_id: str, text: str, text_b: Optional[str], *, seed: int, joins: float,
            join_max: int) -> list[tuple[int, tuple[str, str]]]:
    """How often an original goes into the buckets: joins × the mean group size, on average (a fraction drawn),
    each time under a random key → [(key, (source_id, text))]; none for a sentence pair."""
    if text_b is not None or joins <= 0:
        return []
    rng = rng_for(seed, source_id, 0, salt=OP)
    times = joins * (2 + join_max) / 2
    count = int(times) + int(rng.random() < times - int(times))
    return [(int(rng.integers(0, 2**62)), (source_id, text)) for _ in range(count)]


def bucket_of(key: int, total_entries: int) -> int:
    """The bucket of an entry's key, with about BUCKET_ENTRIES entries a bucket."""
    return key % max(1, math.ceil(total_entries / BUCKET_ENTRIES))


def joined_rows(bucket: int, members: Sequence[tuple[str, str]], *, seed: int, join_max: int) -> list[Row]:
    """One bucket's entries → its joined rows (no gold label: the teacher labels them), the same whatever order a
    runner delivers the entries in."""
    members = sorted(members)
    rows = []
    for group in join(rows=members, rng=rng_for(seed, f"bucket-{bucket}", 0, salt=OP), join_max=join_max):
        source = SEPARATOR.join(members[i][0] for i in group)
        text = " ".join(members[i][1] for i in group)
        rows.append(Row(row_id(source, (OP,), 0, text), source, text, None, (OP,), None, 0))
    return rows
