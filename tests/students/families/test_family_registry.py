"""A student family is one registration (students/families/__init__.py `register`): a new one, added here by one module-like
block and no other edit, trains end to end from a scored set, is saved, loaded and predicts; its default
learning rate, its engine, the tokens it is built on and what it can do (layer losses, a table of the teacher's
vectors) come from it."""
from dataclasses import asdict, dataclass
import json
import os

import pytest
import torch
import torch.nn as nn

from students import families
from students.build import setup
from students.data.tokens import load_tokens, teacher_wordpiece
from students.families import Built, Context, Family
from students.student import Student
from students.trainer import make_optimizer
from transferset.config import StudentConfig, StudentEngineConfig
from transferset.contract import schema
from transferset.runtime import typed
from transferset.runtime.errors import UserError
from transferset.runtime.registry import RegistryError

from test_trainer import _run


@dataclass
class BagConfig:
    vocab_size: int
    num_classes: int
    dim: int = 16  # embedding width


class Bag(nn.Module):
    """The mean of a row's token embeddings → a dense layer → the classifier."""

    def __init__(self, config: BagConfig):
        super().__init__()
        self.embed = nn.Embedding(config.vocab_size, config.dim)
        self.mix = nn.Linear(config.dim, config.dim)
        self.head = nn.Linear(config.dim, config.dim)
        self.classifier = nn.Linear(config.dim, config.num_classes)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> dict:
        m = mask.unsqueeze(-1).float()                                           # (B, T, 1)
        pooled = (self.embed(ids) * m).sum(1) / m.sum(1).clamp_min(1.0)          # (B, D)
        rep = torch.relu(self.head(torch.relu(self.mix(pooled))))               # (B, D)
        return {"logits": self.classifier(rep), "repr": rep}


def build(ctx: Context) -> Built:
    tokens = teacher_wordpiece(ctx.cfg, ctx.meta, ctx.max_length)
    config = BagConfig(tokens.vocab_size, len(ctx.label_names), **ctx.cfg.model)
    return Built(Bag(config), tokens, config, config.dim, [])


def param_groups(model: Bag) -> dict:
    return {"embeddings": list(model.embed.parameters()), "encoder": list(model.mix.parameters()),
            "head": list(model.head.parameters()), "classifier": list(model.classifier.parameters())}


def save(model_dir: str, model: Bag, tokens) -> dict:
    torch.save(model.state_dict(), os.path.join(model_dir, "bag.pt"))
    return {"tokens": tokens.save(model_dir)}


def load(model_dir: str, sidecar: dict):
    config = BagConfig(**sidecar["model"])
    model = Bag(config)
    model.load_state_dict(torch.load(os.path.join(model_dir, "bag.pt")))
    return model, load_tokens(model_dir, sidecar["tokens"]), config


BAG = Family("bag", build=build, forward=lambda model, batch: model(batch["ids"], batch["mask"]),
             param_groups=param_groups, save=save, load=load, default_lr=5e-3, tokens=("wordpiece",),
             engine={"schedule": "cosine", "warmup": 0.25})


@pytest.fixture
def registered():
    """The bag family registered for one test: the registry as it was afterwards."""
    with families.FAMILIES.scratch():
        families.register(BAG)
        yield


def test_a_registered_family_trains_saves_loads_and_predicts(registered, tmp_path, tiny_scored_dir, sst2_dev200):
    out, m = _run(tmp_path, tiny_scored_dir, sst2_dev200, "--epochs", "2", student="bag", model={"dim": 8})
    assert m["student"] == "bag" and m["model_config"] == {"vocab_size": m["model_config"]["vocab_size"],
                                                           "num_classes": 2, "dim": 8}
    assert [h["epoch"] for h in m["history"]] == [1, 2] and m["train_rows"] == 256
    assert (m["config"]["engine"]["schedule"], m["config"]["engine"]["warmup"]) == ("cosine", 0.25)  # the family's
    student = Student.from_pretrained(str(out / schema.STUDENT_MODEL_DIR))
    assert student.family is BAG and isinstance(student.model, Bag)
    logits = student.logits(["a good film", "a dull one", "the story"])
    assert logits.shape == (3, 2) and bool((logits[:, 0] != logits[:, 1]).any())
    assert student.predict(["a good film"]).labels in (["0"], ["1"])


