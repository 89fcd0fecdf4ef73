"""The teacher and the transfer set of a run that splits train take the split's label set (all of train's
labels), not the labeled rows': a class the carve left out of labeled.jsonl keeps its place in the head."""
import json
from dataclasses import replace

from transferset.app.stages.augment import augment_stage
from transferset.app.stages.context import DataFiles, StageFunctions, make_run
from transferset.app.stages.teacher import trained_teacher
from transferset.config import RunConfig
from transferset.data.splits import split_data
from transferset.runtime import typed


def _run(tmp_path, fn, **values):
    cfg = typed.load(RunConfig, {"students": {"s": {}}, "run_dir": str(tmp_path / "run"), **values}, where="test")
    return make_run(cfg, DataFiles(train=str(tmp_path / "train.jsonl"), dev=None, test=None), fn)


def test_the_teacher_and_augment_get_the_split_label_set(tmp_path):
    # class "rare" has one row; with labeled_limit=4 the labeled rows hold only "a" and "b"
    rows = [{"text": f"row {i} words", "label": "ab"[i % 2]} for i in range(30)] + [{"text": "last", "label": "rare"}]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    seen = {}
    fn = replace(StageFunctions(), teacher=lambda tc, **kw: seen.update(teacher=tc.labels),
                 augment=lambda a, **kw: seen.update(augment=a.labels), can_resume_teacher=lambda tc, **kw: False)
    r = _run(tmp_path, fn, validation={"rows": 5, "by": "row"}, labeled_limit=4)
    split_data(r.files.train, r.data_dir, r.cfg)
    labeled = (tmp_path / "run" / "data" / "labeled.jsonl").read_text().splitlines()
    assert {json.loads(line)["label"] for line in labeled} == {"a", "b"}
    trained_teacher(r, "teacher", r.path("teacher"), r.teacher).run(r.path("teacher"))
    augment_stage(r, "augment", r.path("transfer"), r.augment, [r.labeled], [r.unlabeled]).run(r.path("transfer"))
    assert seen == {"teacher": ("a", "b", "rare"), "augment": ("a", "b", "rare")}


def test_a_label_set_the_config_names_stands(tmp_path):
    r = _run(tmp_path, StageFunctions(), validation={"rows": 5}, teacher={"labels": "x,y"})
    assert r.split_labels(r.teacher).labels == ("x", "y")  # split.json is not even read
