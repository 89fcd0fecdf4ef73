"""The trained weights' exponential moving average (Polyak averaging), which a phase with `PhaseSpec.ema`
evaluates, keeps and ends on in place of the weights the optimizer left.

The decay warms up as in TensorFlow's ExponentialMovingAverage: after t steps it is min(ema, (1 + t) / (10 + t)),
so the first steps' weights, far from where training ends, fade fast.

Kept over torch.optim.swa_utils.AveragedModel(get_ema_multi_avg_fn): its decay is fixed (no warm-up), its first
update drops the phase's starting weights, and it deep-copies the whole module (state_dict keys `module.*`,
`n_averaged`) where this averages only the phase's trained parameters and swaps them into the live module
(tests/transferset/training/test_average.py shows the weights differ).
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Optional, Sequence

import torch


class WeightAverage:
    """The moving average of `params` (the parameters a phase trains), on their devices."""

    def __init__(self, params: Sequence[torch.nn.Parameter], decay: float, saved: Optional[Sequence] = None):
        self.params, self.decay = list(params), decay
        self.values = [p.detach().clone() for p in self.params]
        if saved is not None:  # a checkpoint's, for a phase that goes on
            if len(saved) != len(self.values):
                raise ValueError(f"the checkpoint's weight average has {len(saved)} tensors, the phase trains "
                                 f"{len(self.values)} parameters")
            for v, s in zip(self.values, saved):
                v.copy_(s)

    def step(self, steps_done: int) -> None:
        """After an optimizer step (`steps_done` before it in the phase): the average moves toward the weights."""
        weight = 1.0 - min(self.decay, (1 + steps_done) / (10 + steps_done))
        with torch.no_grad():
            for v, p in zip(self.values, self.params):
                v.lerp_(p.detach(), weight)

    @contextlib.contextmanager
    def swapped_in(self) -> Iterator[None]:
        """The average in the parameters for the block; the trained weights back after it."""
        with torch.no_grad():
            live = [p.detach().clone() for p in self.params]
        self.load()
        try:
            yield
        finally:
            with torch.no_grad():
                for p, w in zip(self.params, live):
                    p.copy_(w)

    def load(self) -> None:
        """The average into the parameters, for good (a phase that ends on it)."""
        with torch.no_grad():
            for p, v in zip(self.params, self.values):
                p.copy_(v)

    def state(self) -> list:
        """For a checkpoint: the average on the CPU."""
        return [v.detach().cpu().clone() for v in self.values]
