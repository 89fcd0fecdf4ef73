"""Phase plans (students/phases.py) as pure functions, and the freezing they imply applied to a real student."""
from types import SimpleNamespace

import pytest

from transferset.config import OptimConfig, StudentConfig
import torch

from students.build import FAMILIES
from students.families import GROUPS, frozen_embeddings
from students.families import bilstm, transformer
from students.data import NO_LABEL
from students.losses import LossWeights
from students.phases import coarse, phases, top_down
from students.trainer import fit, set_trainable
from transferset.contract import schema

W = LossWeights(ce=1.0, mse=1.0, repr=0.5)


def test_top_down_unfreezes_head_first_then_encoder_then_embeddings():
    assert top_down(GROUPS) == [("head", "classifier"), ("encoder", "head", "classifier"),
                                ("embeddings", "encoder", "head", "classifier")]


def test_progressive_phases_follow_mukherjee_and_awadallah():
    plan = phases("progressive", W, epochs=4)
    assert [(p.stage, p.trainable, p.weights.active(), p.early_stop, p.labeled_only) for p in plan] == [
        (1, ("embeddings", "encoder", "head"), {"repr": 0.5}, False, False),
        (2, ("head", "classifier"), {"mse": 1.0}, True, False),
        (2, ("encoder", "head", "classifier"), {"mse": 1.0}, True, False),
        (2, GROUPS, {"mse": 1.0}, True, False),
        (3, ("head", "classifier"), {"ce": 1.0}, True, True),
        (3, ("encoder", "head", "classifier"), {"ce": 1.0}, True, True),
        (3, GROUPS, {"ce": 1.0}, True, True),
    ]
    assert all(p.epochs == 4 for p in plan)


def test_progressive_stage2_uses_kd_when_configured_instead_of_mse():
    plan = phases("progressive", LossWeights(kd=2.0, temperature=3.0), epochs=1)
    assert plan[1].weights == LossWeights(kd=2.0, temperature=3.0)
    assert plan[0].weights.active() == {"repr": 1.0} and plan[-1].weights.active() == {"ce": 1.0}


def test_joint_and_distill_then_finetune():
    (joint,) = phases("joint", W, epochs=3)
    assert joint.trainable == GROUPS and joint.weights == W and joint.early_stop and not joint.labeled_only
    (labels_only,) = phases("joint", LossWeights(ce=1.0), epochs=3)
    assert labels_only.labeled_only  # gold CE alone: unlabeled rows would add nothing
    first, second = phases("distill-then-finetune", W, epochs=2)
    assert first.weights.active() == {"mse": 1.0, "repr": 0.5} and not first.labeled_only
    assert second.weights.active() == {"ce": 1.0} and second.labeled_only and second.trainable == GROUPS


def test_an_unknown_phase_plan_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown phase plan .cosine.; known: joint, progressive, distill-then-finetune"):
        phases("cosine", W, epochs=1)


PLUGIN_PLAN = """
from students.losses import LossWeights
from students.phases import Phase, register


@register("kd-then-ce")
def kd_then_ce(weights, epochs, layer_epochs, fine):
    kd = LossWeights(**{k: v for k, v in weights.active().items() if k != "ce"})
    return [Phase(1, "1 kd", kd, fine, epochs, early_stop=False),
            Phase(2, "2 ce", LossWeights(ce=1.0), fine, layer_epochs, early_stop=True, labeled_only=True)]
"""


def test_a_phase_plan_of_another_package_is_found_through_its_entry_point(tmp_path):
    """A package installed beside transferset (a folder on the path with its dist-info, as pip leaves it) registers
    a phase plan under the entry point group transferset.phase_plans: `phases()` builds its phases and the registry
    (what the student's setup checks `phases:` against) lists it after the shipped five, no file of ours changed."""
    import os
    import subprocess
    import sys

    site = tmp_path / "site"
    (site / "tsplan").mkdir(parents=True)
    (site / "tsplan" / "__init__.py").write_text(PLUGIN_PLAN)
    (site / "tsplan-0.1.dist-info").mkdir()
    (site / "tsplan-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: tsplan\nVersion: 0.1\n")
    (site / "tsplan-0.1.dist-info" / "entry_points.txt").write_text("[transferset.phase_plans]\nkd-then-ce = tsplan\n")
    code = ("from students.phases import PLANS, phases; from students.losses import LossWeights; "
            "got = phases('kd-then-ce', LossWeights(ce=1.0, kd=2.0), 3, layer_epochs=2); "
            "print([(p.name, p.weights.active(), p.epochs, p.labeled_only) for p in got]); print(PLANS.names())")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0] == "[('1 kd', {'kd': 2.0}, 3, False), ('2 ce', {'ce': 1.0}, 2, True)]"
    assert lines[1] == str(["joint", "progressive", "distill-then-finetune", "two-step", "pkt", "kd-then-ce"])


def test_phases_is_pure():
    assert phases("progressive", W, 2) == phases("progressive", W, 2)


def _batch(vocab: int, classes: int = 2, hidden: int = 16):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, vocab, (6, 9), generator=g)
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[3:, 5:] = False
    ids[~mask] = 0
    return {"ids": ids, "mask": mask, "type_ids": torch.zeros_like(ids),
            schema.LABEL: torch.tensor([0, 1, NO_LABEL, 1, 0, NO_LABEL]),
            schema.TEACHER_LOGITS: torch.randn(6, classes, generator=g),
            schema.TEACHER_HIDDEN: torch.randn(6, hidden, generator=g)}


