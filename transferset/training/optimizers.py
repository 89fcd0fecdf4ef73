"""Optimizers the recipe steps as one, and gradient clipping that holds for sparse gradients.

A word table trained with sparse gradients (`nn.Embedding(sparse=True)`, the BiLSTM's and the static
student's `model: {sparse: true}`) learns by lazy Adam (`torch.optim.SparseAdam`: a step reads and writes the
rows a batch used, not the whole table), the rest of the model by AdamW. `Optimizers` holds both behind the
one optimizer a phase has: a learning-rate schedule scales every group of both, a checkpoint saves both.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import torch


class Optimizers(torch.optim.Optimizer):
    """Several optimizers over disjoint parameters, stepped, zeroed, scheduled and saved as one."""

    def __init__(self, optimizers: Sequence[torch.optim.Optimizer]):
        self.optimizers = list(optimizers)
        # Optimizer's own set-up (its step hooks, which a schedule and the tests register), then the members'
        # groups themselves, so that a learning rate set here is the one a member steps with.
        super().__init__([p for opt in self.optimizers for g in opt.param_groups for p in g["params"]], {})
        self.param_groups = [g for opt in self.optimizers for g in opt.param_groups]

    def step(self, closure=None):  # Optimizer wraps it: the step hooks run around it
        if closure is not None:
            raise ValueError("Optimizers.step takes no closure")
        for opt in self.optimizers:
            opt.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return {"optimizers": [opt.state_dict() for opt in self.optimizers]}

    def load_state_dict(self, state_dict: dict) -> None:
        saved = state_dict["optimizers"]
        if len(saved) != len(self.optimizers):
            raise ValueError(f"a state of {len(saved)} optimizers does not fit {len(self.optimizers)}")
        for opt, state in zip(self.optimizers, saved):
            opt.load_state_dict(state)
        self.param_groups = [g for opt in self.optimizers for g in opt.param_groups]  # loading made new ones

    def __repr__(self) -> str:
        return f"Optimizers({', '.join(type(o).__name__ for o in self.optimizers)})"


def has_sparse_grad(params: Iterable[torch.nn.Parameter]) -> bool:
    return any(p.grad is not None and p.grad.is_sparse for p in params)


@torch.no_grad()
def clip_grad_norm(params: Iterable[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_ (the 2-norm over every gradient, scaled down to `max_norm`) where some
    gradients are sparse, which it refuses: a sparse gradient's norm is that of its coalesced values (a row a batch
    used twice counts once, summed). → the total norm before clipping."""
    grads = []
    for p in params:
        if p.grad is None:
            continue
        if p.grad.is_sparse:
            p.grad = p.grad.coalesce()
        grads.append(p.grad)
    if not grads:
        return torch.tensor(0.0)
    norms = [torch.linalg.vector_norm(g._values() if g.is_sparse else g) for g in grads]
    total = torch.linalg.vector_norm(torch.stack(norms))
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef)
    return total
