"""The teacher fine-tuned on 2 processes (DDP through the launcher, gloo on CPU), and resumed there.

Each test starts `python -m torch.distributed.run` (what `torchrun` is) on ddp_teacher_worker.py, which
fine-tunes through `transferset.teacher.train.train` and records the rows its rank trained on and its weights.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from transferset.contract import schema

ROOT = Path(__file__).resolve().parents[3]
WORKER = ROOT / "tests" / "transferset" / "teacher" / "ddp_teacher_worker.py"
ROWS, BATCH = 96, 8  # 12 batches an epoch: 6 on each rank


def _launch(tmp_path, name, data, config: dict, kill_at=None):
    record = tmp_path / f"{name}-record"
    record.mkdir(exist_ok=True)
    spec = {"config": {"epochs": 2, "optim": {"lr": 1e-3}, "batch_size": BATCH, "max_length": 32, "seed": 1,
                       "progress": False, **config},
            "train": data[0], "dev": data[1], "output": str(tmp_path / name), "record": str(record),
            "kill_at": kill_at}
    (record / "spec.json").write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(WORKER), str(record / "spec.json")], env=env, capture_output=True, text=True,
                          timeout=900)
    if kill_at is not None:
        assert proc.returncode != 0, "the kill did not happen"
        return None
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [json.loads((record / f"rank{r}.json").read_text()) for r in range(2)]
    states = [torch.load(record / f"rank{r}.pt", weights_only=True) for r in range(2)]
    return ranks, states


@pytest.fixture(scope="module")
def data(sst2_dir, head_tsv, tmp_path_factory):
    d = tmp_path_factory.mktemp("teacher-ddp-data")
    return (str(head_tsv(sst2_dir / "train.tsv", d / "train.tsv", ROWS)),
            str(head_tsv(sst2_dir / "dev.tsv", d / "dev.tsv", 32)))


@pytest.fixture(scope="module")
def whole(tmp_path_factory, data, tiny_teacher):
    tmp = tmp_path_factory.mktemp("teacher-ddp")
    return tmp, _launch(tmp, "whole", data, {"model": tiny_teacher})


@pytest.mark.integration
def test_the_teacher_fine_tunes_on_two_processes_with_disjoint_batches_and_one_writer(whole):
    tmp, (ranks, states) = whole
    assert [r["world"] for r in ranks] == [2, 2] and ranks[1]["result"] == {"rank": 1}
    metrics = ranks[0]["result"]
    assert metrics["processes"] == 2 and metrics["effective_batch_size"] == 2 * BATCH
    per_epoch = ROWS // 2
    a, b = ranks[0]["rows"][:per_epoch], ranks[1]["rows"][:per_epoch]
    assert len(a) == len(b) == per_epoch  # each rank its 6 batches of the epoch's 12
    # Disjoint rows that together are the whole training file, as one process sees it.
    assert not {tuple(r) for r in a} & {tuple(r) for r in b}
    assert sorted(map(tuple, a + b)) == sorted(map(tuple, ranks[0]["rows"][per_epoch:] + ranks[1]["rows"][per_epoch:]))
    assert [h["rows"] for h in metrics["history"]] == [ROWS, ROWS]  # the epoch's rows over both ranks
    assert metrics["history"][-1]["step"] == 12  # 6 optimizer steps an epoch, each over both ranks' batches
    # DDP kept the replicas equal, and rank 0 alone wrote: the saved weights are its (and rank 1's).
    assert states[0].keys() == states[1].keys()
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])
    saved = load_file(str(tmp / "whole" / "model.safetensors"))
    assert all(torch.equal(saved[k], states[0][k]) for k in saved)
    assert (tmp / "whole" / schema.COMPLETE_MARKER).exists()
    logged = [json.loads(line) for line in (tmp / "whole" / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in logged if "train/loss" in line] == list(range(1, 13))  # rank 0's log, once


@pytest.mark.integration
def test_a_killed_two_process_fine_tuning_resumes_to_the_uninterrupted_model(whole, data, tiny_teacher):
    tmp, (_, states) = whole
    # rank 0 dies before step 8 of 12, after the step-5 checkpoint; the rerun goes on from step 5
    _launch(tmp, "killed", data, {"model": tiny_teacher, "checkpoint_steps": 5}, kill_at=8)
    assert (tmp / "killed" / "checkpoint" / "state.pt").exists()
    ranks, resumed = _launch(tmp, "killed", data, {"model": tiny_teacher, "checkpoint_steps": 5, "resume": True})
    assert ranks[0]["result"]["history"][-1]["step"] == 12
    for k in states[0]:  # bit for bit the uninterrupted 2-process model, on both ranks
        assert torch.equal(resumed[0][k], states[0][k]) and torch.equal(resumed[1][k], states[0][k]), k
