"""The training recipe (transferset/training.py) on a tiny linear model: early stopping, the
non-finite loss stop, checkpoints, settings refused."""
import pytest
import torch

from transferset.errors import UserError
from transferset.training import Checkpoints, Engine, PhaseSpec, Recipe


class Linear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 2)

    def forward(self, batch):
        return self.fc(batch["x"])


def _batches(epoch):
    g = torch.Generator().manual_seed(epoch)
    for _ in range(4):
        yield {"x": torch.randn(8, 3, generator=g), "labels": torch.randint(0, 2, (8,), generator=g)}


def _loss(net, batch):
    loss = torch.nn.functional.cross_entropy(net(batch), batch["labels"])
    return loss, {"ce": float(loss.detach())}


def _run(recipe, spec, module, evaluate, loss=_loss, index=0):
    return recipe.run(index, spec, module, loss, _batches, evaluate,
                      lambda: (torch.optim.SGD(module.parameters(), lr=0.1), None))


@pytest.fixture(scope="module")
def engine():
    return Engine.create(device="cpu", log=lambda msg: None, progress_bar=False)


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


def test_a_non_finite_loss_names_the_phase_epoch_and_step(engine):
    calls = {"n": 0}

    def nan_on_step_6(net, batch):
        calls["n"] += 1
        loss, parts = _loss(net, batch)
        return (loss * float("nan"), parts) if calls["n"] == 6 else (loss, parts)

    with pytest.raises(UserError, match=r"not finite \(nan on this rank; ce [0-9.]+\) at phase 'distill', "
                                        r"epoch 2, step 6 of the phase: nothing was saved"):
        _run(Recipe(engine), PhaseSpec("distill", epochs=3), Linear(), lambda: {"accuracy": 0.5}, loss=nan_on_step_6)


def test_checkpoints_resume_the_exact_step_and_refuse_other_settings(engine, tmp_path):
    spec = PhaseSpec("p", epochs=2, keep_best=False)
    torch.manual_seed(0)
    whole = Linear()
    _run(Recipe(engine), spec, whole, lambda: {"accuracy": 0.5})

    torch.manual_seed(0)
    killed = Linear()
    calls = {"n": 0}

    def kill_on_step_7(net, batch):
        calls["n"] += 1
        if calls["n"] == 7:
            raise KeyboardInterrupt
        return _loss(net, batch)

    ckpt = Checkpoints(str(tmp_path / "ck"), {"lr": 0.1}, every_steps=5)
    with pytest.raises(KeyboardInterrupt):
        _run(Recipe(engine, ckpt), spec, killed, lambda: {"accuracy": 0.5}, loss=kill_on_step_7)
    with pytest.raises(UserError, match=r"other settings \(lr differ\)"):
        Recipe(engine, Checkpoints(str(tmp_path / "ck"), {"lr": 0.2}), resume=True)
    resumed = Linear()
    recipe = Recipe(engine, ckpt, resume=True)
    assert recipe.global_step == 5
    _run(recipe, spec, resumed, lambda: {"accuracy": 0.5})
    assert all(torch.equal(resumed.state_dict()[k], whole.state_dict()[k]) for k in whole.state_dict())
    assert [h["rows"] for h in recipe.history] == [32, 32]
    recipe.finish()
    assert not (tmp_path / "ck").exists()


def test_settings_the_engine_cannot_honour_are_refused():
    with pytest.raises(UserError, match="device 'gpu': expected one of auto, cpu, cuda"):
        Engine.create(device="gpu")
    if not torch.cuda.is_available():
        with pytest.raises(UserError, match="device cuda: no CUDA device is visible"):
            Engine.create(device="cuda")
    from accelerate.utils import is_tensorboard_available

    if not is_tensorboard_available():
        with pytest.raises(UserError, match="report_to tensorboard: the tensorboard package is not installed"):
            Engine.create(device="cpu", report_to="tensorboard")


def test_each_training_in_a_process_gets_its_own_precision_and_device():
    # `run` trains the teacher and several students in one process: Accelerate's process-wide state
    # would otherwise refuse the second setting ("already initialized").
    first = Engine.create(device="cpu", bf16=True, log=lambda msg: None)
    assert first.acc.mixed_precision == "bf16" and first.device.type == "cpu"
    second = Engine.create(device="cpu", bf16=False, log=lambda msg: None)
    assert second.acc.mixed_precision == "no"
    module = Linear()
    recipe = Recipe(Engine.create(device="cpu", bf16=True, log=lambda msg: None))
    _run(recipe, PhaseSpec("bf16", epochs=1, keep_best=False), module, lambda: {"accuracy": 0.5})
    assert recipe.history[0]["train_loss"] > 0 and module.fc.weight.dtype == torch.float32  # autocast, fp32 weights


@pytest.mark.parametrize("max_steps, steps", [(6, [4, 6]), (8, [4, 8])])
def test_max_steps_ends_the_phase_with_an_evaluated_epoch_and_no_empty_one(engine, max_steps, steps):
    recipe = Recipe(engine)
    _run(recipe, PhaseSpec("p", epochs=3, max_steps=max_steps), Linear(), lambda: {"accuracy": 0.5})
    assert [h["step"] for h in recipe.history] == steps
    assert [h["rows"] for h in recipe.history] == [32, 8 * (steps[1] - 4)]
