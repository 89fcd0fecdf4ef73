"""Each layer loss against a value worked out by hand on tiny tensors; padding never counts."""
import math

import pytest
import torch

from students.losses import LossWeights, combine
from students.losses import layers as L
from students.losses.layers import States

KL = 0.75 * math.log(1.5) + 0.25 * math.log(0.5)  # KL([.75, .25] ‖ [.5, .5]) = 0.130812


def test_hidden_mse_counts_real_tokens_only():
    s = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]])
    t = torch.tensor([[[0.0, 2.0], [3.0, 2.0], [0.0, 0.0]]])
    mask = torch.tensor([[True, True, False]])
    # (1² + 0² + 0² + 2²) over 2 real tokens × 2 dimensions; the padded token's 10⁴ is ignored
    assert L.hidden_mse(s, t, mask).item() == pytest.approx(5 / 4)


def test_attention_mse_counts_pairs_of_real_tokens_per_head():
    s = torch.zeros(2, 1, 2, 2)
    t = torch.zeros(2, 1, 2, 2)
    s[0, 0] = torch.tensor([[3.0, 50.0], [50.0, 50.0]])  # row 0 has one real token: only (0, 0) counts
    t[0, 0, 0, 0] = 1.0
    s[1, 0] = torch.tensor([[1.0, 2.0], [3.0, 4.0]])     # row 1: all four pairs
    mask = torch.tensor([[True, False], [True, True]])
    # (3 − 1)² + 1 + 4 + 9 + 16 = 34 over 1² + 2² = 5 pairs
    assert L.attention_mse(s, t, mask).item() == pytest.approx(34 / 5)
    # Two identical heads: the same mean.
    assert L.attention_mse(s.repeat(1, 2, 1, 1), t.repeat(1, 2, 1, 1), mask).item() == pytest.approx(34 / 5)


def test_attention_kl_is_teacher_to_student_over_real_keys_and_queries():
    t = torch.tensor([[[[math.log(3.0), 0.0, 40.0], [0.0, 0.0, 40.0], [9.0, 9.0, 9.0]]]])
    s = torch.tensor([[[[0.0, 0.0, -7.0], [0.0, 0.0, 5.0], [1.0, 2.0, 3.0]]]])
    mask = torch.tensor([[True, True, False]])
    # query 0: KL([.75, .25] ‖ [.5, .5]); query 1: 0; query 2 and key 2 are padding
    assert L.dist_kl(s, t, mask).item() == pytest.approx(KL / 2, rel=1e-6)
    assert L.dist_kl(t, t, mask).item() == pytest.approx(0.0, abs=1e-7)


def test_value_relation_kl_allows_heads_of_other_widths():
    s = torch.zeros(1, 1, 2, 1)                    # d_k = 1: relation 0 everywhere, uniform rows
    a = math.sqrt(math.sqrt(2.0) * math.log(3.0))  # d_k = 2: row 0 of V·Vᵀ/√2 is [ln 3, 0]
    t = torch.tensor([[[[a, 0.0], [0.0, 0.0]]]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    torch.testing.assert_close(L.value_relation(t)[0, 0], torch.tensor([[math.log(3.0), 0.0], [0.0, 0.0]]))
    assert L.value_kl(s, t, mask).item() == pytest.approx(KL / 2, rel=1e-6)


def test_cosine_is_one_minus_cos_over_real_tokens():
    s = torch.tensor([[[1.0, 0.0], [1.0, 1.0], [5.0, 5.0]]])
    t = torch.tensor([[[0.0, 1.0], [2.0, 2.0], [-1.0, 0.0]]])
    mask = torch.tensor([[True, True, False]])
    assert L.cosine(s, t, mask).item() == pytest.approx((1.0 + 0.0) / 2)


def test_attention_losses_refuse_other_head_counts():
    mask = torch.ones(1, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match="head by head"):
        L.dist_kl(torch.zeros(1, 2, 2, 2), torch.zeros(1, 3, 2, 2), mask)


def _states(hidden, scores_by_layer):
    """States whose layer k has the given scores: q = scores·√d_k, k = I (so Q·Kᵀ/√d_k = scores), v = scores."""
    qkv = {}
    for k, sc in scores_by_layer.items():
        d = sc.size(-1)
        qkv[k] = (sc * math.sqrt(d), torch.eye(d).expand_as(sc), sc)  # q·Iᵀ/√d = sc
    return States(hidden, qkv)


def test_terms_average_over_pairs_and_only_restricts_them():
    mask = torch.ones(1, 2, dtype=torch.bool)
    zero = torch.zeros(1, 2, 2)
    student = States([zero, zero, zero + 1, zero + 2], {})
    teacher = States([zero + 3, zero, zero, zero, zero], {})
    pairs = [(1, 2), (2, 3), (3, 4)]
    out = L.terms(student, teacher, pairs, mask, {"hidden_mse": 1.0, "emb_mse": 1.0})
    assert out["hidden_mse"].item() == pytest.approx((0 + 1 + 4) / 3)
    assert out["emb_mse"].item() == pytest.approx(9.0)
    only = L.terms(student, teacher, pairs, mask, {"hidden_mse": 1.0}, only=(3,))
    assert only["hidden_mse"].item() == pytest.approx(4.0)
    with pytest.raises(ValueError, match="no student layer is mapped"):
        L.terms(student, teacher, pairs, mask, {"hidden_mse": 1.0}, only=(7,))


def test_states_scores_are_q_kt_over_sqrt_dk():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 4, 5, generator=g) for _ in range(3))
    st = States([], {1: (q, k, v)})
    torch.testing.assert_close(st.scores(1), torch.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(5))
    assert st.values(1) is v