def test_the_default_learning_rate_engine_tokens_and_capabilities_are_the_familys(registered, tiny_scored_dir):
    s = setup(StudentConfig(student="bag", threads=1), tiny_scored_dir)
    assert make_optimizer(s, list(s.model.parameters())).param_groups[0]["lr"] == 5e-3
    # the engine fields the settings leave unset are the family's; one given is kept
    assert (s.cfg.engine.schedule, s.cfg.engine.warmup) == ("cosine", 0.25)
    given = families.settled(StudentConfig(student="bag", engine=StudentEngineConfig(warmup=0.5)))
    assert (given.engine.schedule, given.engine.warmup) == ("cosine", 0.5)
    assert families.settled(given) is given  # settled twice: unchanged
    assert len({families.get("bag"), families.get("bilstm"), families.get("bag")}) == 2  # hashable, its engine too
    # a family declaring none trains at a constant rate, however the config is made (the transformer)
    for cfg in (StudentConfig(student="transformer"), typed.load(StudentConfig, {"student": "transformer"}, "student")):
        assert (families.settled(cfg).engine.schedule, families.settled(cfg).engine.warmup) == ("constant", 0.0)
    # no layer losses and no teacher's vectors declared: a layer loss is refused, the table learns
    assert not families.frozen_embeddings(s.cfg)
    with pytest.raises(UserError, match="a bag student has neither"):
        setup(StudentConfig(student="bag", losses={"ce": 1.0, "mse": 1.0, "hidden_mse": 1.0}, phases="two-step"), tiny_scored_dir)
    with pytest.raises(UserError, match=r"the bag student is built on `vocab: {tokens: wordpiece}`; drop `vocab: {tokens: words}`"):
        setup(StudentConfig(student="bag", vocab={"tokens": "words"}), tiny_scored_dir)


def test_a_family_registered_twice_or_an_unknown_one_is_refused(registered):
    with pytest.raises(RegistryError, match="student family 'bag' is already registered"):
        families.register(BAG)
    with pytest.raises(UserError, match=r"unknown student family 'bagg'; known: bag, bilstm, static, transformer"):
        families.get("bagg")


# A package outside this repository: a family and a loss, each registered by its module, found through entry points.
PLUGIN_FAMILY = '''
import os
from dataclasses import dataclass

import torch
import torch.nn as nn

from students.data.tokens import load_tokens, teacher_wordpiece
from students.families import Built, Family, register


@dataclass
class MeanConfig:
    vocab_size: int
    num_classes: int
    dim: int = 8


class Mean(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed = nn.Embedding(config.vocab_size, config.dim)
        self.classifier = nn.Linear(config.dim, config.num_classes)

    def forward(self, ids, mask):
        m = mask.unsqueeze(-1).float()
        pooled = (self.embed(ids) * m).sum(1) / m.sum(1).clamp_min(1.0)
        return {"logits": self.classifier(pooled), "repr": pooled}


def build(ctx):
    tokens = teacher_wordpiece(ctx.cfg, ctx.meta, ctx.max_length)
    config = MeanConfig(tokens.vocab_size, len(ctx.label_names), **ctx.cfg.model)
    return Built(Mean(config), tokens, config, config.dim, [])


def save(model_dir, model, tokens):
    torch.save(model.state_dict(), os.path.join(model_dir, "mean.pt"))
    return {"tokens": tokens.save(model_dir)}


def load(model_dir, sidecar):
    config = MeanConfig(**sidecar["model"])
    model = Mean(config)
    model.load_state_dict(torch.load(os.path.join(model_dir, "mean.pt")))
    return model, load_tokens(model_dir, sidecar["tokens"]), config


register(Family("mean_bag", build=build, forward=lambda model, batch: model(batch["ids"], batch["mask"]),
                param_groups=lambda m: {"embeddings": list(m.embed.parameters()),
                                        "classifier": list(m.classifier.parameters())},
                save=save, load=load, default_lr=5e-3, tokens=("wordpiece",),
                engine={"schedule": "cosine", "warmup": 0.2}))
'''
PLUGIN_LOSS = '''
from students.losses import register
from transferset.contract import schema


@register("plugin_l1", needs=(schema.TEACHER_LOGITS,))
def plugin_l1(outputs, batch, weights):
    return (outputs["logits"] - batch[schema.TEACHER_LOGITS]).abs().mean()
'''


