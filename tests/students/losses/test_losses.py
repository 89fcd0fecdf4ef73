"""Each loss against its formula, computed by hand on fixed tensors."""
import math

import pytest
import torch

from students import losses
from students.data import NO_LABEL, TEACHER_LAYERS
from students.losses import LossWeights
from transferset.contract import schema

S = torch.tensor([[2.0, -1.0, 0.5], [0.0, 1.0, -2.0]])
T = torch.tensor([[1.0, 0.0, 0.0], [-1.0, 2.0, 1.0]])


def _softmax(row, temp=1.0):
    e = [math.exp(v / temp) for v in row]
    return [v / sum(e) for v in e]


def test_ce_averages_over_labeled_rows_only():
    labels = torch.tensor([0, NO_LABEL])
    expected = -math.log(_softmax(S[0].tolist())[0])  # row 2 has no gold label
    assert losses.ce(S, labels).item() == pytest.approx(expected, rel=1e-6)


def test_ce_without_any_label_is_zero_and_differentiable():
    s = S.clone().requires_grad_(True)
    value = losses.ce(s, torch.tensor([NO_LABEL, NO_LABEL]))
    value.backward()
    assert value.item() == 0.0
    assert torch.equal(s.grad, torch.zeros_like(s))


def test_logits_mse_is_mean_squared_difference():
    diffs = [(a - b) ** 2 for rs, rt in zip(S.tolist(), T.tolist()) for a, b in zip(rs, rt)]
    assert losses.logits_mse(S, T).item() == pytest.approx(sum(diffs) / 6, rel=1e-6)  # = 22.25 / 6


@pytest.mark.parametrize("temp", [1.0, 2.0, 4.0])
def test_kd_is_kl_teacher_to_student_times_t_squared(temp):
    total = 0.0
    for rs, rt in zip(S.tolist(), T.tolist()):
        p_t, p_s = _softmax(rt, temp), _softmax(rs, temp)
        total += sum(pt * (math.log(pt) - math.log(ps)) for pt, ps in zip(p_t, p_s))
    expected = total / 2 * temp * temp
    assert losses.kd_kl(S, T, temp).item() == pytest.approx(expected, rel=1e-5)


def test_kd_is_zero_when_student_matches_teacher_and_asymmetric_otherwise():
    assert losses.kd_kl(T, T, 2.0).item() == pytest.approx(0.0, abs=1e-7)
    assert losses.kd_kl(S, T, 1.0).item() != pytest.approx(losses.kd_kl(T, S, 1.0).item(), rel=1e-3)


def test_repr_mse_casts_fp16_teacher_states():
    s = torch.tensor([[0.5, 1.0], [2.0, -1.0]])
    t = torch.tensor([[0.0, 1.0], [1.0, 1.0]], dtype=torch.float16)
    assert losses.repr_mse(s, t).item() == pytest.approx((0.25 + 0 + 1 + 4) / 4, rel=1e-6)


def test_pkd_is_squared_distance_of_unit_vectors_mean_over_rows_and_layers():
    s = torch.tensor([[[3.0, 4.0], [1.0, 0.0]], [[0.0, 2.0], [1.0, 1.0]]])   # (B=2, L=2, H=2)
    t = torch.tensor([[[4.0, 3.0], [0.0, 5.0]], [[0.0, 7.0], [-1.0, -1.0]]])
    def unit(v):
        n = math.hypot(*v)
        return [x / n for x in v]
    total = 0.0
    for b in range(2):
        for l in range(2):
            us, ut = unit(s[b, l].tolist()), unit(t[b, l].tolist())
            total += sum((a - c) ** 2 for a, c in zip(us, ut))
    # Rows: (0.6,0.8)-(0.8,0.6) → 0.08; (1,0)-(0,1) → 2; identical → 0; opposite → 4.
    assert total / 4 == pytest.approx((0.08 + 2 + 0 + 4) / 4)
    assert losses.pkd(s, t).item() == pytest.approx(total / 4, rel=1e-6)
    # Scale-invariant: only directions count.
    assert losses.pkd(s * 10, t).item() == pytest.approx(total / 4, rel=1e-6)


def test_combine_is_the_weighted_sum_of_the_active_terms():
    labels = torch.tensor([1, 0])
    hidden_s, hidden_t = torch.ones(2, 4), torch.zeros(2, 4)
    outputs = {"logits": S, "repr": hidden_s, "cls_layers": torch.ones(2, 1, 4)}
    batch = {schema.LABEL: labels, schema.TEACHER_LOGITS: T, schema.TEACHER_HIDDEN: hidden_t,
             TEACHER_LAYERS: -torch.ones(2, 1, 4)}
    w = LossWeights(ce=0.5, mse=2.0, kd=0.0, repr=3.0, pkd=0.25, temperature=2.0)
    total, parts = losses.combine(outputs, batch, w)
    assert set(parts) == {"ce", "mse", "repr", "pkd"}  # kd has weight 0: not computed
    expected = (0.5 * losses.ce(S, labels) + 2.0 * losses.logits_mse(S, T) + 3.0 * 1.0 + 0.25 * 4.0).item()
    assert total.item() == pytest.approx(expected, rel=1e-6)
    assert parts["repr"] == pytest.approx(1.0) and parts["pkd"] == pytest.approx(4.0)


def test_combine_refuses_all_zero_weights():
    with pytest.raises(ValueError, match="no loss"):
        losses.combine({"logits": S}, {schema.LABEL: torch.tensor([0, 1])}, LossWeights())