@pytest.mark.parametrize("family", ["bilstm", "transformer"])
def test_progressive_freezing_is_exact_and_frozen_params_stay_bit_identical(family):
    from transformers import BertConfig

    torch.manual_seed(0)
    if family == "bilstm":
        model = bilstm.BiLSTM(bilstm.BiLSTMConfig(vocab_size=50, embed_dim=8, hidden=8, head_dim=16))
    else:
        teacher = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                             intermediate_size=32, max_position_embeddings=16)
        model = transformer.make_model(teacher, transformer.TransformerConfig(n_layer=2, init="random"), ["0", "1"])
    cfg = StudentConfig(student=family, optim=OptimConfig(lr=1e-2, weight_decay=0.1), vocab={"freeze_embeddings": False})
    s = SimpleNamespace(cfg=cfg, family=FAMILIES[family], model=model,  # what the loss step needs of a Setup
                        projection=None)
    groups = s.family.param_groups(model)
    # The transformer splits its encoder per layer (for pkt); the other phase plans fold it back.
    assert coarse(tuple(groups)) == GROUPS
    assert tuple(groups)[1:3] == (("encoder.1", "encoder.2") if family == "transformer" else ("encoder", "head"))
    # Every parameter belongs to exactly one group.
    assert sum(len(v) for v in groups.values()) == len(list(model.parameters()))
    assert all(groups[g] for g in groups)
    batch = _batch(50)
    for phase in phases("progressive", LossWeights(ce=1.0, mse=1.0, repr=1.0), epochs=1, groups=tuple(groups)):
        set_trainable(s, phase)
        for name in groups:
            flag = name in phase.trainable
            assert all(p.requires_grad is flag for p in groups[name]), (phase.name, name)
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        fit(s, phase, [batch])  # one step through the recipe, its optimizer over the phase's groups
        after = dict(model.named_parameters())
        frozen = {n for g in groups if g not in phase.trainable for n, p in model.named_parameters()
                  if any(p is q for q in groups[g])}
        for n in frozen:
            assert torch.equal(before[n], after[n].detach()), f"{phase.name}: frozen {n} moved"
        moved = [g for g in phase.trainable if any(not torch.equal(before[n], p.detach())
                                                     for n, p in model.named_parameters()
                                                     if any(p is q for q in groups[g]))]
        expected = list(phase.trainable)
        if family == "transformer" and set(phase.weights.active()) == {"repr"}:
            # The transformer's repr is the last layer's [CLS]: the pooler (head) is not on its path.
            expected.remove("head")
        assert moved == expected, f"{phase.name}: only {moved} learned"


def test_freeze_embeddings_keeps_the_table_fixed_in_every_phase():
    torch.manual_seed(0)
    model = bilstm.BiLSTM(bilstm.BiLSTMConfig(vocab_size=50, embed_dim=8, hidden=8, head_dim=16))
    s = SimpleNamespace(cfg=StudentConfig(optim=OptimConfig(lr=1e-2), vocab={"freeze_embeddings": True}), family=FAMILIES["bilstm"], model=model,
                        projection=None)
    table = model.embed.weight.detach().clone()
    for phase in phases("joint", LossWeights(ce=1.0, mse=1.0), epochs=1) + \
            phases("progressive", LossWeights(ce=1.0, mse=1.0, repr=1.0), epochs=1)[-1:]:
        learn = set_trainable(s, phase)
        assert "embeddings" in phase.trainable and not model.embed.weight.requires_grad
        assert all(p is not model.embed.weight for p in learn)
        lstm = model.lstm.weight_ih_l0.detach().clone()
        fit(s, phase, [_batch(50)])
        assert torch.equal(model.embed.weight, table) and not torch.equal(model.lstm.weight_ih_l0, lstm)


def test_embeddings_are_frozen_by_default_only_for_a_teacher_initialised_bilstm_or_static_student():
    # the families built on the teacher's vectors declare it (Family.teacher_vectors)
    assert frozen_embeddings(StudentConfig()) is True
    assert frozen_embeddings(StudentConfig(student="static")) is True
    assert frozen_embeddings(StudentConfig(student="static", vocab={"embed_init": "random"})) is False
    assert frozen_embeddings(StudentConfig(student="static", vocab={"freeze_embeddings": False})) is False
    assert frozen_embeddings(StudentConfig(vocab={"embed_init": "random"})) is False
    assert frozen_embeddings(StudentConfig(student="transformer")) is False
    assert frozen_embeddings(StudentConfig(vocab={"freeze_embeddings": False})) is False
    assert frozen_embeddings(StudentConfig(student="transformer", vocab={"freeze_embeddings": True})) is True


def test_phase_plans_ask_the_loss_registry_by_role_so_a_registered_loss_takes_its_place():
    from students import losses

    assert losses.of_role(losses.GOLD) == ("ce",)
    assert losses.of_role(losses.PREDICTION) == ("mse", "kd")
    assert losses.of_role(losses.REPRESENTATION) == ("repr", "pkd")
    assert losses.per_pair() == ("hidden_mse", "att_mse", "att_kl", "value_kl")
    with losses._REGISTRY.scratch():  # a package's loss on the teacher's logits, registered by its role
        losses.register("soft_ce", needs=(schema.TEACHER_LOGITS,), role=losses.PREDICTION)(
            lambda out, batch, w: out["logits"].sum())
        losses.register("plain_ce")(lambda out, batch, w: out["logits"].sum())  # reads no teacher column: gold
        assert (losses.get("plain_ce").role, losses.get("soft_ce").role) == (losses.GOLD, losses.PREDICTION)
        plan = phases("two-step", LossWeights(hidden_mse=1.0, soft_ce=2.0), 2)
        # the intermediate step on the layer loss, the prediction step on the registered prediction loss
        assert [p.weights.active() for p in plan] == [{"hidden_mse": 1.0}, {"soft_ce": 2.0}]
    with pytest.raises(ValueError, match="role 'teacher' is not one of gold, prediction, representation, layer"):
        losses.register("odd", role="teacher")
