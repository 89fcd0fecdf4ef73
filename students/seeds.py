"""Every random stream of a training run, derived from one seed.

As in the augmenters, streams come from `numpy.random.SeedSequence(seed)`: its spawned children
are independent whatever the seed, where `seed * 1000 + epoch` style arithmetic makes runs with
nearby seeds share streams. `stream(seed, SHUFFLE, phase, epoch)` is the child that
`SeedSequence(seed).spawn(...)[SHUFFLE].spawn(...)[phase].spawn(...)[epoch]` would give, built
directly so no spawn counter has to be threaded through the run.
"""
from __future__ import annotations

import numpy as np

INIT, SHUFFLE, DROPOUT = 0, 1, 2  # weight initialisation (and PCA padding), batch order, dropout


def stream(seed: int, which: int, *path: int) -> np.random.SeedSequence:
    return np.random.SeedSequence(seed, spawn_key=(which, *path))


def torch_seed(seq: np.random.SeedSequence) -> int:
    """A seed for torch.manual_seed / torch.Generator (63 bits: torch takes a signed 64-bit int)."""
    return int(seq.generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))
