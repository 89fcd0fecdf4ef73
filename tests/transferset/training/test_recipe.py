"""transferset/training/recipe.py on a tiny linear model (linear_task.py): early stopping, the non-finite loss
stop, max_steps, gradient accumulation. The engine, checkpoints and schedules have their own files here."""
import time
from dataclasses import replace

import pytest
import torch

from linear_task import Linear, _batches, _loss, _run
from linear_task import engine  # noqa: F401 (a fixture)
from transferset.config import EngineConfig
from transferset.runtime import deadline
from transferset.runtime.errors import UserError
from transferset.training import Engine, PhaseSpec, Recipe


def test_early_stopping_keeps_the_best_epoch_and_the_start_competes(engine):
    module = Linear()
    scores = iter([0.5, 0.6, 0.55, 0.58, 0.9])  # start, then epochs 1-4
    weights = []

    def evaluate():
        weights.append({k: v.clone() for k, v in module.state_dict().items()})
        return {"accuracy": next(scores)}

    recipe = Recipe(engine)
    entry = _run(recipe, PhaseSpec("p", epochs=4, patience=2, start_competes=True), module, evaluate)
    assert entry["epochs_run"] == 3 and entry["start_dev_accuracy"] == 0.5 and entry["best_dev_accuracy"] == 0.6
    assert [h["dev_accuracy"] for h in recipe.history] == [0.6, 0.55, 0.58]
    assert [h["step"] for h in recipe.history] == [4, 8, 12] and [h["rows"] for h in recipe.history] == [32] * 3
    assert all(torch.equal(module.state_dict()[k], weights[1][k]) for k in weights[1])  # epoch 1's weights

    # A phase none of whose epochs beats its start ends on the model it started from.
    module = Linear()
    start = {k: v.clone() for k, v in module.state_dict().items()}
    scores2 = iter([0.7, 0.6, 0.6])
    _run(Recipe(engine), PhaseSpec("q", epochs=2, start_competes=True), module,
         lambda: {"accuracy": next(scores2)})
    assert all(torch.equal(module.state_dict()[k], start[k]) for k in start)


def test_a_phase_ends_at_an_epoch_when_another_would_end_past_the_budgets_deadline(engine):
    """transferset.runtime.deadline: the epoch run so far is the measure of the next; the best epoch is kept."""
    for seconds, epochs in ((None, 4), (3600.0, 4), (0.0, 1)):
        module, recipe = Linear(), Recipe(engine)
        scores = iter([0.6, 0.5, 0.7, 0.8])
        with deadline.within(seconds):
            entry = _run(recipe, PhaseSpec("p", epochs=4), module, lambda: {"accuracy": next(scores)})
        assert entry["epochs_run"] == epochs and len(recipe.history) == epochs
        assert entry.get("out_of_time", False) == (epochs < 4) and entry["best_dev_accuracy"] == [0.6, 0.8][epochs > 1]
    assert deadline.seconds_left() is None  # the block's deadline ends with it
    # a deadline set and passed mid-way: the phase ends with the epoch that crossed it
    module, recipe, quick = Linear(), Recipe(engine), iter([True, True])

    def third_slow():
        time.sleep(0.0 if next(quick, False) else 1.05)
        return {"accuracy": 0.5}

    with deadline.within(1.0):
        entry = _run(recipe, PhaseSpec("p", epochs=5), module, third_slow)
    assert entry["epochs_run"] == 3 and entry["out_of_time"]


