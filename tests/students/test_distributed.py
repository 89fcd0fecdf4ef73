"""Students on several processes (DDP through the launcher, gloo on CPU) and on a GPU.

Each 2-process test starts `python -m torch.distributed.run` (what `torchrun` is) on
tests/students/ddp_worker.py, which trains through `students.trainer.train` and records the texts its
rank trained on and its weights at the end.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from students.student import Student
from transferset.contract import schema

ROOT = Path(__file__).resolve().parents[2]


def _launch(tmp_path, transfer, dev, config: dict, processes: int = 2, name: str = "out", kill_at=None):
    record = tmp_path / f"record-{name}"
    record.mkdir(exist_ok=True)
    spec = {"config": {"threads": 1, "report": {"latency_examples": 16}, **config}, "transfer": transfer, "dev": dev,
            "output": str(tmp_path / name), "record": str(record), "kill_at": kill_at}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           f"--nproc_per_node={processes}", str(ROOT / "tests" / "students" / "ddp_worker.py"),
                           str(tmp_path / "spec.json")], env=env, capture_output=True, text=True, timeout=600)
    if kill_at is not None:
        assert proc.returncode != 0, "the kill did not happen"
        return None
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [json.loads((record / f"rank{r}.json").read_text()) for r in range(processes)]
    states = [torch.load(record / f"rank{r}.pt", weights_only=True) for r in range(processes)]
    return tmp_path / name, ranks, states


def _check(out, ranks, states, rows: int, epochs: int, batch_size: int):
    assert [r["world"] for r in ranks] == [2, 2]
    per_epoch = [len(r["texts"]) // epochs for r in ranks]
    a, b = (r["texts"][:n] for r, n in zip(ranks, per_epoch))
    # Disjoint rows (the 128 SST-2 texts are distinct), together the whole set but at most a batch per rank.
    assert not set(a) & set(b)
    assert rows - 2 * batch_size <= len(a) + len(b) <= rows and abs(len(a) - len(b)) <= batch_size
    metrics = json.loads((out / schema.METRICS_FILE).read_text())
    assert metrics["processes"] == 2 and metrics["history"][0]["rows"] == len(a) + len(b)
    # DDP kept the replicas equal, and rank 0 saved its own.
    assert states[0].keys() == states[1].keys()
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])
    saved = Student.from_pretrained(str(out)).model.state_dict()
    assert all(torch.equal(saved[k], states[0][k]) for k in states[0])
    return metrics


@pytest.mark.integration
@pytest.mark.parametrize("sparse", [False, True])  # True: DDP all-reduces the word table's sparse gradients
def test_two_processes_train_a_bilstm_on_disjoint_rows(tmp_path, tiny_scored_dir, sst2_dev200, sparse):
    out, ranks, states = _launch(tmp_path, tiny_scored_dir, sst2_dev200,
                                 {"epochs": 2, "batch_size": 16, "patience": 5, "vocab": {"embed_init": "random"},
                                  "model": {"embed_dim": 16, "hidden": 16, "sparse": sparse}})
    metrics = _check(out, ranks, states, rows=128, epochs=2, batch_size=16)
    assert [h["epoch"] for h in metrics["history"]] == [1, 2]


@pytest.mark.integration
def test_two_processes_train_a_transformer_student(tmp_path, tiny_scored_dir, sst2_dev200):
    out, ranks, states = _launch(tmp_path, tiny_scored_dir, sst2_dev200,
                                 {"student": "transformer", "epochs": 1, "batch_size": 16, "losses": {"ce": 1.0, "mse": 1.0, "pkd": 1.0},
                                  "model": {"n_layer": 2, "init": "skip"}})
    _check(out, ranks, states, rows=128, epochs=1, batch_size=16)


@pytest.mark.integration
def test_a_killed_two_process_training_resumes_to_the_uninterrupted_model(tmp_path, tiny_scored_dir, sst2_dev200):
    """Rank 0 killed once checkpoint/state.pt exists, rerun with resume: every rank's data position and
    random state (dropout) are restored, so the model is the uninterrupted 2-process run's, bit for bit."""
    config = {"student": "transformer", "epochs": 2, "batch_size": 16, "losses": {"ce": 1.0, "kd": 1.0}, "checkpoint_steps": 5,
              "model": {"n_layer": 2, "init": "skip"}, "engine": {"schedule": "linear", "warmup": 0.2}}
    _, _, whole = _launch(tmp_path, tiny_scored_dir, sst2_dev200, config, name="whole")
    # 4 steps an epoch on 2 ranks (128 rows / 16 / 2): killed before step 7, the checkpoint of step 5 written
    _launch(tmp_path, tiny_scored_dir, sst2_dev200, config, name="killed", kill_at=7)
    assert (tmp_path / "killed" / "checkpoint" / "state.pt").exists()
    out, ranks, resumed = _launch(tmp_path, tiny_scored_dir, sst2_dev200, {**config, "resume": True}, name="killed")
    for k in whole[0]:
        assert torch.equal(resumed[0][k], whole[0][k]) and torch.equal(resumed[1][k], whole[0][k]), k
    metrics = json.loads((out / schema.METRICS_FILE).read_text())
    assert metrics["processes"] == 2 and metrics["effective_batch_size"] == 32


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here (the GPU path runs where one is)")
def test_a_student_trains_on_the_gpu_in_bf16(tmp_path, tiny_scored_dir, sst2_dev200):
    from students.trainer import train
    from transferset.config import StudentConfig

    from transferset.config import EngineConfig

    cfg = StudentConfig(engine=EngineConfig(device="cuda", precision="bf16"), epochs=1, threads=1, report={"latency_examples": 16},
                        model={"embed_dim": 16, "hidden": 16}, vocab={"embed_init": "random"})
    m = train(cfg, tiny_scored_dir, sst2_dev200, str(tmp_path / "out"), progress=False)
    assert m["device"].startswith("cuda") and m["history"][0]["rows"] == 128
    assert all(torch.isfinite(torch.tensor(h["train_loss"])) for h in m["history"])
    assert Student.from_pretrained(str(tmp_path / "out")).predict_ids(["a fine film"]).shape == (1,)


