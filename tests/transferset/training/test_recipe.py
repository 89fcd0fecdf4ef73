"""The training recipe (transferset/training/) on a tiny linear model: early stopping, the
non-finite loss stop, checkpoints, settings refused."""
import pytest
import torch

from transferset.config import EngineConfig
from transferset.errors import UserError
from transferset.training import Checkpoints, Engine, PhaseSpec, Recipe

CPU = EngineConfig(device="cpu")


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
                      lambda: torch.optim.SGD(module.parameters(), lr=0.1))


@pytest.fixture(scope="module")
def engine():
    return Engine.create(CPU, log=lambda msg: None, progress_bar=False)


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


def test_settings_the_engine_cannot_honour_are_refused(monkeypatch):
    with pytest.raises(UserError, match="engine.device 'gpu': expected one of auto, cpu, cuda"):
        Engine.create(EngineConfig(device="gpu"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as on a machine without one
    with pytest.raises(UserError, match="engine.device cuda: no CUDA device is visible"):
        Engine.create(EngineConfig(device="cuda"))
    with pytest.raises(UserError, match="engine.precision fp16: float16 training needs a CUDA device"):
        Engine.create(EngineConfig(device="auto", precision="fp16"))
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(UserError, match=r"engine.processes 2: this is one of 1 process\(es\); start the command with "
                                        r"`torchrun --nproc_per_node 2 -m transferset.app.cli COMMAND"):
        Engine.create(EngineConfig(device="cpu", processes=2))
    from accelerate import utils

    monkeypatch.setattr(utils, "is_tensorboard_available", lambda: False)
    with pytest.raises(UserError, match=r"engine.tracker tensorboard: the tensorboard package is not installed; "
                                        r"pip install tensorboard \(pip install 'transferset\[tracking\]'\)"):
        Engine.create(EngineConfig(device="cpu", tracker="tensorboard"))


def test_each_training_in_a_process_gets_its_own_precision_and_device():
    # `run` trains the teacher and several students in one process: Accelerate's process-wide state
    # would otherwise refuse the second setting ("already initialized").
    first = Engine.create(EngineConfig(device="cpu", precision="bf16"), log=lambda msg: None)
    assert first.autocast_dtype == torch.bfloat16 and first.device.type == "cpu"
    second = Engine.create(CPU, log=lambda msg: None)
    assert second.autocast_dtype is None and second.scaler is None
    with first.autocast():
        assert torch.nn.functional.linear(torch.ones(1, 2), torch.ones(2, 2)).dtype == torch.bfloat16
    module = Linear()
    recipe = Recipe(Engine.create(EngineConfig(device="cpu", precision="bf16"), log=lambda msg: None))
    _run(recipe, PhaseSpec("bf16", epochs=1, keep_best=False), module, lambda: {"accuracy": 0.5})
    assert recipe.history[0]["train_loss"] > 0 and module.fc.weight.dtype == torch.float32  # autocast, fp32 weights


@pytest.mark.parametrize("max_steps, steps", [(6, [4, 6]), (8, [4, 8])])
def test_max_steps_ends_the_phase_with_an_evaluated_epoch_and_no_empty_one(engine, max_steps, steps):
    recipe = Recipe(engine)
    _run(recipe, PhaseSpec("p", epochs=3, max_steps=max_steps), Linear(), lambda: {"accuracy": 0.5})
    assert [h["step"] for h in recipe.history] == steps
    assert [h["rows"] for h in recipe.history] == [32, 8 * (steps[1] - 4)]


def _lr_expected(schedule: str, step: int, total: int, warmup_steps: int) -> float:
    """The schedules as their papers and Hugging Face write them, independently of transferset.training."""
    import math

    if step < warmup_steps:
        return step / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = (step - warmup_steps) / (total - warmup_steps)
    return 1.0 - progress if schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))


@pytest.mark.parametrize("schedule", ["constant", "linear", "cosine"])
def test_the_learning_rate_at_each_step_follows_the_schedules_formula(schedule, tmp_path):
    import json

    # 2 epochs of 4 batches: T = 8 optimizer steps, warmup 0.25 of them: W = 2; peak lr 0.5.
    engine = Engine.create(EngineConfig(device="cpu", schedule=schedule, warmup=0.25), output=str(tmp_path),
                           log=lambda msg: None, progress_bar=False)
    engine.start_tracking("t", {})
    module = Linear()
    recipe = Recipe(engine)
    recipe.run(0, PhaseSpec("p", epochs=2, keep_best=False, steps_per_epoch=4), module, _loss, _batches,
               lambda: {"accuracy": 0.5}, lambda: torch.optim.SGD(module.parameters(), lr=0.5))
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    lrs = [line["train/lr"] for line in lines if "train/lr" in line]
    assert [line["step"] for line in lines if "train/lr" in line] == list(range(1, 9))
    assert lrs == pytest.approx([0.5 * _lr_expected(schedule, s, 8, 2) for s in range(8)], abs=1e-12)
    assert lrs[0] == 0.0 and lrs[2] == 0.5  # warm-up from 0 to the peak at step W


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


def test_every_logged_step_is_in_metrics_jsonl_and_in_tensorboards_event_file(tmp_path):
    import json

    pytest.importorskip("tensorboard")  # the `tracking` extra; the `test` extra installs it, so CI runs this
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    engine = Engine.create(EngineConfig(device="cpu", tracker="tensorboard"), output=str(tmp_path),
                           log=lambda msg: None, progress_bar=False)
    engine.start_tracking("transferset-test", {"lr": 0.1, "model": {"hidden": 4}})
    recipe = Recipe(engine)
    _run(recipe, PhaseSpec("p", epochs=2, keep_best=False), Linear(), lambda: {"accuracy": 0.75})
    recipe.finish()
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [line for line in lines if "train/loss" in line]
    assert [line["step"] for line in steps] == list(range(1, 9))
    epochs = [line for line in lines if "dev/accuracy" in line]
    assert [(e["step"], e["dev/accuracy"]) for e in epochs] == [(4, 0.75), (8, 0.75)]
    assert [e["train/epoch_loss"] for e in epochs] == pytest.approx([h["train_loss"] for h in recipe.history])
    events = list(tmp_path.rglob("events.out.tfevents.*"))
    assert events, f"no TensorBoard event file under {tmp_path}"
    acc = EventAccumulator(str(events[0].parent))
    acc.Reload()
    logged = [(e.step, e.value) for e in acc.Scalars("train/loss")]
    assert [s for s, _ in logged] == list(range(1, 9))
    # float32 in the event file: the jsonl's float64 values to float32 precision
    assert [v for _, v in logged] == pytest.approx([line["train/loss"] for line in steps], rel=1e-6)
    assert [e.value for e in acc.Scalars("dev/accuracy")] == [0.75, 0.75]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here (the GPU path runs where one is)")
def test_fp16_on_cuda_trains_through_accelerates_gradient_scaler():
    engine = Engine.create(EngineConfig(device="cuda", precision="fp16"), log=lambda msg: None, progress_bar=False)
    assert engine.scaler is not None and engine.autocast_dtype == torch.float16
    module = Linear()
    start = module.fc.weight.detach().clone()
    recipe = Recipe(engine)
    _run(recipe, PhaseSpec("fp16", epochs=1, keep_best=False, grad_clip=1.0), module, lambda: {"accuracy": 0.5})
    assert module.fc.weight.dtype == torch.float32 and module.fc.weight.device.type == "cuda"  # fp32 master weights
    assert not torch.equal(module.fc.weight.cpu(), start) and recipe.history[0]["train_loss"] > 0
