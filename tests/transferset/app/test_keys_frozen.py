"""Old run directories keep their keys: the stage keys of the shipped configs, written down with the code of
7b25072 (before the key rules became one table, transferset/app/keys.py), are each a key or a legacy key of
today's code for the same config, with the stored keys standing for their folders downstream as run_stages does.

Every input a key reads is written here with fixed content (the data folder, the carved validation split,
the transfer set's labels), so a key depends on the config and the key rules only, never on the machine."""

from __future__ import annotations

from pathlib import Path

import pytest

import pyarrow.parquet as pq

from transferset import schema
from transferset.app.runner import load_config, plan_stages, resolve_data

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


def as_trained_then(config: str, overrides=()) -> list[str]:
    """`overrides` and, for each student of the config, the constant learning rate every student trained at
    when FROZEN was written (the default until issue 44 made it a linear warm-up and decay)."""
    cfg = load_config(config, ["test=null", *overrides])
    pinned = [f"students.{name}.engine.{k}={v}" for name in cfg.students for k, v in (("schedule", "constant"),
                                                                                       ("warmup", 0))]
    return [*overrides, *pinned]


def stage_keys(config: str, overrides=(), *, root: Path, stored=None) -> dict[str, tuple[str, tuple[str, ...]]]:
    """{stage: (its key, its legacy keys)} of a config run in root/run on root/data. `stored`: the keys an
    earlier run's folders hold, by stage, which stand for them downstream (as run_stages does when it
    reuses a folder); without it, each stage's own key does."""
    write_inputs(root)
    cfg = load_config(config, [f"run_dir={root / 'run'}", f"data={root / 'data'}", "test=null", *overrides])
    keys: dict[str, str] = {}
    out = {}
    for s in plan_stages(cfg, resolve_data(cfg.data, cfg.test)).stages:
        key, legacy = s.keys([keys[u] for u in s.upstream])
        out[s.name] = (key, legacy)
        keys[s.name] = stored[s.name] if stored else key
    return out


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

# The keys 7b25072 computes for CASES (tests/transferset/app/stage_keys of this file, run at that commit).
FROZEN = {
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


def test_the_cases_cover_every_shipped_config():
    shipped = {p.name for p in Path("configs").glob("*.yaml")}
    assert shipped <= {Path(c).name for c, _ in CASES.values()}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_run_directory_written_before_the_key_table_keeps_every_stage(case, tmp_path):
    config, overrides = CASES[case]
    frozen = FROZEN[case]
    now = stage_keys(config, as_trained_then(config, overrides), root=tmp_path, stored=frozen)
    assert list(now) == list(frozen)
    stale = {name: key for name, key in frozen.items() if key not in (now[name][0], *now[name][1])}
    assert stale == {}
    # At today's default schedule each BiLSTM student is trained anew (a linear warm-up and decay, issue 44),
    # and nothing else is
    now = stage_keys(config, overrides, root=tmp_path, stored=frozen)
    stale = {name for name, key in frozen.items() if key not in (now[name][0], *now[name][1])}
    students = load_config(config, ["test=null", *overrides]).students
    assert stale == {f"students.{name}" for name, s in students.items() if s.student == "bilstm"}


INSTALL_AND_KEYS = '''
import json, sys, tempfile
from dataclasses import dataclass, fields
from pathlib import Path

from transferset.augment import register
from transferset.augment.registry import SEQUENCE


@dataclass(frozen=True)
class ShoutSettings:
    shout_times: int = 2  # a setting of the new op, at its default in every config


@register("shout", kind=SEQUENCE, settings=ShoutSettings)
def shout(*, words, rng, shout_times):
    return [w.upper() for w in words]


from students import losses  # noqa: E402

losses.register("zero_loss")(lambda outputs, batch, weights: outputs["logits"].sum() * 0.0)

from transferset.config import AugmentConfig  # noqa: E402  (made of the installed ops' settings, shout's too)

assert "shout_times" in {f.name for f in fields(AugmentConfig)}
sys.path.insert(0, "tests/transferset/app")
import test_keys_frozen as t  # noqa: E402

out = {}
for case in sys.argv[1:]:
    with tempfile.TemporaryDirectory() as d:
        config, overrides = t.CASES[case]
        keys = t.stage_keys(config, t.as_trained_then(config, overrides), root=Path(d))
        out[case] = {name: key for name, (key, _) in keys.items()}
print(json.dumps(out))
'''


def test_installing_an_op_and_registering_a_loss_change_no_key():
    """An op installed before the config is imported (as an entry point's is) adds its settings to AugmentConfig,
    and a loss registered by another module is one more name; at their defaults neither is in any key."""
    import json
    import subprocess
    import sys

    cases = ["demo", "demo_tinybert", "sst2_lowres"]
    done = subprocess.run([sys.executable, "-c", INSTALL_AND_KEYS, *cases], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    keys = json.loads(done.stdout.strip().splitlines()[-1])
    assert keys == {case: FROZEN[case] for case in cases}


@pytest.mark.parametrize("case", ["demo", "demo_ensemble", "demo_compress"])
def test_a_run_directory_written_before_is_reused_stage_by_stage(case, tmp_path):
    """The run directory of a config as 7b25072 left it (each folder: its done file and the key of FROZEN) is
    reused by today's run: no stage runs again."""
    import json

    from test_runner import RecordingStages
    from transferset.app.runner import STAGE_FILE, load_config, plan_stages, resolve_data, run_pipeline

    config, overrides = CASES[case]
    write_inputs(tmp_path)
    cfg = load_config(config, [f"run_dir={tmp_path / 'run'}", f"data={tmp_path / 'data'}", "test=null",
                               *as_trained_then(config, overrides)])
    for s in plan_stages(cfg, resolve_data(cfg.data, cfg.test)).stages:
        if s.run is not None:
            folder = Path(s.folder)
            (folder / s.done_file).parent.mkdir(parents=True, exist_ok=True)
            if not (folder / s.done_file).exists():
                (folder / s.done_file).write_text("{}")
            (folder / STAGE_FILE).write_text(json.dumps({"key": FROZEN[case][s.name]}))
    log = []
    run_pipeline(cfg, log=log.append, functions=RecordingStages().functions())
    assert [m for m in log if "] running → " in m or "resuming" in m] == []
    assert sum("up to date" in m for m in log) == sum(1 for s in plan_stages(cfg, resolve_data(cfg.data, cfg.test)).stages
                                                       if s.run is not None)
