"""A loss is one registration (students/losses/__init__.py): a new one, added here by one module-like block and no other
edit, is set under a student's `losses:` and trains end to end; unknown names and settings are refused."""
from dataclasses import dataclass

import pytest
import torch

from students import losses
from students.losses import LossWeights
from transferset.config import StudentConfig
from transferset.contract import schema
from transferset.runtime.errors import UserError
from transferset.runtime.registry import RegistryError

from test_trainer import _run

SEEN: list[float] = []


@dataclass(frozen=True)
class L1Settings:
    scale: float = 1.0  # what the term is multiplied by


def logit_l1(outputs, batch, weights: LossWeights) -> torch.Tensor:
    """Mean absolute difference of student and teacher logits (times its `scale` setting)."""
    scale = weights.settings("logit_l1").scale
    SEEN.append(scale)
    return scale * (outputs["logits"] - batch[schema.TEACHER_LOGITS]).abs().mean()


@pytest.fixture
def registered():
    """logit_l1 registered for one test: the registry as it was afterwards."""
    with losses._REGISTRY.scratch():
        losses.register("logit_l1", needs=(schema.TEACHER_LOGITS,), settings=L1Settings)(logit_l1)
        SEEN.clear()
        yield


def test_a_registered_loss_trains_a_student_end_to_end(registered, tmp_path, tiny_scored_dir, sst2_dev200):
    out, m = _run(tmp_path, tiny_scored_dir, sst2_dev200, "--epochs", "2",
                  losses={"logit_l1": {"weight": 1.0, "scale": 2.0}}, model={"embed_dim": 16, "hidden": 16})
    assert [set(h["losses"]) for h in m["history"]] == [{"logit_l1"}, {"logit_l1"}]
    assert SEEN and set(SEEN) == {2.0}  # its setting reached it, every step
    assert m["train_rows"] == 256 and (out / schema.STUDENT_MODEL_DIR / schema.WEIGHTS_FILE).exists()


def test_combine_adds_a_registered_loss_by_its_weight(registered):
    logits, teacher = torch.tensor([[1.0, -1.0]]), torch.tensor([[0.0, 0.0]])
    batch = {schema.LABEL: torch.tensor([0]), schema.TEACHER_LOGITS: teacher}
    w = LossWeights.of(StudentConfig(losses={"mse": 1.0, "logit_l1": 0.5}))
    total, parts = losses.combine({"logits": logits}, batch, w)
    assert parts == {"mse": pytest.approx(1.0), "logit_l1": pytest.approx(1.0)}
    assert total.item() == pytest.approx(1.0 + 0.5 * 1.0)


def test_registering_twice_and_unknown_names_or_settings_are_refused(registered):
    with pytest.raises(RegistryError, match="'logit_l1' is already registered"):
        losses.register("logit_l1")(logit_l1)
    with pytest.raises(UserError, match=r"unknown loss 'nope'; known: .*kd.*logit_l1"):
        LossWeights.of(StudentConfig(losses={"nope": 1.0}))
    with pytest.raises(UserError, match=r"unknown setting\(s\) \['scael'\] of loss logit_l1; known: \['weight', 'scale'\]"):
        losses.check({"logit_l1": {"weight": 1.0, "scael": 2}}, "students.x.losses")
    with pytest.raises(UserError, match=r"students.x.losses: losses: \{kd: .*\}: temperature 0: a number above 0"):
        losses.check({"kd": {"weight": 1.0, "temperature": 0}}, "students.x.losses")
    with pytest.raises(UserError, match="the weight must be a number >= 0"):
        losses.check({"logit_l1": {"scale": 2}}, "students.x.losses")


def test_the_builtin_losses_are_set_as_any_other_in_their_order():
    assert losses.names()[:5] == ["ce", "mse", "kd", "repr", "pkd"]
    w = LossWeights.of(StudentConfig(losses={"hidden_mse": 1, "kd": {"weight": 2.0, "temperature": 3.0}, "ce": 0.5}))
    assert w.active() == {"ce": 0.5, "kd": 2.0, "hidden_mse": 1.0} and w.temperature == 3.0  # the registry's order
    assert w.layer_active() == {"hidden_mse": 1.0} and w.kd == 2.0 and w.cos == 0.0 and w.mse == 0.0
    assert LossWeights.of(StudentConfig()).active() == {"ce": 1.0, "mse": 1.0}  # `losses:` unset: Tang's pair


def test_canonical_losses_are_one_form_whatever_the_spelling():
    one = losses.canonical({"kd": 1, "ce": 0.0, "mse": {"weight": 0.5}})
    other = losses.canonical({"mse": 0.5, "kd": {"weight": 1.0, "temperature": 1.0}, "repr": {"weight": 0}})
    assert one == other == {"kd": {"weight": 1.0, "temperature": 1.0}, "mse": {"weight": 0.5}}


def test_a_loss_whose_batch_key_is_missing_says_which(registered):
    w = LossWeights.of(StudentConfig(losses={"logit_l1": 1.0}))
    with pytest.raises(ValueError, match=r"loss logit_l1 reads \['teacher_logits'\] of the batch, which has \['label'\]"):
        losses.combine({"logits": torch.zeros(1, 2)}, {schema.LABEL: torch.tensor([0])}, w)
