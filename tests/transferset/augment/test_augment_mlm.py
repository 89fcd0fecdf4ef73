"""TinyBERT-style MLM replacement through a real (tiny) BertForMaskedLM loaded from disk."""
import numpy as np
import pytest

from transferset.augment import generate
from transferset.config import AugmentConfig
from transferset.augment.mlm import MlmCandidates, mlm
from transferset.augment.seeding import rng_for

SENTENCES = [
    "the film was great and funny".split(),
    "a boring plot , awful acting".split(),
    "this movie is not very charming".split(),
    "unfilms were dull".split(),  # "unfilms" is several wordpieces: not eligible
]


@pytest.fixture(scope="module")
def cands(tiny_mlm_dir):
    return MlmCandidates(tiny_mlm_dir, top_k=5, batch_size=4, max_length=64)


def test_only_alphabetic_single_piece_non_stopwords_are_eligible(cands):
    assert cands.eligible(SENTENCES[0]) == [1, 3, 5]  # film, great, funny (the/was/and are stop words)
    assert cands.eligible(SENTENCES[1]) == [1, 2, 4, 5]  # "," is not alphabetic
    assert cands.eligible(SENTENCES[3]) == [2]  # unfilms → un ##film... ; were is a stop word


def test_batched_candidates_equal_one_position_per_forward(cands):
    batched = cands.candidates(SENTENCES)
    baseline = cands.candidates_one_at_a_time(SENTENCES)
    assert batched == baseline
    for words, c in zip(SENTENCES, batched):
        assert sorted(c) == cands.eligible(words)
        for i, toks in c.items():
            assert len(toks) == 5
            assert words[i] not in toks  # the original word is never its own candidate
            assert all(t.isalpha() and not t.startswith("##") for t in toks)


def test_padding_free_forward_gives_the_padded_forwards_logits_and_candidates(tiny_mlm_dir):
    """BertForMaskedLM on a CPU takes the packed path (no padding tokens); same logits, same candidates."""
    import torch

    packed = MlmCandidates(tiny_mlm_dir, top_k=5, batch_size=4, max_length=64)
    padded = MlmCandidates(tiny_mlm_dir, top_k=5, batch_size=4, max_length=64, forward="padded")
    assert (packed.forward_path, padded.forward_path) == ("packed", "padded")
    # pairs of different lengths in one forward pass, out of length order
    masked = ["the [MASK] was great and funny", "a [MASK]", "[MASK] boring plot , awful acting"]
    original = ["the film was great and funny", "a plot", "a boring plot , awful acting"]
    with torch.inference_mode():
        a, b = packed._forward(masked, original), padded._forward(masked, original)
    assert a.shape == b.shape == (3, packed.tokenizer.vocab_size)
    assert torch.allclose(a, b, atol=1e-4)
    assert packed.candidates(SENTENCES) == padded.candidates(SENTENCES) == padded.candidates_one_at_a_time(SENTENCES)


def test_packed_forward_is_refused_with_the_reason_for_a_model_without_it(tiny_mlm_dir, tiny_teacher):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from transferset.packed import PackedMaskedLM

    model = AutoModelForSequenceClassification.from_pretrained(tiny_teacher)
    packed, why = PackedMaskedLM.build(model, AutoTokenizer.from_pretrained(tiny_teacher))
    assert packed is None and why == "BertForSequenceClassification is not BertForMaskedLM"
    with pytest.raises(ValueError, match="choose auto, packed or padded"):
        MlmCandidates(tiny_mlm_dir, top_k=5, batch_size=4, max_length=64, forward="fast")


def test_batch_size_does_not_change_candidates(cands):
    assert cands.candidates(SENTENCES, batch_size=1) == cands.candidates(SENTENCES, batch_size=16)


def test_mlm_replaces_eligible_words_with_probability_p(cands):
    words = SENTENCES[1]
    table = cands.candidates([words])[0]
    cfg = AugmentConfig(recipe="tinybert", n_iter=2000, p_mlm=0.4, seed=0)
    changed = np.zeros(len(words))
    for v in generate(words, source_id="s", cfg=cfg, context={"candidates": table}):
        for i, (old, new) in enumerate(zip(words, v.words)):
            if new != old:
                assert i in table and new in table[i]
                changed[i] += 1
    rate = changed / cfg.n_iter
    for i in range(len(words)):
        if i in table:
            assert abs(rate[i] - 0.4) < 0.04
        else:
            assert rate[i] == 0


def test_mlm_op_is_seeded():
    table = {0: ["x", "y", "z"]}
    a = mlm(words=["w", "v"], positions=np.array([0]), rng=rng_for(1, "s", 0), candidates=table)
    b = mlm(words=["w", "v"], positions=np.array([0]), rng=rng_for(1, "s", 0), candidates=table)
    assert a == b and a[0] in table[0] and a[1] == "v"
