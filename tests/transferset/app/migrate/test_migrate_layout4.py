"""`transferset migrate` on a layout-4 run folder, which keyed a precision of `auto` (the default) as the `fp32` it
replaced: a teacher's engine precision `auto` as `fp32`, a score stage's `auto` or `fp32` out of its key. Today each
is keyed at its value. A folder holding the keys the layout-4 code computed for every shipped config
(layout4_keys.json, written by that code on test_migrate's inputs) is converted and reused stage by stage."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from test_migrate import assert_refused_then_reused, converted_whole, finished, write_inputs
from transferset.app.migrate import rules
from transferset.app.migrate.spellings import TRAINER_OPTIM
from transferset.app.run.runner import load_config
from transferset.app.stages import keys
from transferset.config import EngineConfig, ScoreConfig, TeacherConfig
from transferset.runtime import typed

LAYOUT4_KEYS: dict[str, dict[str, str]] = json.loads((Path(__file__).parent / "layout4_keys.json").read_text())


def layout4_folder(case: str, root: Path):
    """The run folder of configs/CASE.yaml as layout 4 left it: each stage's folder with its done file and its
    layout-4 key, the layout record and RUN/config.yaml."""
    write_inputs(root)
    cfg = load_config(f"configs/{case}.yaml", [f"run_dir={root / 'run'}", f"data={root / 'data'}", "test=null"])
    finished(cfg, LAYOUT4_KEYS[case])
    (root / "run" / keys.LAYOUT_FILE).write_text(json.dumps({"layout": 4}))
    (root / "run" / "config.yaml").write_text(json.dumps(as_then(typed.to_dict(cfg))))
    return cfg


def as_then(written: dict) -> dict:
    """A run config as layout 4 wrote it: a BiLSTM's named shape as its `preset`, the teacher's, prune's and exits'
    optimizer settings at the top of their sections (spellings.TRAINER_OPTIM names those they had; the teacher's grad_clip and exits' weight decay and
    clipping came with `optim:`)."""
    written["students"] = {name: rules.preset_shape(rules.flat_sections(s)) for name, s in written["students"].items()}
    for place, names in TRAINER_OPTIM.items():
        *outer, name = place.split(".")
        holder = written.get(outer[0]) if outer else written
        if isinstance(holder, dict) and isinstance(holder.get(name), dict):
            optim = holder[name].pop("optim")
            holder[name].update({k: optim[k] for k in names})
    return written


def test_the_cases_cover_every_shipped_config():
    assert set(LAYOUT4_KEYS) == {p.stem for p in Path("configs").glob("*.yaml")}


@pytest.mark.parametrize("case", sorted(LAYOUT4_KEYS))
def test_every_stage_of_a_shipped_configs_layout4_folder_is_converted(case, tmp_path):
    earlier = LAYOUT4_KEYS[case]
    new = converted_whole(layout4_folder(case, tmp_path), rules.V4, "layout4_key", earlier)
    assert new["data"] == earlier["data"] and new["augment"] == earlier["augment"]
    assert new["score"] != earlier["score"]  # its precision, `auto`, in the key now


@pytest.mark.parametrize("case", ["demo", "demo_ensemble", "demo_compress"])
def test_run_refuses_a_layout4_folder_then_reuses_every_stage_once_migrated(case, tmp_path):
    """Its config.yaml as layout 4 wrote it (the optimizer's settings in their earlier places, `preset: tang`)."""
    assert_refused_then_reused(layout4_folder(case, tmp_path), tmp_path / "run")


def test_layout4_keyed_auto_as_fp32_and_today_keys_each_at_its_value():
    auto, fp32, bf16 = (TeacherConfig(engine=EngineConfig(precision=p)) for p in ("auto", "fp32", "bf16"))
    assert rules.V4.teacher(auto) == rules.V4.teacher(fp32) != rules.V4.teacher(bf16)
    assert keys.teacher(auto) != keys.teacher(fp32) and keys.teacher(auto)["engine"]["precision"] == "auto"
    assert "precision" not in rules.V4.score(ScoreConfig(precision="auto"), members=1)
    assert rules.V4.score(ScoreConfig(precision="fp32"), members=1) == rules.V4.score(ScoreConfig(), members=1)
    assert rules.V4.score(ScoreConfig(precision="bf16"), members=1)["precision"] == "bf16"
    assert {keys.score(ScoreConfig(precision=p), members=1)["precision"] for p in ("auto", "fp32", "bf16")} == \
        {"auto", "fp32", "bf16"}
