"""`transferset migrate`: a run folder of layout 1 (the earlier key rules) converted so that `run` reuses every
stage it finished. The layout-1 keys of every shipped config are written down (LAYOUT1_KEYS, computed by the
code that wrote such folders); a folder holding them is converted and reused stage by stage, and one holding
another key is run again.

Every input a key reads is written here with fixed content (the data folder, the carved validation split,
the transfer set's labels), so a key depends on the config and the key rules only, never on the machine."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Optional

import pyarrow.parquet as pq
import pytest

from transferset.app import migrate
from transferset.app.stages import keys
from transferset.app.migrate import rules
from transferset.app.migrate.rules import flat_student
from transferset.app.run.runner import STAGE_FILE, load_config, plan_stages, resolve_data, run_pipeline
from transferset.config import TeacherConfig
from transferset.contract import schema
from transferset.data.splits import SPLIT_STATS_FILE
from transferset.runtime import typed
from transferset.runtime.errors import ConfigError

TRAIN = "sentence\tlabel\n" + "".join(f"row {i} is {'good' if i % 2 else 'bad'}\t{i % 2}\n" for i in range(40))
DEV = "sentence\tlabel\n" + "".join(f"dev {i} was {'fine' if i % 2 else 'dull'}\t{i % 2}\n" for i in range(10))
TEST = "sentence\tlabel\n" + "".join(f"test {i}\t{i % 2}\n" for i in range(6))
VALIDATION = "".join(f'{{"sentence": "carved {i}", "label": {i % 2}}}\n' for i in range(5))


def write_inputs(root: Path) -> None:
    """The files the keys read, with the same bytes on every machine."""
    data = root / "data"
    data.mkdir(parents=True, exist_ok=True)
    for name, text in (("train.tsv", TRAIN), ("dev.tsv", DEV), ("test.tsv", TEST)):
        (data / name).write_text(text)
    (root / "run" / "data").mkdir(parents=True, exist_ok=True)
    (root / "run" / "data" / "validation.jsonl").write_text(VALIDATION)
    shards = root / "run" / "transfer" / schema.DATA_DIR
    shards.mkdir(parents=True, exist_ok=True)
    pq.write_table(schema.transfer_schema(schema.base_metadata(["negative", "positive"])).empty_table(),
                   shards / "p0.parquet")


def recipe_then(config: str, overrides=()) -> list[str]:
    """The override back to the recipe a config (with `overrides`) used when the earlier layouts' keys were written:
    tang for one on tang_join (the join op came after them)."""
    cfg = load_config(config, ["test=null", *overrides])
    return ["augment.recipe=tang"] if cfg.augment.recipe == "tang_join" else []


def as_trained_then(config: str, overrides=()) -> list[str]:
    """`overrides` and, for each student of the config, the constant learning rate every student trained at
    when those keys were written (the BiLSTMs' default since is a linear warm-up and decay); its recipe of then
    (recipe_then)."""
    cfg = load_config(config, ["test=null", *overrides])
    pinned = [f"students.{name}.engine.{k}={v}" for name in cfg.students for k, v in (("schedule", "constant"),
                                                                                       ("warmup", 0))]
    return [*overrides, *pinned, *recipe_then(config, overrides)]


# What every earlier layout's run did where a default has changed since (settings added, not rules), given to the
# configs of the tests of conversion. Its teacher ran every epoch: `teacher.patience` came after, and today's default,
# 1, stops early, which is other work (with it the teacher and every stage after it run again:
# test_a_folder_of_then_under_todays_defaults_trains_its_teacher_again_and_says_so). Nothing was exported as it ships:
# `compress.ship` came after, new stages that no earlier folder holds and that the test stage scores (with them it
# runs again). The pinned keys below are the old folders' truth, unchanged.
AS_THEN = ["teacher.patience=null", "compress.ship=false"]

# config, overrides: the shipped configs, and two with the settings the legacy rules are about
CASES = {
 "demo_distilbert": ("configs/demo_distilbert.yaml", []),
 "demo_minilm": ("configs/demo_minilm.yaml", []),
 "demo_mobilebert": ("configs/demo_mobilebert.yaml", []),
 "sst2_full": ("configs/sst2_full.yaml", []),
 "sst2_mpnet": ("configs/sst2_mpnet.yaml", []),
 "demo": ("configs/demo.yaml", []),
 "demo_tinybert": ("configs/demo_tinybert.yaml", []),
 "demo_ensemble": ("configs/demo_ensemble.yaml", []),
 "demo_compress": ("configs/demo_compress.yaml", []),
 "demo_pkd": ("configs/demo_pkd.yaml", []),
 "sst2_lowres": ("configs/sst2_lowres.yaml", []),
 "sst2_full_ensemble": ("configs/sst2_full_ensemble.yaml", []),
 "sst2_tang": ("configs/sst2_tang.yaml", []),
 "sst2_tang_dataflow": ("configs/sst2_tang_dataflow.yaml", ["beam.runner=FnApiRunner", "beam.options={}"]),
 "sst2_transformer": ("configs/sst2_transformer.yaml", []),
 "sst2_pretrained_student": ("configs/sst2_pretrained_student.yaml", []),
 "demo_layer_epochs": ("configs/demo.yaml", ["students.distilled.layer_epochs=3", "augment.words_per_variant=4",
                                            "validation.by=row", "augment.ops=mask,ngram", "augment.p_mask=0.2"]),
 "demo_mlm": ("configs/demo.yaml", ["augment.recipe=tinybert", "teacher.checkpoint_steps=50", "validation=null",
                                   "labeled_limit=30", "unlabeled_rows=null"]),
}

# The layout-1 keys of CASES, as the code that wrote layout-1 folders computed them (with the students' constant
# rate of then: as_trained_then).
LAYOUT1_KEYS = {
    "demo_distilbert": {
        "data": "bd4f78d410925aa7",
        "teacher": "4b96abb58dbb319a",
        "augment": "f1fe3656a4549596",
        "score": "3f6ca1a20b15550b",
        "dev": "a18b68280e7e026c",
        "dev.score": "7b51138ca7d83cd5",
        "students.distilbert3": "121108b0b30dc38c",
        "students.logits_only3": "c8075f610c1ca38d",
        "test": "9dec0968784dbd28"
    },
    "demo_minilm": {
        "data": "bd4f78d410925aa7",
        "teacher": "4b96abb58dbb319a",
        "augment": "f1fe3656a4549596",
        "score": "3f6ca1a20b15550b",
        "dev": "a18b68280e7e026c",
        "dev.score": "7b51138ca7d83cd5",
        "students.minilm3": "7f45c451c2ddea81",
        "students.minilm_narrow": "82af8a68c497b87d",
        "students.logits_only3": "3eb54f04c9e895fb",
        "students.logits_only_narrow": "b5846132ab9847d3",
        "test": "bedd41ba8c0319c1"
    },
    "demo_mobilebert": {
        "data": "bd4f78d410925aa7",
        "teacher": "4b96abb58dbb319a",
        "augment": "f1fe3656a4549596",
        "score": "3f6ca1a20b15550b",
        "dev": "a18b68280e7e026c",
        "dev.score": "7b51138ca7d83cd5",
        "students.mobilebert3": "244bf1925d5f0112",
        "students.mobilebert3_joint": "10ccbf6804ddb1b0",
        "students.logits_only3": "b021254c93fd0ed3",
        "test": "a2d326a3def54a5a"
    },
    "sst2_full": {
        "data": "4fc0e987c020449a",
        "teacher": "9eda5e925c9b2503",
        "augment": "568a22c8f435ed8c",
        "score": "9a89c26f691b20ff",
        "dev": "a18b68280e7e026c",
        "dev.score": "58463f2613d51942",
        "students.labels_only": "85dff9fd19dcffe7",
        "students.distilled": "ebbd638af0a7f33a",
        "test": "436539df559af5e1"
    },
    "sst2_mpnet": {
        "data": "4fc0e987c020449a",
        "teacher": "38a1d9cde5469e56",
        "augment": "bdcfb8bc48893ea2",
        "score": "1cc6e3f8b3f61500",
        "dev": "a18b68280e7e026c",
        "dev.score": "80a6d94a1dcb6de0",
        "students.labels_only": "c16cef8280708876",
        "students.distilled_kl": "e2c9d5a90587439a",
        "students.distilled_mse": "72c2b3ad508b098e",
        "test": "4afe3cb1b78d9e3c"
    },
    "demo": {
        "data": "bd4f78d410925aa7",
        "teacher": "4b96abb58dbb319a",
        "augment": "f1fe3656a4549596",
        "score": "3f6ca1a20b15550b",
        "dev": "a18b68280e7e026c",
        "dev.score": "7b51138ca7d83cd5",
        "students.labels_only": "d030a25cfd24b046",
        "students.distilled": "f949b3d3940ce51b",
        "test": "358548c2778c0c4e"
    },
    "demo_tinybert": {
        "data": "bd4f78d410925aa7",
        "teacher": "4b96abb58dbb319a",
        "augment": "f1fe3656a4549596",
        "score": "3f6ca1a20b15550b",
        "dev": "a18b68280e7e026c",
        "dev.score": "7b51138ca7d83cd5",
        "layer_texts": "d7d9cddc9f015fe8",
        "students.tinybert3": "e1704f818c5f0574",
        "students.tinybert_narrow": "b062cc084c19c436",
        "students.logits_only3": "3eb54f04c9e895fb",
        "students.logits_only_narrow": "7202e519a0b3eff6",
        "test": "262a194e147d379d"
    },
    "demo_ensemble": {
        "data": "bd4f78d410925aa7",
        "teacher.seed0": "4b96abb58dbb319a",
        "teacher.seed1": "915797e255f082e3",
        "teacher.seed2": "de822b61242b6a1f",
        "teacher": "8d28c46c41886208",
        "augment": "f1fe3656a4549596",
        "score": "fa31aababfe8a0dc",
        "dev": "a18b68280e7e026c",
        "dev.score": "fae5d8e633d91425",
        "students.labels_only": "566fd8b437876275",
        "students.distilled": "c00ae40a3651397b",
        "test": "40a0a44eb58aac72"
    },
    "demo_compress": {
        "data": "bd4f78d410925aa7",
        "teacher": "4b96abb58dbb319a",
        "augment": "f1fe3656a4549596",
        "score": "3f6ca1a20b15550b",
        "dev": "a18b68280e7e026c",
        "dev.score": "7b51138ca7d83cd5",
        "students.labels_only": "d030a25cfd24b046",
        "students.distilled": "f949b3d3940ce51b",
        "compress.int8.teacher": "583811ca707870f0",
        "compress.int8.distilled": "738d9f21600d5fca",
        "compress.exits": "4ea83a6b6972a1cc",
        "compress.prune": "219c0ba75d901c45",
        "test": "bd5d8297815190a9"
    },
    "demo_pkd": {
        "data": "bd4f78d410925aa7",
        "teacher": "4b96abb58dbb319a",
        "augment": "f1fe3656a4549596",
        "score": "f44c1be35ce4639d",
        "dev": "a18b68280e7e026c",
        "dev.score": "7f3f4dee63a887b8",
        "students.pkd3": "3df0107381dd9630",
        "students.logits_only3": "5c51236607ef3f83",
        "test": "972a1039c01cb4d5"
    },
    "sst2_lowres": {
        "data": "bbb1d5f7a636ded1",
        "teacher": "5f0518d7299059bf",
        "augment": "61c556b3987bfd1c",
        "score": "cf07f3175d4ad5fa",
        "dev": "a18b68280e7e026c",
        "dev.score": "e1eb8bd03c3ac221",
        "students.labels_only": "ea4e20a383d0b89d",
        "students.progressive": "4e3b119c79639adb",
        "students.distilled": "74f5f0dc39183da8",
        "test": "86d149054d1d7549"
    },
    "sst2_full_ensemble": {
        "data": "4fc0e987c020449a",
        "teacher.seed0": "9eda5e925c9b2503",
        "teacher.seed1": "cf4a48dee0398c5b",
        "teacher.seed2": "69739080e620c7ed",
        "teacher": "0927a74a05700001",
        "augment": "568a22c8f435ed8c",
        "score": "67450e6ce71e6d74",
        "dev": "a18b68280e7e026c",
        "dev.score": "2e63f8b81e14a343",
        "students.labels_only": "b3bc7bbacee9d0fd",
        "students.distilled": "20edd824c32488c2",
        "test": "7b0524920be357a4"
    },
    "sst2_tang": {
        "data": "4fc0e987c020449a",
        "teacher": "f656d2ec25b09949",
        "augment": "33425e9c67a44062",
        "score": "a025ba0c8513f8bb",
        "dev": "a18b68280e7e026c",
        "dev.score": "8092fadc555bc8e9",
        "students.labels_only": "9a5455a6c55faf4f",
        "students.distilled": "d41fe921decefe37",
        "test": "c2008abd643a9feb"
    },
    "sst2_tang_dataflow": {
        "data": "4fc0e987c020449a",
        "teacher": "f656d2ec25b09949",
        "augment": "33425e9c67a44062",
        "score": "7dcb44e95a179d01",
        "dev": "a18b68280e7e026c",
        "dev.score": "9d3eb266c1c94b02",
        "students.labels_only": "02c8d8dfa516c3f4",
        "students.distilled": "9109f32da29a217a",
        "test": "0e701b548aafecb0"
    },
    "sst2_transformer": {
        "data": "d1db01beffd7de76",
        "teacher": "45f6db473c1fb74a",
        "augment": "6e95128f79836921",
        "score": "99ed0b0ed82773b0",
        "dev": "a18b68280e7e026c",
        "dev.score": "c0401690393e2fa0",
        "students.pkd": "d7abba860723cc07",
        "test": "424cb54aa8a890d7"
    },
    "sst2_pretrained_student": {
        "data": "d1db01beffd7de76",
        "teacher": "0859ee4173b2e68a",
        "augment": "6e95128f79836921",
        "score": "163b660d6f3a9bf8",
        "dev": "a18b68280e7e026c",
        "dev.score": "901b1a7c1dca1ab6",
        "students.minilm": "e962bfac824e3956",
        "test": "c507b7d8d5cbf056"
    },
    "demo_layer_epochs": {
        "data": "31e5b8334bf23d8d",
        "teacher": "06d39d291968bfc2",
        "augment": "4a25db3d916d98a0",
        "score": "1717138302b5070b",
        "dev": "a18b68280e7e026c",
        "dev.score": "201a2b8b7d5a92a6",
        "students.labels_only": "5161a8ec9b6637be",
        "students.distilled": "1a22d53f8db47ff7",
        "test": "3b4f2e1b943f9a79"
    },
    "demo_mlm": {
        "data": "47d6194ce36a1df0",
        "teacher": "b20a56bc61aa2786",
        "augment": "360c65543bd4a56c",
        "score": "4a43d166dc8b5166",
        "dev": "0a0606a723eee5a9",
        "dev.score": "84c46147790c64ec",
        "students.labels_only": "e788ac8bfe0faa18",
        "students.distilled": "44ce9076f1e6e78b",
        "test": "22d78dcb14733f75"
    }
}




def layout1_folder(case: str, root: Path, overrides=(), as_then=AS_THEN):
    """The run folder of CASES[case] as layout 1 left it: each stage's folder with its done file and its
    layout-1 key, no layout record. Returns the run's config (with `as_then`: AS_THEN, the run as it was then)."""
    config, extra = CASES[case]
    write_inputs(root)
    cfg = load_config(config, [f"run_dir={root / 'run'}", f"data={root / 'data'}", "test=null",
                               *as_trained_then(config, extra), *as_then, *overrides])
    finished(cfg, LAYOUT1_KEYS[case])
    return cfg


def finished(cfg, keyed: dict[str, str]) -> None:
    """Each stage's folder of `cfg`'s run with its done file and its record holding `keyed[stage]`; a stage `keyed`
    has no key for (one no earlier layout had: compress.ship's) has no folder."""
    for s in plan_stages(cfg, resolve_data(cfg.data, cfg.test)).stages:
        if s.run is not None and s.name in keyed:
            folder = Path(s.folder)
            (folder / s.done_file).parent.mkdir(parents=True, exist_ok=True)
            if not (folder / s.done_file).exists():
                (folder / s.done_file).write_text("{}")
            (folder / STAGE_FILE).write_text(json.dumps({"key": keyed[s.name]}))


def converted_whole(cfg, earlier_rules, field: str, earlier: dict[str, str]) -> dict[str, str]:
    """Every stage of `cfg`'s run, its folder holding the key `earlier_rules` gave it, converted and reused (each record
    holding today's key and, under `field`, its `earlier` one); → today's keys by stage."""
    files = resolve_data(cfg.data, cfg.test)
    done = migrate.convert(cfg, files, log=lambda m: None, rules=earlier_rules)
    ran = [s.name for s in plan_stages(cfg, files).stages if s.run is not None]
    assert done == {"reused": ran, "resumed": [], "rerun": []}
    return assert_converted(cfg, field, earlier)


def assert_converted(cfg, field: str, earlier: dict[str, str], only=None) -> dict[str, str]:
    """Each stage record of `cfg`'s run (`only` those named there) holds the key today's plan computes, and under
    `field` its earlier key (`earlier[stage]`); → today's keys by stage."""
    new: dict[str, str] = {}
    for s in plan_stages(cfg, resolve_data(cfg.data, cfg.test)).stages:
        new[s.name] = s.key([new[u] for u in s.upstream])
        if s.run is not None and (only is None or s.name in only):
            record = json.loads((Path(s.folder) / STAGE_FILE).read_text())
            assert record == {"key": new[s.name], field: earlier[s.name]}
    return new


# Shipped configs whose stages no layout-1 folder can hold: a student family that came after layout 2
# (its stages' keys were never written by the earlier rules). Their other stages are demo.yaml's, covered above.
AFTER_LAYOUT1 = {"demo_static.yaml"}


def test_the_cases_cover_every_shipped_config():
    shipped = {p.name for p in Path("configs").glob("*.yaml")}
    assert shipped - AFTER_LAYOUT1 <= {Path(c).name for c, _ in CASES.values()}
    assert AFTER_LAYOUT1 <= shipped  # a name here that no config has any more goes


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_stage_of_a_shipped_configs_layout1_folder_is_converted(case, tmp_path):
    cfg = layout1_folder(case, tmp_path)
    done = migrate.convert(cfg, resolve_data(cfg.data, cfg.test), log=lambda m: None)
    ran = [s.name for s in plan_stages(cfg, resolve_data(cfg.data, cfg.test)).stages if s.run is not None]
    assert done == {"reused": ran, "resumed": [], "rerun": []}
    assert_converted(cfg, "layout1_key", LAYOUT1_KEYS[case])


@pytest.mark.parametrize("case", ["demo", "demo_ensemble", "demo_compress"])
def test_run_refuses_a_layout1_folder_then_reuses_every_stage_once_migrated(case, tmp_path):
    from recording_stages import RecordingStages

    cfg = layout1_folder(case, tmp_path)
    before = {p: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()}
    with pytest.raises(ConfigError, match=r"transferset migrate .*run"):
        run_pipeline(cfg, log=lambda m: None, functions=RecordingStages().functions())
    after = {p: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file() and p.name != ".transferset.lock"}
    assert after == before  # refused before anything was written

    (tmp_path / "run" / "config.yaml").write_text(json.dumps(typed.to_dict(cfg)))
    migrate.migrate(str(tmp_path / "run"), log=lambda m: None)
    assert keys.read_layout(str(tmp_path / "run")) == keys.LAYOUT
    log = []
    run_pipeline(cfg, log=log.append, functions=RecordingStages().functions())
    assert [m for m in log if "] running → " in m or "resuming" in m] == []
    ran = [s for s in plan_stages(cfg, resolve_data(cfg.data, cfg.test)).stages if s.run is not None]
    assert sum("up to date" in m for m in log) == len(ran)


def test_a_stage_of_other_settings_is_run_again_and_its_downstream_too(tmp_path):
    cfg = layout1_folder("demo", tmp_path, overrides=["teacher.epochs=2"])  # the folders hold epochs 5's keys
    done = migrate.convert(cfg, resolve_data(cfg.data, cfg.test), log=lambda m: None)
    assert "teacher" in done["rerun"] and "data" in done["reused"] and "augment" in done["reused"]
    record = json.loads((tmp_path / "run" / "teacher" / STAGE_FILE).read_text())
    assert record == {"key": LAYOUT1_KEYS["demo"]["teacher"]}  # left as it was: the next run trains it again


def test_a_folder_of_then_under_todays_defaults_trains_its_teacher_again_and_says_so(tmp_path):
    """A layout-1 folder under a config of today's defaults (not AS_THEN): its teacher ran every epoch, which is not
    the work of teacher.patience 1, so it trains again with what is downstream; `run` and `migrate` say so and how to
    keep it, which works after the conversion too; the exports (compress.ship) are new stages, nothing to convert."""
    from recording_stages import RecordingStages

    cfg = layout1_folder("demo", tmp_path, as_then=[])
    run = tmp_path / "run"
    (run / "config.yaml").write_text(json.dumps(typed.to_dict(cfg)))
    with pytest.raises(ConfigError, match=r"its teacher ran every epoch .* teacher.patience is 1, which stops early: "
                                          r"the teacher trains again unless both commands get teacher.patience=null"):
        run_pipeline(cfg, log=lambda m: None, functions=RecordingStages().functions())
    said = []
    done = migrate.migrate(str(run), log=said.append)
    ships = ["compress.ship.teacher", "compress.ship.labels_only", "compress.ship.distilled"]
    assert done == {"reused": ["data", "augment", "dev"], "resumed": [], "rerun": [
        "teacher", "score", "dev.score", "students.labels_only", "students.distilled", *ships, "test"]}
    assert json.loads((run / "teacher" / STAGE_FILE).read_text()) == {"key": LAYOUT1_KEYS["demo"]["teacher"]}
    assert any(m.startswith("[teacher] trained before teacher.patience existed: it ran every epoch") and
               "teacher.patience is 1, today's default, which stops early: it trains again, and every stage after "
               f"it. To keep it: `transferset migrate {run} teacher.patience=null`" in m for m in said)
    assert said[-1].endswith(f"6 to run again (teacher, score, dev.score, students.labels_only, students.distilled, "
                             f"test), 3 that never ran here to run ({', '.join(ships)})")

    said = []  # the way out it names, taken after the conversion
    done = migrate.migrate(str(run), overrides=["teacher.patience=null"], log=said.append)
    assert said[0] == (f"{run}: already layout {keys.LAYOUT}, converted from layout 1: what that conversion left to "
                       "run again and no run has done since is judged again, under this config")
    assert done["rerun"] == [*ships, "test"] and not any("teacher.patience existed" in m for m in said)
    every_epoch = replace(cfg, teacher=replace(cfg.teacher, patience=None))
    assert_converted(every_epoch, "layout1_key", LAYOUT1_KEYS["demo"], only=done["reused"])
    log = []
    run_pipeline(every_epoch, log=log.append, functions=RecordingStages().functions())
    # the exports run, and the test stage, which scores them too
    assert [m.split("]")[0][1:] for m in log if "] running → " in m] == [*ships, "test"]


def test_migrating_again_after_a_run_leaves_what_that_run_wrote(tmp_path):
    """Once a run has trained the teacher again (early stopping), teacher.patience=null keeps nothing of then: the
    teacher there is not the work of null. Records of today's keys are left as they are."""
    from recording_stages import RecordingStages

    cfg = layout1_folder("demo", tmp_path, as_then=[])
    run = tmp_path / "run"
    (run / "config.yaml").write_text(json.dumps(typed.to_dict(cfg)))
    migrate.migrate(str(run), log=lambda m: None)
    (run / "data" / SPLIT_STATS_FILE).write_text(json.dumps({"label_names": ["negative", "positive"]}))
    run_pipeline(cfg, log=lambda m: None, functions=RecordingStages().functions())
    records = {p: p.read_bytes() for p in run.rglob(STAGE_FILE)}
    done = migrate.migrate(str(run), log=lambda m: None)
    assert done["rerun"] == [] and len(done["reused"]) == len(records)
    done = migrate.migrate(str(run), overrides=["teacher.patience=null"], log=lambda m: None)
    assert done["reused"] == ["data", "augment", "dev"] and done["rerun"][0] == "teacher"
    assert {p: p.read_bytes() for p in run.rglob(STAGE_FILE)} == records


def test_a_stage_killed_while_running_keeps_running_under_its_new_key(tmp_path):
    cfg = layout1_folder("demo", tmp_path)
    (tmp_path / "run" / "scored" / STAGE_FILE).write_text(json.dumps({"key": LAYOUT1_KEYS["demo"]["score"],
                                                                      "running": True}))
    (tmp_path / "run" / "scored" / schema.COMPLETE_MARKER).unlink()
    done = migrate.convert(cfg, resolve_data(cfg.data, cfg.test), log=lambda m: None)
    assert done["resumed"] == ["score"]
    record = json.loads((tmp_path / "run" / "scored" / STAGE_FILE).read_text())
    assert record["running"] is True and record["key"] != LAYOUT1_KEYS["demo"]["score"]


def test_migrate_refuses_what_it_cannot_convert(tmp_path):
    with pytest.raises(ConfigError, match="no config.yaml"):
        migrate.migrate(str(tmp_path), log=lambda m: None)
    keys.write_layout(str(tmp_path))
    said = []
    assert migrate.migrate(str(tmp_path), log=said.append)["reused"] == [] and "nothing to convert" in said[0]


def test_a_student_keyed_by_an_earlier_form_and_trainers_finished_before_complete_are_converted(tmp_path):
    """Layout 1 took two more forms as the same work: a student key with the settings added later as None,
    and a teacher or student folder finished before the done file existed (metrics.json, no output record)."""
    from transferset.app.stages.base import stage_key

    cfg = layout1_folder("demo", tmp_path)
    student = {s.name: s for s in migrate.build_plan(cfg, resolve_data(cfg.data, cfg.test), migrate.StageFunctions(),
                                                     rules=rules.V1).stages}["students.distilled"]
    upstream = [LAYOUT1_KEYS["demo"]["score"], LAYOUT1_KEYS["demo"]["dev.score"]]
    earlier = stage_key("student", {**student.settings(), "layer_epochs": None}, upstream)
    (tmp_path / "run" / "students" / "distilled" / STAGE_FILE).write_text(json.dumps({"key": earlier}))
    for folder in ("teacher", "students/labels_only"):
        (tmp_path / "run" / folder / schema.COMPLETE_MARKER).unlink()
        (tmp_path / "run" / folder / schema.METRICS_FILE).write_text("{}")
    done = migrate.convert(cfg, resolve_data(cfg.data, cfg.test), log=lambda m: None)
    assert {"teacher", "students.distilled", "students.labels_only"} <= set(done["reused"])
    # the student's earlier key stands for it downstream, as in layout 1: the test folder written here holds the
    # key made of the student's other key, so it is not that work
    assert done["rerun"] == ["test"]
    assert (tmp_path / "run" / "teacher" / schema.COMPLETE_MARKER).exists()


def test_a_killed_teachers_layout1_checkpoint_is_converted_so_it_resumes(tmp_path):
    """Layout 1 fingerprinted a teacher's checkpoint with its engine and optimizer settings in the flat form, and an
    older checkpoint held the recipe's state as one flat mapping: both are rewritten in today's form."""
    import torch

    from transferset.runtime.typed import to_dict
    from transferset.teacher import train as teacher_train
    from transferset.training.checkpoints import Checkpoints

    # a teacher of then ran every epoch (AS_THEN): its checkpoint is the work of patience null, and has no patience
    cfg = TeacherConfig(epochs=2, patience=None)
    paths = dict(train="t.tsv", dev="d.tsv", output=str(tmp_path / "teacher"))
    today = teacher_train._checkpoints(cfg, paths["train"], paths["dev"], paths["output"])
    settings = {k: v for k, v in to_dict(cfg).items() if k not in teacher_train.RUNTIME_SETTINGS and k != "patience"}
    settings = rules.flat_optim("teacher", settings)  # its lr and weight decay at the top, as before `optim:`
    assert "optim" not in settings and settings["lr"] == 5e-5
    settings.update(rules.flat_form(settings.pop("engine"), to_dict(TeacherConfig().engine), legacy=("warmup",),
                                      ignore=("tracker",)))
    layout1 = {**today.fingerprint, "settings": json.dumps(settings, sort_keys=True, default=str)}
    flat_state = {"phase": 0, "epoch": 1, "batches": 3, "phase_step": 3, "best_state": None, "start_acc": None,
                  "partial": None, "global_step": 9, "history": [{"epoch": 1}], "rng": {"cpu": torch.get_rng_state()}}
    old = Checkpoints(today.folder, layout1)
    old.save(flat_state)
    assert not teacher_train.can_resume(cfg, **paths)  # today's fingerprint is another form

    assert migrate.convert_checkpoint(today.folder, teacher=True)
    assert teacher_train.can_resume(cfg, **paths)
    assert not teacher_train.can_resume(replace(cfg, patience=1), **paths)  # early stopping: other work
    state = today.load()  # the fingerprint inside the state matches too
    assert state["recipe"]["global_step"] == 9 and state["phase"]["index"] == 0 and state["phase"]["batches"] == 3
    assert len(state["rng"]) == 1 and torch.equal(state["rng"][0]["cpu"], flat_state["rng"]["cpu"])
    assert not migrate.convert_checkpoint(str(tmp_path / "none"), teacher=True)


def test_converting_twice_keeps_what_the_first_converted_and_a_stage_of_missing_inputs_is_run_again(tmp_path):
    cfg = layout1_folder("demo", tmp_path)
    files = resolve_data(cfg.data, cfg.test)
    first = migrate.convert(cfg, files, log=lambda m: None)
    assert migrate.convert(cfg, files, log=lambda m: None) == first  # idempotent: a stopped conversion goes on
    # a run killed before its transfer set existed: the stages whose keys read it are run again, nothing fails
    cfg = layout1_folder("demo", tmp_path / "killed")
    for shard in (tmp_path / "killed" / "run" / "transfer" / schema.DATA_DIR).iterdir():
        shard.unlink()
    done = migrate.convert(cfg, resolve_data(cfg.data, cfg.test), log=lambda m: None)
    assert {"data", "teacher", "augment"} <= set(done["reused"]) and "dev" in done["rerun"]


# --- layout 2: the phase plan was `schedule` (now `phases`) -------------------------------------------------

LAYOUT2_CONFIGS = {"demo": "configs/demo.yaml", "demo_tinybert": "configs/demo_tinybert.yaml",
                   "demo_mobilebert": "configs/demo_mobilebert.yaml", "demo_static": "configs/demo_static.yaml"}
# Their layout-2 keys, as the code that wrote layout-2 folders computed them, before the rename:
# the stages above the students are the same four times.
LAYOUT2_SHARED = {"data": "4f8c1e54a44a6ee3", "teacher": "2154693763136436", "augment": "32acd5f743a6ae95",
                  "score": "881dd7c90042b04f", "dev": "a18b68280e7e026c", "dev.score": "1f86b790a7b11610"}
LAYOUT2_KEYS = {
    "demo": {**LAYOUT2_SHARED, "students.labels_only": "2c9ad8fd9dbd0f59", "students.distilled": "89d9d6a7df38038d",
             "test": "3928c172c3e404f6"},
    "demo_tinybert": {**LAYOUT2_SHARED, "layer_texts": "279e9d0499a20299", "students.tinybert3": "620e97b09580e62d",
                      "students.tinybert_narrow": "0edc8229d484c139", "students.logits_only3": "703f31a4209ffaeb",
                      "students.logits_only_narrow": "deb833f5de981352", "test": "f6e5344d384c08f5"},
    "demo_mobilebert": {**LAYOUT2_SHARED, "students.mobilebert3": "70da71c3cff577c7",
                        "students.mobilebert3_joint": "fd9de678d4cea2c3", "students.logits_only3": "9d95e0b2226eb8ef",
                        "test": "79096e2544bfaf0a"},
    "demo_static": {**LAYOUT2_SHARED, "students.labels_only": "2c9ad8fd9dbd0f59",
                    "students.distilled": "89d9d6a7df38038d", "students.static_labels_only": "261ff9a49add121c",
                    "students.static_distilled": "5ac9d607b75d2e42", "test": "8d9431ca9ba78f1a"},
}


# What a config held when its layout-2 keys were written and has changed since (a setting, not a rule).
LAYOUT2_THEN = {"demo_static": ["students.static_distilled.vocab.embed_init=teacher"]}


def layout2_folder(case: str, root: Path):
    """The run folder of LAYOUT2_CONFIGS[case] as layout 2 left it: each stage's folder with its done file and its
    layout-2 key, the layout record, and RUN/config.yaml with the phase plan under its earlier name."""
    write_inputs(root)
    cfg = load_config(LAYOUT2_CONFIGS[case], [f"run_dir={root / 'run'}", f"data={root / 'data'}", "test=null",
                                              *LAYOUT2_THEN.get(case, []), *recipe_then(LAYOUT2_CONFIGS[case]),
                                              *AS_THEN])
    finished(cfg, LAYOUT2_KEYS[case])
    (root / "run" / keys.LAYOUT_FILE).write_text(json.dumps({"layout": 2}))
    written = typed.to_dict(cfg)
    written["students"] = {name: flat_student(s) for name, s in written["students"].items()}  # as layout 2 held them
    for section in written["students"].values():
        section["schedule"] = section.pop("phases")
    (root / "run" / "config.yaml").write_text(json.dumps(written))
    return cfg


def assert_refused_then_reused(cfg, run: Path, field: Optional[str] = None, earlier: Optional[dict] = None) -> None:
    """`run` refuses the earlier layout's folder naming `transferset migrate`; migrate (reading the folder's own
    config.yaml) reuses every stage and, for layouts 2 and 3 (`field`), records each one's `earlier` key under
    `field`; then `run` finds every stage up to date. The students' keys changed (their settings' names or forms are
    in them), and the teacher's (today's holds `patience`, null here, which came after), the stages of settings that
    kept their names and forms did not."""
    from recording_stages import RecordingStages

    with pytest.raises(ConfigError, match=r"transferset migrate .*run"):
        run_pipeline(cfg, log=lambda m: None, functions=RecordingStages().functions())
    done = migrate.migrate(str(run), log=lambda m: None)
    ran = [s for s in plan_stages(cfg, resolve_data(cfg.data, cfg.test)).stages if s.run is not None]
    assert done == {"reused": [s.name for s in ran], "resumed": [], "rerun": []}
    assert keys.read_layout(str(run)) == keys.LAYOUT == 6
    if field is not None:
        new = assert_converted(cfg, field, earlier)
        assert new["data"] == earlier["data"] and new["augment"] == earlier["augment"]
        assert new["teacher"] != earlier["teacher"]
        assert all(new[s.name] != earlier[s.name] for s in ran if s.name.startswith("students."))
    log = []
    run_pipeline(cfg, log=log.append, functions=RecordingStages().functions())
    assert [m for m in log if "] running → " in m or "resuming" in m] == []
    assert sum("up to date" in m for m in log) == len(ran)


@pytest.mark.parametrize("case", sorted(LAYOUT2_KEYS))
def test_a_layout2_folder_is_refused_then_reuses_every_stage_once_migrated(case, tmp_path):
    cfg = layout2_folder(case, tmp_path)  # its config.yaml in the earlier names
    assert_refused_then_reused(cfg, tmp_path / "run", "layout2_key", LAYOUT2_KEYS[case])


def test_a_killed_students_checkpoint_takes_todays_names(tmp_path):
    import torch

    folder = tmp_path / "checkpoint"
    folder.mkdir()
    settings = {"schedule": "two-step", "epochs": 2, "engine": {"schedule": "linear"}}
    torch.save({"recipe": {}, "fingerprint": {"settings": json.dumps(settings), "processes": 1}},
               folder / "state.pt")
    assert migrate.convert_checkpoint(str(folder), teacher=False)
    saved = torch.load(folder / "state.pt", weights_only=True)["fingerprint"]
    # the phase plan renamed; the engine's learning-rate schedule keeps its name
    assert json.loads(saved["settings"]) == {"phases": "two-step", "epochs": 2, "engine": {"schedule": "linear"}}
    assert json.loads((folder / "fingerprint.json").read_text()) == saved
