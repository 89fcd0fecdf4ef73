"""A student family is one registration (students/families/__init__.py `register`): a new one, added here by one module-like
block and no other edit, trains end to end from a scored set, is saved, loaded and predicts; its default
learning rate and the tokens it is built on come from it."""
from dataclasses import asdict, dataclass
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
from transferset import schema
from transferset.config import StudentConfig
from transferset.errors import UserError

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
             param_groups=param_groups, save=save, load=load, default_lr=5e-3, tokens=("wordpiece",))


@pytest.fixture
def registered(monkeypatch):
    """The bag family registered for one test: the registry as it was afterwards."""
    monkeypatch.setattr(families, "_FAMILIES", dict(families._FAMILIES))
    families.register(BAG)


def test_a_registered_family_trains_saves_loads_and_predicts(registered, tmp_path, tiny_scored_dir, sst2_dev200):
    out, m = _run(tmp_path, tiny_scored_dir, sst2_dev200, "--epochs", "2", student="bag", model={"dim": 8})
    assert m["student"] == "bag" and m["model_config"] == {"vocab_size": m["model_config"]["vocab_size"],
                                                           "num_classes": 2, "dim": 8}
    assert [h["epoch"] for h in m["history"]] == [1, 2] and m["train_rows"] == 256
    student = Student.from_pretrained(str(out / schema.STUDENT_MODEL_DIR))
    assert student.family is BAG and isinstance(student.model, Bag)
    logits = student.logits(["a good film", "a dull one", "the story"])
    assert logits.shape == (3, 2) and bool((logits[:, 0] != logits[:, 1]).any())
    assert student.predict(["a good film"]).labels in (["0"], ["1"])


def test_the_default_learning_rate_and_tokens_are_the_familys(registered, tiny_scored_dir):
    s = setup(StudentConfig(student="bag", threads=1), tiny_scored_dir)
    assert make_optimizer(s, list(s.model.parameters())).param_groups[0]["lr"] == 5e-3
    with pytest.raises(UserError, match=r"the bag student is built on `tokens: wordpiece`; drop `tokens: words`"):
        setup(StudentConfig(student="bag", tokens="words"), tiny_scored_dir)


def test_a_family_registered_twice_or_an_unknown_one_is_refused(registered):
    with pytest.raises(ValueError, match="student family 'bag' is already registered"):
        families.register(BAG)
    with pytest.raises(UserError, match=r"unknown student family 'bagg'; known: bag, bilstm, static, transformer"):
        families.get("bagg")
