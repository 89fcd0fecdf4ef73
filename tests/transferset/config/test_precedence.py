"""One order for every student setting (transferset/config/precedence.py): default < preset < file < flags <
key=value. A test per layer, each showing it over the layer below, through the paths a user's settings take:
`transferset train`'s parser and load_config, `transferset run`'s load_config (its YAML and key=value) and the
starter `transferset init` writes."""
import os
from types import SimpleNamespace

import torch
import yaml

from students import trainer
from students.families import get as family
from students.families import settled
from students.losses import LossWeights
from transferset.app import cli
from transferset.app.cli import train
from transferset.app.run import init, runner
from transferset.config import STUDENT_LAYERS, STUDENT_PRESETS, RunConfig, StudentConfig
from transferset.runtime import typed

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
TINYBERT = {"preset": "tinybert", "losses": {"kd": 2.0}, "optim": {"lr": 1e-3}, "engine": {"warmup": 0.2}}  # over a preset


def _train(tmp_path, *argv: str, config=None) -> StudentConfig:
    """The StudentConfig `transferset train ... ARGV` trains with (its own parser and load_config, then settled
    as its job settles it: the family's engine where the layers leave it unset)."""
    _, parser, _ = cli.build_subparser("train")
    words = ["--transfer", "scored", "--dev", "dev.tsv", "--output", "out"]
    if config is not None:
        path = tmp_path / "student.yaml"
        path.write_text(yaml.safe_dump(config), encoding="utf-8")
        words += ["--config", str(path)]
    return settled(train.load_config(parser.parse_args([*words, *argv])))


def _trained_lr(cfg: StudentConfig) -> float:
    """The learning rate the trainer's optimizer takes for `cfg` (its family's default when `lr` is null)."""
    setup = SimpleNamespace(cfg=cfg, family=family(cfg.student), model=torch.nn.Linear(2, 2))
    return trainer.make_optimizer(setup, list(setup.model.parameters())).param_groups[0]["lr"]


def test_the_order_is_written_once_and_the_configuration_page_states_it():
    assert [name for name, _ in STUDENT_LAYERS] == ["default", "preset", "file", "flags", "key=value"]
    with open(os.path.join(ROOT, "docs", "configuration.md"), encoding="utf-8") as fh:
        page = " ".join(fh.read().split())
    assert "default < preset < file < flags < key=value" in page
    assert all(" ".join(what.split()) in page for _, what in STUDENT_LAYERS)


def test_default_layer_the_family_sets_the_engine_and_the_learning_rate(tmp_path):
    bilstm, transformer = _train(tmp_path), _train(tmp_path, "--student", "transformer")
    assert (bilstm.engine.schedule, bilstm.engine.warmup) == ("linear", 0.1)
    assert (transformer.engine.schedule, transformer.engine.warmup) == ("constant", 0.0)
    assert bilstm.optim.lr is None and transformer.optim.lr is None  # null: the family's, read where the optimizer is made
    assert (_trained_lr(bilstm), _trained_lr(transformer)) == (2e-3, 1e-4)
    # the page states the families' rates as the families hold them
    assert family("static").default_lr == 2e-3 and "BiLSTM and static 2e-3, transformer 1e-4" in STUDENT_LAYERS[0][1]
    assert bilstm.losses == {"ce": 1.0, "mse": 1.0}  # the setting's own default: no layer names a loss


def test_the_presets_are_the_yaml_files_of_the_presets_folder_each_a_valid_layer():
    folder = os.path.join(ROOT, "transferset", "config", "presets")
    files = sorted(name[:-len(".yaml")] for name in os.listdir(folder) if name.endswith(".yaml"))
    assert list(STUDENT_PRESETS) == files == ["distilbert", "minilm", "mobilebert", "pkd", "tinybert"]
    for name, settings in STUDENT_PRESETS.items():
        with open(os.path.join(folder, f"{name}.yaml"), encoding="utf-8") as fh:
            text = fh.read()
        assert text.startswith("# ") and typed.yaml_load(text) == settings  # its paper first, then its settings
        cfg = typed.load(StudentConfig, {"preset": name}, "student")  # every setting a StudentConfig field
        assert cfg.student == "transformer" and all(getattr(cfg, k) == v for k, v in settings.items() if k != "losses")
        assert LossWeights.of(cfg).active() == {k: cfg.weight(k) for k in settings["losses"]}  # its losses alone
    assert STUDENT_PRESETS["pkd"] == {"student": "transformer", "phases": "joint",
                                      "losses": {"ce": 0.3, "kd": {"weight": 0.7, "temperature": 5.0}, "pkd": 100.0}}


