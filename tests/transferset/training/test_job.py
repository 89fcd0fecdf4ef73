"""The job shell (transferset/training/job.py): the hooks run in order around one recipe; the output is
checked before any hook reads and cleared only after `check`; metrics go to the job's metrics file; a job
that does not train gets no engine; a rank other than 0 writes nothing."""
import json

import pytest
import torch

from linear_task import CPU, Linear, _batches, _loss
from transferset.contract import schema
from transferset.runtime.errors import UserError
from transferset.training import PhaseSpec
from transferset.training.job import Job, JobPhase, Skipped, run_job


class Toy(Job):
    command, names, project = "train", (schema.STUDENT_MODEL_DIR,), "transferset-test"

    def __init__(self, trains=True, fail_check=False):
        super().__init__(CPU, lambda msg: None)
        self.progress_bar, self.seed = False, 0
        self.calls, self._trains, self.fail_check = [], trains, fail_check
        self.model = Linear()

    def check(self):
        self.calls.append("check")
        if self.fail_check:
            raise UserError("bad input")

    def prepare(self, run):
        self.calls.append(("prepare", run.main))

    def trains(self):
        return self._trains

    def phases(self, engine):
        self.calls.append("phases")
        yield Skipped({"phase": "none", "skipped": "nothing to do"})
        yield JobPhase(PhaseSpec("fit", 2, keep_best=False), self.model, _loss, _batches, None,
                    lambda: torch.optim.SGD(self.model.parameters(), lr=0.1), logged={"losses": ["ce"]})

    def trained(self, run):
        self.calls.append("trained")

    def evaluate(self, run):
        self.calls.append("evaluate")
        return {"phases": run.recipe.phase_log if run.recipe else None, "b": 1, "a": 2}

    def save(self, run, metrics):
        self.calls.append("save")
        with open(f"{run.work}/{schema.STUDENT_MODEL_DIR}", "w", encoding="utf-8"):
            pass
        metrics["saved"] = True


def test_the_hooks_run_in_order_and_the_shell_writes_the_metrics(tmp_path):
    job = Toy()
    metrics = run_job(job, str(tmp_path / "out"))
    assert job.calls == ["check", ("prepare", True), "phases", "trained", "evaluate", "save"]
    written = json.loads((tmp_path / "out" / schema.METRICS_FILE).read_text())
    assert written == json.loads(json.dumps(metrics)) and written["saved"] is True
    assert [p["phase"] for p in written["phases"]] == ["none", "fit"] and written["phases"][1]["losses"] == ["ce"]
    assert (tmp_path / "out" / schema.COMPLETE_MARKER).exists()
    assert (tmp_path / "out" / "metrics.jsonl").exists()  # the engine's step lines, in the output
    assert not (tmp_path / "out" / "README.md").exists()  # no card unless the job asks for one


def test_a_failed_check_leaves_an_earlier_output_untouched(tmp_path):
    out = tmp_path / "out"
    run_job(Toy(), str(out))
    before = sorted(p.name for p in out.iterdir())
    with pytest.raises(UserError, match="bad input"):
        run_job(Toy(fail_check=True), str(out), overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == before


def test_a_job_without_steps_gets_no_engine(tmp_path):
    job = Toy(trains=False)
    metrics = run_job(job, str(tmp_path / "out"))
    assert "phases" not in job.calls and metrics["phases"] is None
    assert not (tmp_path / "out" / "metrics.jsonl").exists()


def test_a_rank_other_than_0_trains_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    job = Toy(trains=False)  # a process group of one cannot be started here: the path without steps
    assert run_job(job, str(tmp_path / "out")) == {"rank": 1}
    assert job.calls == ["check", ("prepare", False), "trained"]
    assert not (tmp_path / "out").exists()

