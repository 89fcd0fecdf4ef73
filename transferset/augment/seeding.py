"""No hidden randomness: every row's generator comes from (seed, source_id, variant index).

So a retried Beam bundle, another runner or another worker count yields the same rows.
"""
from __future__ import annotations

import hashlib

import numpy as np


def source_int(value: str | int) -> int:
    if isinstance(value, int):
        return value
    return int.from_bytes(hashlib.sha256(value.encode("utf-8")).digest()[:16], "big")


def rng_for(seed: int, source_id: str | int, variant: int, salt: str = "") -> np.random.Generator:
    entropy = [int(seed), source_int(source_id), int(variant) + 1, source_int(salt) if salt else 0]
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(entropy)))


def row_id(source_id: str, ops: list[str] | tuple[str, ...], variant: int, text: str,
           text_b: str | None = None) -> str:
    """Stable id of a row: a hash of (source_id, ops, variant index, text)."""
    h = hashlib.sha1()
    for part in (source_id, "\x1e".join(ops), str(variant), text, text_b or ""):
        h.update(part.encode("utf-8"))
        h.update(b"\x1f")
    return h.hexdigest()[:20]
