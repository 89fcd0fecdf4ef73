"""`transferset migrate` on a layout-5 run folder, which held a student's tokens, data and report settings at the top
of its settings (`trim_vocab: true`); today they are its `vocab:`, `data:` and `report:` sections. A folder holding
the keys the layout-5 code computed for every shipped config (layout5_keys.json, written by that code on
test_migrate's inputs) is converted and reused stage by stage, and its RUN/config.yaml is written again under today's
names, so that a run reads it (a budget's cuts, earlier_cut)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from test_migrate import assert_refused_then_reused, converted_whole, finished, write_inputs
from transferset.app import migrate
from transferset.app.migrate import rules
from transferset.app.run.runner import load_config, recorded_config
from transferset.app.stages import keys
from transferset.config import StudentConfig
from transferset.runtime import typed

LAYOUT5_KEYS: dict[str, dict[str, str]] = json.loads((Path(__file__).parent / "layout5_keys.json").read_text())


def layout5_folder(case: str, root: Path, overrides=()):
    """The run folder of configs/CASE.yaml as layout 5 left it: each stage's folder with its done file and its
    layout-5 key, the layout record and RUN/config.yaml in layout 5's spelling (each student flat)."""
    write_inputs(root)
    cfg = load_config(f"configs/{case}.yaml", [f"run_dir={root / 'run'}", f"data={root / 'data'}", "test=null",
                                               *overrides])
    finished(cfg, LAYOUT5_KEYS[case])
    (root / "run" / keys.LAYOUT_FILE).write_text(json.dumps({"layout": 5}))
    written = typed.to_dict(cfg)
    written["students"] = {name: rules.flat_sections(s) for name, s in written["students"].items()}
    (root / "run" / "config.yaml").write_text(yaml.safe_dump(written, sort_keys=False))
    return cfg


def test_the_cases_cover_every_shipped_config():
    assert set(LAYOUT5_KEYS) == {p.stem for p in Path("configs").glob("*.yaml")}


@pytest.mark.parametrize("case", sorted(LAYOUT5_KEYS))
def test_every_stage_of_a_shipped_configs_layout5_folder_is_converted(case, tmp_path):
    earlier = LAYOUT5_KEYS[case]
    new = converted_whole(layout5_folder(case, tmp_path), rules.V5, "layout5_key", earlier)
    # what comes before the students keeps its key; each student's key holds its sections now
    assert all(new[name] == earlier[name] for name in ("data", "teacher", "augment", "score") if name in earlier)
    students = [name for name in earlier if name.startswith("students.")]
    assert students and all(new[name] != earlier[name] for name in students)


@pytest.mark.parametrize("case", ["demo", "demo_static", "sst2_lowres"])
def test_run_refuses_a_layout5_folder_then_reuses_every_stage_once_migrated(case, tmp_path):
    assert_refused_then_reused(layout5_folder(case, tmp_path), tmp_path / "run")


def test_migrate_writes_the_folders_config_again_in_todays_spelling_with_the_cuts_the_run_made(tmp_path):
    """A budgeted run's RUN/config.yaml holds the cuts it made (a student's epochs); a rerun reads them there
    (earlier_cut). In layout 5's spelling it did not load: migrate writes it again, each setting at its value."""
    cfg = layout5_folder("demo", tmp_path, ["students.labels_only.epochs=2", "budget_minutes=15"])
    run = tmp_path / "run"
    assert recorded_config(str(run)) is None  # `trim_vocab` at the top of a student: an unknown setting now
    migrate.migrate(str(run), log=lambda m: None)
    again = recorded_config(str(run))
    assert again is not None and again == cfg
    assert again.students["labels_only"].epochs == 2 and again.budget_minutes == 15
    assert again.students["labels_only"].vocab.trim_vocab is True
    assert "trim_vocab" not in yaml.safe_load((run / "config.yaml").read_text())["students"]["labels_only"]


def test_migrate_leaves_a_config_given_by_flag_as_it_is(tmp_path):
    cfg = layout5_folder("demo", tmp_path)
    run = tmp_path / "run"
    given = tmp_path / "mine.yaml"
    given.write_text((run / "config.yaml").read_text())
    (run / "config.yaml").unlink()
    migrate.migrate(str(run), config=str(given), log=lambda m: None)
    assert not (run / "config.yaml").exists() and "trim_vocab" in given.read_text()
    assert keys.read_layout(str(run)) == keys.LAYOUT and cfg.students


def test_layout5_held_a_students_sections_flat_and_today_keys_them_as_sections():
    s = typed.load(StudentConfig, {"vocab": {"trim_vocab": True}, "data": {"max_length": 64},
                                   "report": {"latency_examples": 8}}, "test")
    old, new = rules.V5.student(s), keys.student(s)
    assert (old["trim_vocab"], old["max_length"], old["latency_examples"]) == (True, 64, 8)
    assert not {"vocab", "data", "report"} & set(old)
    assert (new["vocab"]["trim_vocab"], new["data"]["max_length"], new["report"]["latency_examples"]) == (True, 64, 8)
    assert rules.grouped_student(old) == {k: v for k, v in new.items()}