def test_combine_weights_the_layer_terms_and_needs_the_teacher_states():
    mask = torch.ones(1, 2, dtype=torch.bool)
    sc_t = torch.tensor([[[[math.log(3.0), 0.0], [0.0, 0.0]]]])
    student = _states([torch.zeros(1, 2, 2)] * 2, {1: torch.zeros(1, 1, 2, 2)})
    teacher = _states([torch.zeros(1, 2, 2)] * 2, {1: sc_t})
    outputs = {"logits": torch.zeros(1, 2), L.STUDENT_STATES: student, L.LAYER_PAIRS: [(1, 1)]}
    batch = {"mask": mask, L.TEACHER_STATES: teacher}
    total, parts = combine(outputs, batch, LossWeights(att_kl=2.0))
    assert parts["att_kl"] == pytest.approx(KL / 2, rel=1e-6) and total.item() == pytest.approx(KL, rel=1e-6)
    # The attention MSE of the same scores: (ln 3)² over 4 pairs.
    _, parts = combine(outputs, batch, LossWeights(att_mse=1.0))
    assert parts["att_mse"] == pytest.approx(math.log(3.0) ** 2 / 4, rel=1e-6)
    with pytest.raises(ValueError, match="teacher's token-level states"):
        combine(outputs, {"mask": mask}, LossWeights(att_kl=1.0))


def test_a_layer_loss_registered_by_a_package_reads_what_it_declares():
    """One table says what each layer loss reads (LAYER_TERMS): a loss registered with register_layer joins it, is a
    layer-role loss of the registry, and its term gets the states it declared (here the last layers)."""
    from students import losses

    def last_l1(st, te, s, t, mask):
        return (st.hidden[s] - te.hidden[t]).abs().mean()

    with losses._REGISTRY.scratch():
        try:
            losses.register_layer("last_l1", L.LAST, last_l1)
            got = losses.get("last_l1")
            assert (got.role, got.per_pair, got.needs) == (losses.LAYER, False, (losses.ONLINE,))
            assert L.reading(L.LAST, {"last_l1": 1.0, "cos": 1.0, "hidden_mse": 1.0}) == ["cos", "last_l1"]
            student = States([torch.zeros(1, 2, 3), torch.full((1, 2, 3), 2.0)], {})
            teacher = States([torch.zeros(1, 2, 3), torch.zeros(1, 2, 3), torch.ones(1, 2, 3)], {})
            assert L.term("last_l1", student, teacher, [], torch.ones(1, 2, dtype=torch.bool)).item() == 1.0
            with pytest.raises(ValueError, match="reads 'logits' is not one of embeddings, last, hidden, attention"):
                losses.register_layer("other", "logits", last_l1)
        finally:
            L.LAYER_TERMS.pop("last_l1", None)
    assert "last_l1" not in L.LAYER_TERMS and "last_l1" not in losses.of_role(losses.LAYER)