def test_a_phase_trains_on_the_part_of_an_epoch_the_deadline_holds_then_ends(engine, monkeypatch):
    """Where a whole epoch more would end past the deadline but at least half of one fits (deadline.part_of_epoch),
    the phase trains on that part of the next epoch, evaluates it as an epoch, keeps the best and ends."""
    asked = []

    def part(trained, evaluated):
        asked.append((trained, evaluated))
        return 0.5

    monkeypatch.setattr(deadline, "room_for", lambda seconds: False)
    monkeypatch.setattr(deadline, "part_of_epoch", part)
    module, recipe, scores = Linear(), Recipe(engine), iter([0.6, 0.7])
    entry = _run(recipe, PhaseSpec("p", epochs=4), module, lambda: {"accuracy": next(scores)})
    assert entry["epochs_run"] == 2 and entry["out_of_time"] and entry["best_dev_accuracy"] == 0.7
    assert [h["rows"] for h in recipe.history] == [32, 16]  # 4 batches of 8, then 2
    assert [h["step"] for h in recipe.history] == [4, 6] and len(asked) == 1 and asked[0][0] > 0
    # under half an epoch: the phase ends with the epoch it trained
    monkeypatch.setattr(deadline, "part_of_epoch", lambda trained, evaluated: 0.0)
    recipe = Recipe(engine)
    entry = _run(recipe, PhaseSpec("p", epochs=4), Linear(), lambda: {"accuracy": 0.5})
    assert entry["epochs_run"] == 1 and [h["rows"] for h in recipe.history] == [32]


def test_the_learning_rate_schedule_ends_where_the_budgets_deadline_will_end_the_phase(monkeypatch):
    """A linear decay planned over 4 epochs of 4 steps, the deadline (deadline.end_step) ending the phase at step 6:
    a tenth into the first epoch (its first step) the 15 steps of decay left are compressed into 5, and at the
    epoch's end the schedule already ends there; the rate goes down to 0 as planned instead of stopping at 5/8 of
    its peak, and the phase trains half of its second epoch."""
    from linear_task import CPU

    asked = []

    def end_step(per_epoch, current, epochs, left, epoch_s, evaluated):
        asked.append((per_epoch, current, epochs, left, evaluated))
        return 6

    monkeypatch.setattr(deadline, "seconds_left", lambda: 100.0)
    monkeypatch.setattr(deadline, "end_step", end_step)
    monkeypatch.setattr(deadline, "room_for", lambda seconds: False)
    monkeypatch.setattr(deadline, "part_of_epoch", lambda trained, evaluated: 0.5)
    engine = Engine.create(replace(CPU, schedule="linear"), log=lambda msg: None, progress_bar=False)
    module, rates, held = Linear(), [], {}

    def optimizer():
        held["opt"] = torch.optim.SGD(module.parameters(), lr=0.1)
        return held["opt"]

    def loss(net, batch):
        rates.append(held["opt"].param_groups[0]["lr"])
        return _loss(net, batch)

    recipe = Recipe(engine)
    recipe.run(0, PhaseSpec("p", epochs=4, steps_per_epoch=4), module, loss, _batches, lambda: {"accuracy": 0.5},
               optimizer)
    assert rates == pytest.approx([0.1, 0.09375, 0.075, 0.05625, 0.0375, 0.01875])  # 16/16, 15/16, 12/16, ...
    assert held["opt"].param_groups[0]["lr"] == pytest.approx(0.0)  # where the 16th step would have left it
    (probe, after) = asked
    assert probe[:3] == after[:3] == (4, 1, 4) and probe[3] < 100.0 == after[3] and probe[4] == 0.0 <= after[4]


def test_a_non_finite_loss_names_the_phase_epoch_and_step(engine):
    calls = {"n": 0}

    def nan_on_step_6(net, batch):
        calls["n"] += 1
        loss, parts = _loss(net, batch)
        return (loss * float("nan"), parts) if calls["n"] == 6 else (loss, parts)

    with pytest.raises(UserError, match=r"not finite \(nan on this rank; ce [0-9.]+\) at phase 'distill', "
                                        r"epoch 2, step 6 of the phase: nothing was saved"):
        _run(Recipe(engine), PhaseSpec("distill", epochs=3), Linear(), lambda: {"accuracy": 0.5}, loss=nan_on_step_6)


@pytest.mark.parametrize("max_steps, steps", [(6, [4, 6]), (8, [4, 8])])
def test_max_steps_ends_the_phase_with_an_evaluated_epoch_and_no_empty_one(engine, max_steps, steps):
    recipe = Recipe(engine)
    _run(recipe, PhaseSpec("p", epochs=3, max_steps=max_steps), Linear(), lambda: {"accuracy": 0.5})
    assert [h["step"] for h in recipe.history] == steps
    assert [h["rows"] for h in recipe.history] == [32, 8 * (steps[1] - 4)]


