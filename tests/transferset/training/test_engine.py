"""transferset/training/engine.py: the settings it refuses, precision and device per training, the trackers."""
import json

import pytest
import torch

from linear_task import CPU, Linear, _run
from transferset.config import EngineConfig
from transferset.runtime.errors import UserError
from transferset.training import Engine, PhaseSpec, Recipe


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


def test_auto_precision_is_bf16_where_the_device_has_bfloat16_arithmetic_else_fp32(monkeypatch):
    from transferset.training import engine

    assert engine.resolved_precision("fp32", torch.device("cpu")) == "fp32"
    assert engine.resolved_precision("bf16", torch.device("cpu")) == "bf16"  # named: as named, emulated or not
    monkeypatch.setattr(engine, "has_bf16", lambda device: device.type == "cpu")
    made = Engine.create(EngineConfig(device="cpu", precision="auto"), log=lambda msg: None)
    assert made.precision == "bf16" and made.autocast_dtype == torch.bfloat16
    monkeypatch.setattr(engine, "has_bf16", lambda device: False)
    made = Engine.create(EngineConfig(device="cpu", precision="auto"), log=lambda msg: None)
    assert made.precision == "fp32" and made.autocast_dtype is None


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


def _tracked_run(tmp_path, tracker: str):
    """Two epochs of 4 steps logged to `tracker` and OUTPUT/metrics.jsonl; → the recipe, metrics.jsonl's lines."""
    engine = Engine.create(EngineConfig(device="cpu", tracker=tracker), output=str(tmp_path),
                           log=lambda msg: None, progress_bar=False)
    engine.start_tracking("transferset-test", {"lr": 0.1, "model": {"hidden": 4}})
    recipe = Recipe(engine)
    _run(recipe, PhaseSpec("p", epochs=2, keep_best=False), Linear(), lambda: {"accuracy": 0.75})
    recipe.finish()
    return recipe, [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]


def test_every_logged_step_is_in_metrics_jsonl_and_in_tensorboards_event_file(tmp_path):
    pytest.importorskip("tensorboard")  # the `tracking` extra; the `test` extra installs it, so CI runs this
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    recipe, lines = _tracked_run(tmp_path, "tensorboard")
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


def test_every_logged_step_and_the_settings_are_in_mlflows_local_file_store(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")  # mlflow-skinny, in the `tracking` and `test` extras
    from mlflow import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    _, lines = _tracked_run(tmp_path, "mlflow")
    store = tmp_path / "logs" / "mlruns"
    assert store.is_dir(), f"no MLflow store under {tmp_path}: {sorted(p.name for p in tmp_path.iterdir())}"
    client = MlflowClient(tracking_uri=f"file:{store}")
    [experiment] = [e for e in client.search_experiments() if e.name == "transferset-test"]
    [run] = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED"
    assert run.data.params["lr"] == "0.1" and run.data.params["model.hidden"] == "4"
    steps = [line for line in lines if "train/loss" in line]
    logged = [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "train/loss")]
    assert [s for s, _ in logged] == list(range(1, 9))
    assert [v for _, v in logged] == [line["train/loss"] for line in steps]  # float64 both: equal
    assert [m.value for m in client.get_metric_history(run.info.run_id, "dev/accuracy")] == [0.75, 0.75]


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


def _closed_port() -> int:
    """A port of 127.0.0.1 nothing listens on: bound by the OS, then closed."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_mlflow_server_that_does_not_answer_is_refused_at_once(monkeypatch):
    """MLFLOW_TRACKING_URI=http://127.0.0.1:9 was retried for minutes, after the run had taken its lock."""
    pytest.importorskip("mlflow")
    from transferset.runtime.errors import ConfigError
    from transferset.training import check_engine

    uri = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    with pytest.raises(ConfigError, match=rf"^teacher.engine.tracker mlflow: MLFLOW_TRACKING_URI={uri} does not "
                                          r"answer within 3 s \(.*refused.*\): start the server"):
        check_engine(EngineConfig(device="cpu", tracker="mlflow"), "teacher.engine")
    check_engine(EngineConfig(device="cpu", tracker="none"), "teacher.engine")  # no tracker: nothing asked
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "file:/tmp/mlruns-unused")  # a store, not a server: MLflow's to open
    check_engine(EngineConfig(device="cpu", tracker="mlflow"), "teacher.engine")


def test_a_run_with_an_unreachable_mlflow_server_writes_nothing(tmp_path, monkeypatch, capsys):
    pytest.importorskip("mlflow")
    from transferset.app.cli import main

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{_closed_port()}")
    train = tmp_path / "train.tsv"
    train.write_text("sentence\tlabel\n" + "".join(f"row {i}\t{i % 2}\n" for i in range(8)))
    run_dir = tmp_path / "run"
    rc = main(["run", "--data", str(train), f"run_dir={run_dir}", "teacher.engine.tracker=mlflow"])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "does not answer within 3 s" in err, err
    assert not run_dir.exists()  # no lock, no stage