def test_preset_layer_over_the_default(tmp_path, monkeypatch):
    cfg = _train(tmp_path, "--preset", "tinybert")
    # the preset chooses the family (over the default bilstm), so the family's defaults are the transformer's
    assert (cfg.student, cfg.phases, cfg.weight("kd"), cfg.weight("att_mse")) == ("transformer", "two-step", 1.0, 1.0)
    assert cfg.weight("ce") == cfg.weight("mse") == 0.0  # a preset's losses are all it trains on
    assert cfg.engine.schedule == "constant"
    # a preset that sets the learning rate and part of the engine: over the family's, the rest of the engine kept
    monkeypatch.setitem(STUDENT_PRESETS, "slow", {"optim": {"lr": 3e-4}, "engine": {"warmup": 0.05}})
    slow = _train(tmp_path, "--preset", "slow")
    assert (slow.student, _trained_lr(slow), slow.engine.schedule, slow.engine.warmup) == ("bilstm", 3e-4, "linear", 0.05)


def test_file_layer_over_the_preset(tmp_path):
    cfg = _train(tmp_path, config=TINYBERT)
    assert (cfg.weight("kd"), cfg.optim.lr, cfg.engine.warmup) == (2.0, 1e-3, 0.2)
    # the layers below: the preset's other losses, and kd's temperature (a loss merges setting by setting)
    assert (cfg.student, cfg.weight("att_mse"), cfg.engine.schedule) == ("transformer", 1.0, "constant")
    assert cfg.losses["kd"] == {"weight": 2.0, "temperature": 1.0}


def test_flags_layer_over_the_file(tmp_path):
    cfg = _train(tmp_path, "--epochs", "3", "--lr", "5e-4", "--warmup", "0.3", "--schedule", "cosine",
                 config={**TINYBERT, "epochs": 7})
    assert (cfg.epochs, cfg.optim.lr, cfg.engine.warmup, cfg.engine.schedule) == (3, 5e-4, 0.3, "cosine")
    assert cfg.weight("att_mse") == 1.0 and cfg.weight("kd") == 2.0 and cfg.preset == "tinybert"


def test_key_value_layer_over_the_flags(tmp_path):
    cfg = _train(tmp_path, "--lr", "5e-4", "--warmup", "0.3", "losses.kd=4", "optim.lr=2e-4", "engine.warmup=0.4",
                 "model.n_layer=2", "losses.kd.temperature=3", config={**TINYBERT, "losses": {"kd": {"weight": 2.0}}})
    assert (cfg.weight("kd"), cfg.optim.lr, cfg.engine.warmup, cfg.model) == (4.0, 2e-4, 0.4, {"n_layer": 2})
    assert LossWeights.of(cfg).temperature == 3.0
    assert cfg.engine.schedule == "constant"  # a section merges key by key: the family's schedule stays


def test_run_takes_the_same_order(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"data": str(tmp_path), "students": {"tiny": TINYBERT, "plain": {}}}))
    cfg = runner.load_config(str(path), ["students.tiny.losses.kd=4", "students.tiny.engine.warmup=0.4",
                                         "students.plain.optim.lr=2e-4"])
    tiny, plain = settled(cfg.students["tiny"]), settled(cfg.students["plain"])
    assert (tiny.weight("kd"), tiny.optim.lr, tiny.engine.warmup, tiny.weight("att_mse"), tiny.engine.schedule) == \
        (4.0, 1e-3, 0.4, 1.0, "constant")
    assert (plain.student, plain.optim.lr, plain.engine.schedule, plain.engine.warmup) == ("bilstm", 2e-4, "linear", 0.1)


def test_the_starter_is_a_file_layer_of_the_same_order(tmp_path):
    data = tmp_path / "reviews.tsv"
    data.write_text("sentence\tlabel\ngood\t1\nbad\t0\n", encoding="utf-8")
    written = settled(typed.load(RunConfig, init.starter(str(data)), where="starter").students["distilled"])
    weights = LossWeights.of(written)
    assert (weights.active(), weights.temperature, written.engine.schedule) == ({"kd": 1.0}, 2.0, "linear")  # file, default
    assert (written.preset, written.model) == (None, {"shape": "tang"})  # a BiLSTM's named shape, applied at build
    ran = runner.load_config(None, ["students.distilled.losses.kd=0.5"], data={"data": str(data)}).students["distilled"]
    assert LossWeights.of(ran).active() == {"kd": 0.5} and LossWeights.of(ran).temperature == 2.0  # its weight alone