def test_two_batches_of_16_accumulated_give_the_gradients_of_one_batch_of_32():
    # In float64 the two ways of summing 32 per-row gradients ((a + b) / 2 of two means of 16, or one mean of
    # 32) differ only by rounding, ~32 * 2^-53 ≈ 4e-15 of the largest term (|x| < 6 here: ~2e-14); 1e-12 leaves
    # room for that and none for a wrong factor (an unscaled sum is off by 2x, i.e. by the whole gradient).
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(32, 3, generator=g, dtype=torch.float64), torch.randint(0, 2, (32,), generator=g)

    def trained(batches, accum):
        torch.manual_seed(0)
        module = Linear().double()
        engine = Engine.create(EngineConfig(device="cpu", grad_accum=accum), log=lambda msg: None, progress_bar=False)
        recipe = Recipe(engine)
        recipe.run(0, PhaseSpec("p", epochs=1, keep_best=False), module, _loss, lambda epoch: iter(batches),
                   lambda: {"accuracy": 0.5}, lambda: torch.optim.SGD(module.parameters(), lr=1.0))
        return module, recipe

    whole, one = trained([{"x": x, "labels": y}], accum=1)
    halves, two = trained([{"x": x[:16], "labels": y[:16]}, {"x": x[16:], "labels": y[16:]}], accum=2)
    assert one.global_step == two.global_step == 1 and two.history[0]["rows"] == 32
    torch.manual_seed(0)
    start = Linear().double()
    assert not torch.allclose(start.fc.weight, whole.fc.weight)  # the step moved the weights
    for name, w in whole.state_dict().items():
        torch.testing.assert_close(halves.state_dict()[name], w, rtol=0, atol=1e-12)


def test_a_grad_accum_past_the_epochs_batches_is_refused_before_any_step():
    """grad_accum 64 on an epoch of 4 batches made one optimizer step per epoch, with no word of it."""
    engine = Engine.create(EngineConfig(device="cpu", grad_accum=5), log=lambda msg: None, progress_bar=False)
    module = Linear()
    start = {k: v.clone() for k, v in module.state_dict().items()}
    with pytest.raises(UserError, match=r"^grad_accum 5 exceeds the 4 batches of an epoch \(phase 'p'\)"):
        _run(Recipe(engine), PhaseSpec("p", epochs=2, steps_per_epoch=4), module, lambda: {"accuracy": 0.5})
    assert all(torch.equal(module.state_dict()[k], start[k]) for k in start)
    engine4 = Engine.create(EngineConfig(device="cpu", grad_accum=4), log=lambda msg: None, progress_bar=False)
    recipe = Recipe(engine4)  # as many as the epoch has: one step per epoch, as asked
    _run(recipe, PhaseSpec("p", epochs=2, steps_per_epoch=4), module, lambda: {"accuracy": 0.5})
    assert recipe.global_step == 2


@pytest.mark.parametrize("accum, sizes, effective", [(1, [8, 8, 8, 8], 8), (2, [8, 8, 8, 8], 16), (2, [8, 8, 5], 16),
                                                     (3, [4, 4, 2], 10), (1, [5], 5)])
def test_the_effective_batch_is_the_most_rows_one_optimizer_step_took(accum, sizes, effective):
    """A batch_size of 100,000 on 527 rows recorded an effective batch of 100,000: what a step took is recorded."""
    g = torch.Generator().manual_seed(0)
    batches = [{"x": torch.randn(n, 3, generator=g), "labels": torch.randint(0, 2, (n,), generator=g)} for n in sizes]
    engine = Engine.create(EngineConfig(device="cpu", grad_accum=accum), log=lambda msg: None, progress_bar=False)
    recipe = Recipe(engine)
    assert recipe.effective_batch_size is None  # nothing trained yet
    module = Linear()
    recipe.run(0, PhaseSpec("p", epochs=2), module, _loss, lambda epoch: iter(batches), lambda: {"accuracy": 0.5},
               lambda: torch.optim.SGD(module.parameters(), lr=0.1))
    assert recipe.effective_batch_size == effective
