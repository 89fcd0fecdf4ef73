"""`transferset run` with a teacher ensemble (teacher_seeds / teacher_paths): each member its own cached
stage, the set scored once with all of them, the ensemble evaluated on the test split with its members."""
import json
from pathlib import Path

import pytest

import builders as testing
from recording_stages import RecordingStages
from transferset.app.cli import main
from transferset.app.run.runner import STAGE_FILE, load_config, plan_stages, resolve_data, run_pipeline
from transferset.app.stages.base import stage_key
from transferset.runtime import typed
from transferset.runtime.errors import UserError


class RecordingTeachers(RecordingStages):
    """Records every teacher fine-tuning (RecordingStages keeps the last)."""

    def teacher(self, cfg, *, train, dev, output, overwrite):
        self.seen.setdefault("teachers", []).append((cfg.seed, output))
        super().teacher(cfg, train=train, dev=dev, output=output, overwrite=overwrite)


def _base(tmp_path, sst2_dir):
    return [f"run_dir={tmp_path / 'r'}", f"data={sst2_dir}", "labeled_limit=200", "unlabeled_rows=20",
            "validation.rows=50"]


def _ran(log):
    return [m.split("]")[0][1:] for m in log if "] running → " in m]


def test_teacher_seeds_train_each_member_once_and_score_once_with_all(tmp_path, sst2_dir):
    base = _base(tmp_path, sst2_dir)
    rec, log = RecordingTeachers(), []
    cfg = load_config("configs/demo.yaml", [*base, "teacher_seeds=[0, 1, 2]", "score.combine=probs"])
    result = run_pipeline(cfg, log=log.append, functions=rec.functions())
    members = [str(tmp_path / "r" / "teachers" / f"seed{s}") for s in range(3)]
    assert rec.seen["teachers"] == [(s, m) for s, m in zip(range(3), members)]
    # scored once: the transfer set and the selection split, each by the three members together
    assert [(teacher, c.combine) for c, _, teacher, _ in rec.seen["score"]] == [(members, "probs")] * 2
    # the test split: the ensemble as one model (with its combination), then each student
    assert rec.seen["test"][0] == (members, str(sst2_dir / "dev.tsv"))
    out = result["outputs"]
    assert (out.teacher, out.members, out.combine, out.scorer) == (members[0], members, "probs", members)
    assert out.dev_scored == str(tmp_path / "r" / "dev" / "scored")
    # a rerun reuses every member; one more seed trains only it, then scores again
    log.clear()
    run_pipeline(load_config("configs/demo.yaml", [*base, "teacher_seeds=[0, 1, 2]", "score.combine=probs"]),
                 log=log.append, functions=RecordingTeachers().functions())
    assert _ran(log) == []
    log.clear()
    rec = RecordingTeachers()
    run_pipeline(load_config("configs/demo.yaml", [*base, "teacher_seeds=[0, 1, 2, 3]", "score.combine=probs"]),
                 log=log.append, functions=rec.functions())
    assert [s for s, _ in rec.seen["teachers"]] == [3]
    # an ensemble's students are exported as they ship, not its teacher (compress.ship)
    assert _ran(log) == ["teacher.seed3", "score", "dev.score", "students.labels_only", "students.distilled",
                         "compress.ship.labels_only", "compress.ship.distilled", "test"]


def test_teacher_paths_and_the_chosen_member(tmp_path, sst2_dir):
    given = [testing.tiny_classifier(str(tmp_path / f"t{k}"), seed=k) for k in range(2)]
    cfg = load_config("configs/demo.yaml", [*_base(tmp_path, sst2_dir), f"teacher_paths={given}", "score.combine=1"])
    plan = plan_stages(cfg, resolve_data(cfg.data, cfg.test))
    names = [(s.name, s.upstream) for s in plan.stages][:5]
    assert names == [("data", ()), ("teacher.0", ()), ("teacher.1", ()), ("teacher", ("teacher.0", "teacher.1")),
                     ("augment", ("data",))]
    # the chosen member's directory is the set's teacher (its id, hidden states, the students' online teacher)
    assert plan.outputs.teacher == given[1] and plan.outputs.members == given


def test_one_seed_is_the_single_teacher_and_its_score_key_is_unchanged(tmp_path, sst2_dir):
    rec = RecordingTeachers()
    cfg = load_config("configs/demo.yaml", [*_base(tmp_path, sst2_dir), "teacher_seeds=[4]"])
    result = run_pipeline(cfg, log=lambda m: None, functions=rec.functions())
    member = str(tmp_path / "r" / "teachers" / "seed4")
    assert [teacher for _, _, teacher, _ in rec.seen["score"]] == [member, member]  # a str: the old schema
    assert not result["outputs"].ensemble and rec.seen["test"][0] == (member, str(sst2_dir / "dev.tsv"))
    # the score key leaves out `combine` with one teacher: run directories made before ensembles are reused
    keys = {f: json.loads((tmp_path / "r" / f / STAGE_FILE).read_text())["key"] for f in ("transfer", "scored")}
    old_settings = {k: v for k, v in typed.to_dict(cfg.score).items() if k != "combine"}
    teacher_key = stage_key("teacher", {"members": 1}, [json.loads(
        (Path(member) / STAGE_FILE).read_text())["key"]])
    assert keys["scored"] == stage_key("score", old_settings, [keys["transfer"], teacher_key])


@pytest.mark.parametrize("overrides, says", [
    (["teacher_seeds=[]"], "teacher_seeds is empty: an ensemble needs at least one teacher"),
    (["teacher_seeds=[1, 1]"], "teacher_seeds [1, 1] names a teacher twice"),
    (["teacher_seeds=[0, 1]", "teacher_path=/x"], "teacher_path and teacher_seeds each choose the teacher"),
    (["teacher_seeds=[0, 1]", "score.combine=2"],
     "--combine 2: there are 2 teacher(s), so a member index is 0..1 (in the order of teacher_seeds / teacher_paths)"),
    (["teacher_paths=[/no/such/a, /no/such/b]"], "teacher_paths=/no/such/a: no such directory"),
    (["score.combine=median"], "--combine 'median': choose one of ['mean', 'probs']"),
])
def test_ensemble_settings_refused_before_any_stage(overrides, says, tmp_path, sst2_dir, capsys):
    run_dir = tmp_path / "run"
    rc = main(["run", "--config", "configs/demo.yaml", f"run_dir={run_dir}", f"data={sst2_dir}", *overrides])
    err = capsys.readouterr().err
    assert rc == 2 and says in err, err
    assert not run_dir.exists()


def test_the_ensemble_config_validates():
    cfg = load_config("configs/demo_ensemble.yaml")
    assert cfg.teacher_seeds == (0, 1, 2) and cfg.score.combine == "mean"
    with pytest.raises(UserError, match="teacher_seeds is empty"):
        load_config("configs/demo_ensemble.yaml", ["teacher_seeds=[]"])
