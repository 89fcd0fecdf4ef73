"""Optimizers stepped as one and clipping over sparse gradients (transferset/training/optimizers.py)."""
import copy

import pytest
import torch
import torch.nn as nn

from transferset.training.optimizers import Optimizers, clip_grad_norm, has_sparse_grad

IDS = torch.tensor([[1, 2, 2, 5], [5, 7, 1, 0]])  # rows used twice: a sparse gradient holds them twice


def _model(sparse: bool):
    torch.manual_seed(0)
    return nn.Embedding(9, 4, sparse=sparse), nn.Linear(4, 3)


def _backward(emb, lin):
    lin(emb(IDS)).pow(2).mean().backward()


@pytest.mark.parametrize("max_norm", [0.05, 100.0])  # clipped, and left alone under the bound
def test_clipping_a_sparse_gradient_equals_torchs_clipping_of_its_dense_form(max_norm):
    (se, sl), (de, dl) = _model(True), _model(False)
    _backward(se, sl)
    _backward(de, dl)
    assert has_sparse_grad([se.weight]) and not has_sparse_grad([de.weight, dl.weight])
    total = clip_grad_norm([se.weight, *sl.parameters()], max_norm)
    expected = torch.nn.utils.clip_grad_norm_([de.weight, *dl.parameters()], max_norm)
    assert float(total) == pytest.approx(float(expected), rel=1e-6) and float(total) > 0.1
    assert torch.allclose(se.weight.grad.to_dense(), de.weight.grad, atol=1e-7)
    assert all(torch.allclose(a.grad, b.grad, atol=1e-7) for a, b in zip(sl.parameters(), dl.parameters()))
    assert clip_grad_norm([nn.Parameter(torch.ones(2))], 1.0) == 0  # no gradient at all


def _pair(emb, lin):
    return Optimizers([torch.optim.SparseAdam(list(emb.parameters()), lr=0.1),
                       torch.optim.AdamW(lin.parameters(), lr=0.1)])


def _steps(emb, lin, opt, sched, n):
    for _ in range(n):
        _backward(emb, lin)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)


def _schedule(opt):
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (step + 1))


def test_the_members_step_together_under_one_schedule_and_resume_from_one_state():
    emb, lin = _model(True)
    before = emb.weight.detach().clone()
    opt = _pair(emb, lin)
    sched = _schedule(opt)
    _steps(emb, lin, opt, sched, 2)
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.1 / 3, 0.1 / 3])  # both groups scheduled
    moved = (emb.weight.detach() != before).any(dim=1)
    assert moved.tolist() == [i in (0, 1, 2, 5, 7) for i in range(9)]  # lazy: only the rows the batches used
    state, sched_state = copy.deepcopy(opt.state_dict()), sched.state_dict()  # as a checkpoint file holds it
    _steps(emb, lin, opt, sched, 2)

    emb2, lin2 = _model(True)  # the same two steps, then the saved state loaded into fresh optimizers
    _steps(emb2, lin2, *(lambda o: (o, _schedule(o)))(_pair(emb2, lin2)), 2)
    again = _pair(emb2, lin2)
    again_sched = _schedule(again)
    again.load_state_dict(state)
    again_sched.load_state_dict(sched_state)
    _steps(emb2, lin2, again, again_sched, 2)
    assert torch.equal(emb.weight, emb2.weight) and torch.equal(lin.weight, lin2.weight)
    assert [len(o.state) for o in again.optimizers] == [1, 2]  # the table's moments, the linear layer's two tensors'


def test_a_closure_and_a_state_of_other_members_are_refused():
    emb, lin = _model(True)
    opt = _pair(emb, lin)
    with pytest.raises(ValueError, match="takes no closure"):
        opt.step(lambda: 0.0)
    with pytest.raises(ValueError, match="a state of 1 optimizers does not fit 2"):
        opt.load_state_dict({"optimizers": [opt.optimizers[0].state_dict()]})
    assert repr(opt) == "Optimizers(SparseAdam, AdamW)"