def test_device_cuda_without_one_is_refused(tmp_path, tiny_scored_dir, sst2_dev200, capsys):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible")
    from transferset.app.cli import main

    rc = main(["train", "--transfer", tiny_scored_dir, "--dev", sst2_dev200, "--output", str(tmp_path / "o"),
               "--device", "cuda", "--no-progress"])
    assert rc == 1
    err = capsys.readouterr().err
    assert "device cuda: no CUDA device is visible" in err and "Traceback" not in err
    assert not (tmp_path / "o" / schema.STUDENT_MODEL_DIR).exists()


def _torchrun_cli(tmp_path, *args: str, processes: int = 2) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           f"--nproc_per_node={processes}", "-m", "transferset.app.cli", *args],
                          env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.mark.integration
def test_prune_recovery_and_exits_train_on_two_processes(tmp_path, tiny_scored_dir, tiny_teacher4, sst2_dev200):
    """`torchrun ... prune` and `torchrun ... exits`: each rank its own rows, rank 0 alone writes."""
    _torchrun_cli(tmp_path, "prune", "--model", tiny_teacher4, "--selection", sst2_dev200, "--transfer",
                  tiny_scored_dir, "--output", str(tmp_path / "pruned"), "--heads", "2", "--epochs", "1",
                  "--batch-size", "16", "--threads", "1", "--processes", "2")
    record = json.loads((tmp_path / "pruned" / schema.PRUNE_FILE).read_text())
    recovery = record["recovery"]
    assert recovery["processes"] == 2 and recovery["effective_batch_size"] == 32
    # 128 rows over 2 ranks in batches of 16: 4 steps each, every row once
    assert recovery["history"][0]["rows"] == 128 and recovery["history"][0]["step"] == 4
    assert record["heads"]["before"] - record["heads"]["after"] == 2
    assert (tmp_path / "pruned" / schema.COMPLETE_MARKER).exists()
    _torchrun_cli(tmp_path, "exits", "--model", tiny_teacher4, "--scored", tiny_scored_dir, "--output",
                  str(tmp_path / "exits"), "--epochs", "2", "--batch-size", "16", "--threads", "1")
    metrics = json.loads((tmp_path / "exits" / schema.METRICS_FILE).read_text())
    assert metrics["processes"] == 2 and metrics["rows"] == 128 and len(metrics["train_loss"]) == 2
    steps = [json.loads(line) for line in (tmp_path / "exits" / "metrics.jsonl").read_text().splitlines()
             if "train/loss" in line]
    assert [s["step"] for s in steps] == list(range(1, 9))  # 4 steps an epoch (8 batches over 2 ranks), logged once