def test_a_family_and_a_loss_of_another_package_train_save_load_and_predict_through_entry_points(
        tmp_path, tiny_scored_dir, sst2_dev200):
    """The extension points hold with no repository file changed: a package installed beside transferset (a
    folder on the path with its dist-info, as pip leaves it) declares its family and loss as entry points."""
    import subprocess
    import sys
    from pathlib import Path

    site = tmp_path / "site"
    (site / "tsplugin").mkdir(parents=True)
    (site / "tsplugin" / "__init__.py").write_text("")
    (site / "tsplugin" / "family.py").write_text(PLUGIN_FAMILY)
    (site / "tsplugin" / "loss.py").write_text(PLUGIN_LOSS)
    (site / "tsplugin-0.1.dist-info").mkdir()
    (site / "tsplugin-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: tsplugin\nVersion: 0.1\n")
    (site / "tsplugin-0.1.dist-info" / "entry_points.txt").write_text(
        "[transferset.families]\nmean_bag = tsplugin.family\n\n[transferset.losses]\nplugin_l1 = tsplugin.loss\n")
    config = tmp_path / "student.yaml"
    config.write_text("student: mean_bag\nlosses: {plugin_l1: 1.0}\nepochs: 2\nthreads: 1\n"
                      "report: {latency_examples: 8}\nmodel: {dim: 8}\n")
    texts = tmp_path / "texts.tsv"
    texts.write_text("sentence\na gripping film\ndull and long\n")
    cli = str(Path(sys.executable).parent / "transferset")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)}

    def transferset(*args, environ=env):
        return subprocess.run([cli, *args], env=environ, capture_output=True, text=True, timeout=300)

    train = ["train", "--transfer", tiny_scored_dir, "--dev", sst2_dev200, "--config", str(config), "--no-progress"]
    done = transferset(*train, "--output", str(tmp_path / "student"))
    assert done.returncode == 0, done.stderr[-2000:]
    m = json.loads((tmp_path / "student" / schema.METRICS_FILE).read_text())
    assert m["student"] == "mean_bag" and [set(h["losses"]) for h in m["history"]] == [{"plugin_l1"}] * 2
    assert m["config"]["engine"]["schedule"] == "cosine" and m["config"]["engine"]["warmup"] == 0.2  # its engine
    done = transferset("predict", "--model", str(tmp_path / "student"), "--input", str(texts), "--output",
                       str(tmp_path / "pred"), "--format", "jsonl")
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for f in sorted((tmp_path / "pred" / "data").glob("*.jsonl"))
            for line in f.read_text().splitlines()]
    assert [r["text"] for r in rows] == ["a gripping film", "dull and long"]
    assert all(r["predicted_label"] in ("0", "1") and abs(r["prob_0"] + r["prob_1"] - 1) < 1e-5 for r in rows)
    # without the package on the path, the family is unknown: one line naming the known ones
    plain = {**os.environ}
    done = transferset(*train, "--output", str(tmp_path / "none"), environ=plain)
    assert done.returncode == 2 and "unknown student family 'mean_bag'; known: " in done.stderr
