"""`transferset migrate` on a layout-3 run folder, where each built-in loss was a student setting of its own name
(`kd: 1.0`, `temperature: 2.0`): today every loss is under `losses:`. A folder holding the keys the layout-3 code
computed (LAYOUT3_KEYS) is converted and reused stage by stage; a killed student's checkpoint takes today's form.
The inputs the keys read are test_migrate's (write_inputs), so a key depends on the config and the rules only."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from test_migrate import AS_THEN, assert_refused_then_reused, finished, recipe_then, write_inputs
from transferset.app import migrate
from transferset.app.stages import keys
from transferset.app.migrate.rules import flat_student
from transferset.app.run.runner import load_config
from transferset.runtime import typed

# The layout-3 keys of these shipped configs, as the code that wrote layout-3 folders computed them (before the
# losses moved under `losses:`); the stages above the students are those of demo.yaml in most of them.
LAYOUT3_SHARED = {"data": "4f8c1e54a44a6ee3", "teacher": "2154693763136436", "augment": "32acd5f743a6ae95", "score":
                  "881dd7c90042b04f", "dev": "a18b68280e7e026c", "dev.score": "1f86b790a7b11610"}
LAYOUT3_KEYS = {
    "demo": {**LAYOUT3_SHARED, "students.labels_only": "9f76f0ea34118bb1", "students.distilled": "0757ef81efdf0b69",
        "test": "627306e69cdd5833"},
    "demo_tinybert": {**LAYOUT3_SHARED, "layer_texts": "279e9d0499a20299", "students.tinybert3": "178d353d6f5237b2",
        "students.tinybert_narrow": "d283cd3de85d0a49", "students.logits_only3": "8e949545fa75da7a",
        "students.logits_only_narrow": "b25e1f2a81ed7219", "test": "fb978db97939d4bb"},
    "demo_pkd": {"data": "4f8c1e54a44a6ee3", "teacher": "2154693763136436", "augment": "32acd5f743a6ae95", "score":
        "db588f0f0ed0db4a", "dev": "a18b68280e7e026c", "dev.score": "5719e5ddb3e66c6d", "students.pkd3":
        "0202f8989608673c", "students.logits_only3": "b17d1b43cf1d6495", "test": "f0d71737a973db09"},
    "demo_static": {**LAYOUT3_SHARED, "students.labels_only": "9f76f0ea34118bb1", "students.distilled":
        "0757ef81efdf0b69", "students.static_labels_only": "504ea6c7ca7f80d0", "students.static_distilled":
        "12ece203ad01c578", "test": "05f6d5b017231b36"},
    "sst2_transformer": {"data": "094d54e0094b1234", "teacher": "14bd1e302d3ea590", "augment": "16b8a3d66a2de7eb",
        "score": "9cb5bcef1e779e41", "dev": "a18b68280e7e026c", "dev.score": "863901ce04c57670", "students.pkd":
        "675bf7d1d9b7d231", "test": "50b0bfb32421e32e"},
    "demo_distilbert": {**LAYOUT3_SHARED, "students.distilbert3": "2975972bd837f226", "students.logits_only3":
        "1f1259b4fd3d6287", "test": "8840b87a22ff10ca"},
}


def layout3_folder(case: str, root: Path):
    """The run folder of configs/CASE.yaml as layout 3 left it: each stage's folder with its done file and its
    layout-3 key, the layout record, and RUN/config.yaml with each student's losses in the flat form of then."""
    write_inputs(root)
    cfg = load_config(f"configs/{case}.yaml", [f"run_dir={root / 'run'}", f"data={root / 'data'}", "test=null",
                                               *recipe_then(f"configs/{case}.yaml"), *AS_THEN])
    finished(cfg, LAYOUT3_KEYS[case])
    (root / "run" / keys.LAYOUT_FILE).write_text(json.dumps({"layout": 3}))
    written = typed.to_dict(cfg)
    written["students"] = {name: flat_student(s) for name, s in written["students"].items()}
    (root / "run" / "config.yaml").write_text(json.dumps(written))
    return cfg


@pytest.mark.parametrize("case", sorted(LAYOUT3_KEYS))
def test_a_layout3_folder_is_refused_then_reuses_every_stage_once_migrated(case, tmp_path):
    cfg = layout3_folder(case, tmp_path)  # its config.yaml with the losses in the flat form
    assert_refused_then_reused(cfg, tmp_path / "run", "layout3_key", LAYOUT3_KEYS[case])


def test_a_killed_students_layout3_checkpoint_takes_todays_form(tmp_path):
    import torch

    folder = tmp_path / "checkpoint"
    folder.mkdir()
    flat = {"phases": "joint", "epochs": 2, "ce": 0.0, "mse": 0.0, "kd": 1.0, "temperature": 2.0, "repr": 0.0,
            "losses": {}}
    torch.save({"recipe": {}, "fingerprint": {"settings": json.dumps(flat), "processes": 1}}, folder / "state.pt")
    assert migrate.convert_checkpoint(str(folder), teacher=False)
    saved = torch.load(folder / "state.pt", weights_only=True)["fingerprint"]
    # the losses in the canonical form a fingerprint holds today (students.trainer.fingerprint)
    assert json.loads(saved["settings"]) == {"phases": "joint", "epochs": 2,
                                             "losses": {"kd": {"weight": 1.0, "temperature": 2.0}}}
    assert json.loads((folder / "fingerprint.json").read_text()) == saved


def test_a_reused_students_metrics_take_todays_form_which_the_report_reads(tmp_path):
    from transferset.app.report import Timed, student_rows
    from transferset.app.report.outputs import RunOutputs

    folder = tmp_path / "students" / "distilled"
    folder.mkdir(parents=True)
    flat = {"student": "bilstm", "schedule": "joint", "lr": 1e-3, "ce": 0.0, "mse": 0.0, "kd": 1.0, "temperature": 2.0,
            "losses": {}, "epochs": 5}
    (folder / "metrics.json").write_text(json.dumps({"student": "bilstm", "schedule": "joint", "config": flat,
                                                     "dev_accuracy": 0.8, "transfer": {"rows": 9, "labeled_rows": 3}}))
    assert migrate.convert_metrics(str(folder / "metrics.json")) and not migrate.convert_metrics(str(tmp_path / "no"))
    metrics = json.loads((folder / "metrics.json").read_text())
    assert "schedule" not in metrics and metrics["config"]["phases"] == "joint"
    assert metrics["config"]["optim"] == {"lr": 1e-3} and metrics["config"]["losses"] == {
        "ce": 0.0, "mse": 0.0, "kd": {"weight": 1.0, "temperature": 2.0}}
    out = RunOutputs(str(tmp_path), "selection.tsv", None, students={"distilled": str(folder)})
    timed = {"latency_1": 1.0, "latency_64": 1.0, "spread_1": 0.0, "spread_64": 0.0, "parameters": 1}
    (row,) = student_rows(Timed(out, None, {"student:distilled": timed, "teacher": timed}, {}, False))
    assert row["name"] == "student: distilled (bilstm, joint)"
