"""transferset/training/average.py: the trained weights' moving average, alone and in a phase of the recipe
(PhaseSpec.ema): what is evaluated, kept, ended on and resumed."""
import pytest
import torch

from linear_task import Linear, _loss, _run
from linear_task import engine  # noqa: F401 (a fixture)
from transferset.training import Checkpoints, PhaseSpec, Recipe
from transferset.training.average import WeightAverage


def _expected(steps, decay):
    """The average by hand: starts at the phase's first weights, each step's weights lerped in at the warmed-up
    decay min(decay, (1 + t) / (10 + t))."""
    avg = steps[0].clone()
    for t, w in enumerate(steps[1:]):
        d = min(decay, (1 + t) / (10 + t))
        avg = d * avg + (1 - d) * w
    return avg


def test_the_average_warms_up_swaps_in_and_back_and_refuses_a_checkpoint_of_another_shape():
    p = torch.nn.Parameter(torch.tensor([0.0, 10.0]))
    avg = WeightAverage([p], decay=0.5)
    with torch.no_grad():
        p.copy_(torch.tensor([10.0, 0.0]))
    avg.step(0)  # decay min(0.5, 1 / 10) = 0.1: 0.1 * start + 0.9 * now
    torch.testing.assert_close(avg.values[0], torch.tensor([9.0, 1.0]))
    avg.step(20)  # decay min(0.5, 21 / 30) = 0.5
    torch.testing.assert_close(avg.values[0], torch.tensor([9.5, 0.5]))
    with avg.swapped_in():
        torch.testing.assert_close(p.detach(), torch.tensor([9.5, 0.5]))
    torch.testing.assert_close(p.detach(), torch.tensor([10.0, 0.0]))
    resumed = WeightAverage([p], decay=0.5, saved=avg.state())
    torch.testing.assert_close(resumed.values[0], torch.tensor([9.5, 0.5]))
    resumed.load()
    torch.testing.assert_close(p.detach(), torch.tensor([9.5, 0.5]))
    with pytest.raises(ValueError, match="has 2 tensors, the phase trains 1 parameters"):
        WeightAverage([p], decay=0.5, saved=[p.detach(), p.detach()])


def test_the_average_is_the_warmed_up_one_by_hand_where_torchs_averaged_model_is_not():
    """Why average.py is kept over torch.optim.swa_utils.AveragedModel with get_ema_multi_avg_fn: the library's
    decay is fixed and its first update drops the phase's starting weights, so it gives other weights."""
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    torch.manual_seed(0)
    module = torch.nn.Linear(3, 2)
    ours = WeightAverage(list(module.parameters()), decay=0.9)
    library = AveragedModel(module, multi_avg_fn=get_ema_multi_avg_fn(0.9))
    opt, steps = torch.optim.SGD(module.parameters(), lr=0.1), [torch.cat([p.detach().flatten().clone()
                                                                         for p in module.parameters()])]
    for t in range(20):
        opt.zero_grad()
        module(torch.randn(4, 3)).pow(2).sum().backward()
        opt.step()
        steps.append(torch.cat([p.detach().flatten().clone() for p in module.parameters()]))
        ours.step(t)
        library.update_parameters(module)
    torch.testing.assert_close(torch.cat([v.flatten() for v in ours.values]), _expected(steps, 0.9), rtol=0, atol=1e-6)
    fixed = steps[1].clone()  # the library's: from the first step's weights, decay 0.9 throughout
    for w in steps[2:]:
        fixed = 0.9 * fixed + 0.1 * w
    theirs = torch.cat([p.detach().flatten() for p in library.module.parameters()])
    torch.testing.assert_close(theirs, fixed, rtol=0, atol=1e-6)
    assert (theirs - _expected(steps, 0.9)).abs().max() > 1e-3
    assert {"n_averaged", "module.weight"} <= set(library.state_dict())  # and a checkpoint of another shape


def _flat(module):
    return torch.cat([module.fc.weight.detach().flatten(), module.fc.bias.detach()])


def _weights_after_each_step(engine, spec):
    """The tiny task trained without an average: the weights as the phase starts and after each step."""
    torch.manual_seed(0)
    module, seen = Linear(), []

    def loss(net, batch):
        seen.append(_flat(module).clone())
        return _loss(net, batch)

    recipe = Recipe(engine)
    _run(recipe, spec, module, lambda: {"accuracy": 0.5}, loss=loss)
    seen.append(_flat(module).clone())
    return seen, recipe


def test_a_phase_with_ema_evaluates_and_ends_on_the_average_and_trains_as_without_it(engine):
    steps, plain = _weights_after_each_step(engine, PhaseSpec("p", epochs=3, keep_best=False))
    assert len(steps) == 13  # the start and 12 steps (3 epochs of 4 batches)
    torch.manual_seed(0)
    module, evaluated = Linear(), []

    def evaluate():
        evaluated.append(_flat(module).clone())
        return {"accuracy": [0.5, 0.7, 0.6][len(evaluated) - 1]}

    recipe = Recipe(engine)
    _run(recipe, PhaseSpec("p", epochs=3, ema=0.9), module, evaluate)
    for epoch in range(3):  # each epoch's evaluation saw the average of the steps so far
        torch.testing.assert_close(evaluated[epoch], _expected(steps[:4 * epoch + 5], 0.9))
    # the training itself is that of the phase without an average (its losses step by step), and the phase
    # ends on the average the best epoch (the second) evaluated, not the weights the optimizer left
    assert [h["train_loss"] for h in recipe.history] == [h["train_loss"] for h in plain.history]
    torch.testing.assert_close(_flat(module), evaluated[1])
    assert not torch.allclose(evaluated[1], steps[8])

    torch.manual_seed(0)
    unselected = Linear()  # no epoch is chosen: the phase ends on the average of every step
    _run(Recipe(engine), PhaseSpec("p", epochs=3, keep_best=False, ema=0.9), unselected, lambda: {"accuracy": 0.5})
    torch.testing.assert_close(_flat(unselected), _expected(steps, 0.9))


def test_a_killed_phase_with_ema_resumes_its_average(engine, tmp_path):
    spec = PhaseSpec("p", epochs=2, keep_best=False, ema=0.8)
    torch.manual_seed(0)
    whole = Linear()
    _run(Recipe(engine), spec, whole, lambda: {"accuracy": 0.5})

    torch.manual_seed(0)
    killed, calls = Linear(), {"n": 0}

    def killed_on_7(net, batch):
        calls["n"] += 1
        if calls["n"] == 7:
            raise KeyboardInterrupt
        return _loss(net, batch)

    ckpt = Checkpoints(str(tmp_path / "ck"), {"lr": 0.1}, every_steps=5)
    with pytest.raises(KeyboardInterrupt):
        _run(Recipe(engine, ckpt), spec, killed, lambda: {"accuracy": 0.5}, loss=killed_on_7)
    resumed = Linear()
    recipe = Recipe(engine, ckpt, resume=True)
    assert recipe.global_step == 5
    _run(recipe, spec, resumed, lambda: {"accuracy": 0.5})
    torch.testing.assert_close(_flat(resumed), _flat(whole), rtol=0, atol=0)
