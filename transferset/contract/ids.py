"""Repeated ids found through 64-bit hashes: 8 bytes a row, never a set of strings.

The score stage (which ids need an exact look-up before routing) and the students (refuse a set
written twice) find repeated ids the same way: hash every id, keep the hashes seen twice (or given
as already seen), then look at the ids of only those hashes. A hash collision costs one id an exact
look-up, never a wrong answer.
"""
from __future__ import annotations

import hashlib
from typing import Iterable, Sequence

import numpy as np


def id_hash(key: str) -> int:
    """An id's 64-bit hash, the same in every process and worker (Python's hash() is salted per process)."""
    return int.from_bytes(hashlib.blake2b(str(key).encode("utf-8"), digest_size=8).digest(), "little")


def id_hashes(keys: Iterable[str], *, stable: bool = True, count: int = -1) -> np.ndarray:
    """The 64-bit hashes of `keys` (uint64). stable=False: Python's str hash, salted per process, for
    hashes that never leave one process: ~10x faster (0.09 s against 0.9 s a million ids)."""
    if stable:
        return np.fromiter((id_hash(k) for k in keys), dtype=np.uint64, count=count)
    return np.fromiter(map(hash, keys), dtype=np.int64, count=count).view(np.uint64)


def repeated_hashes(parts: Sequence[np.ndarray], seen: Sequence[np.ndarray] = ()) -> np.ndarray:
    """Sorted unique hashes that occur twice across `parts`, or once there and in `seen` (e.g. ids already
    written): every repeated id has one of them. Peak memory: the joined hashes, plus a byte a row."""
    joined = np.concatenate([np.empty(0, np.uint64), *parts])
    joined.sort()
    repeated = np.unique(joined[1:][joined[1:] == joined[:-1]])
    if seen:
        repeated = np.union1d(repeated, np.concatenate(seen)).astype(np.uint64)
    return repeated


def in_sorted(sorted_hashes: np.ndarray, hashes: np.ndarray) -> np.ndarray:
    """Which of `hashes` are in `sorted_hashes` (a boolean per hash)."""
    if not len(sorted_hashes):
        return np.zeros(len(hashes), dtype=bool)
    at = np.minimum(np.searchsorted(sorted_hashes, hashes), len(sorted_hashes) - 1)
    return sorted_hashes[at] == hashes
