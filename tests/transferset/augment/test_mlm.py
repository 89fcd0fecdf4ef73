"""TinyBERT-style MLM replacement through a real (tiny) BertForMaskedLM loaded from disk."""
import numpy as np
import pytest

from transferset.augment import generate
from transferset.augment.mlm import MlmCandidates, mlm
from transferset.augment.seeding import rng_for
from transferset.config import AugmentConfig
from transferset.runtime.errors import UserError
from tolerances import tiny_bert

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
    # packed against padded: reordered sums through 2 layers and the MLM head's transform (tests/tolerances.py)
    assert torch.allclose(a, b, atol=tiny_bert(b.numpy(), layers=3), rtol=0)
    assert packed.candidates(SENTENCES) == padded.candidates(SENTENCES) == padded.candidates_one_at_a_time(SENTENCES)


def test_packed_forward_is_refused_with_the_reason_for_a_model_without_it(tiny_mlm_dir, tiny_teacher):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from transferset.packed import PackedMaskedLM

    model = AutoModelForSequenceClassification.from_pretrained(tiny_teacher)
    packed, why = PackedMaskedLM.build(model, AutoTokenizer.from_pretrained(tiny_teacher))
    assert packed is None and why.startswith("BertForSequenceClassification is not served padding-free (served: "
                                             "BertForMaskedLM, CamembertForMaskedLM")
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


@pytest.fixture(scope="module")
def pickled_mlm(tiny_mlm_dir, tmp_path_factory):
    """The tiny MLM with its weights as a pickle (pytorch_model.bin) instead of safetensors."""
    import shutil

    import torch
    from transformers import AutoModelForMaskedLM

    d = tmp_path_factory.mktemp("pickled_mlm")
    for name in ("config.json", "vocab.txt", "tokenizer_config.json"):
        shutil.copy(f"{tiny_mlm_dir}/{name}", d / name)
    torch.save(AutoModelForMaskedLM.from_pretrained(tiny_mlm_dir).state_dict(), d / "pytorch_model.bin")
    return str(d)


def _augment_mlm(mlm_dir, tmp_path, capsys, *more):
    from transferset.app.cli import main

    src = tmp_path / "a.tsv"
    src.write_text("sentence\tlabel\nthe film was great\t1\n")
    out = tmp_path / "o"
    rc = main(["augment", "--input", str(src), "--output", str(out), "--recipe", "tinybert", "--n-iter", "1",
               "--mlm-model", mlm_dir, *more])
    return rc, capsys.readouterr().err, out


def test_pickle_mlm_weights_refused_in_one_line_before_the_pipeline(pickled_mlm, tmp_path, capsys):
    """`augment --mlm-model` on pickle weights is refused in one line before the pipeline, not by torch inside a
    Beam traceback."""
    rc, err, out = _augment_mlm(pickled_mlm, tmp_path, capsys)
    assert rc == 1 and "weights are pickle files (pytorch_model.bin)" in err and "--allow-pickle" in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1 and not out.exists()
    with pytest.raises(UserError, match="pickle files"):
        MlmCandidates(pickled_mlm, top_k=5, batch_size=4, max_length=64)


def test_pickle_mlm_loads_when_allowed_with_the_same_candidates(pickled_mlm, tiny_mlm_dir):
    allowed = MlmCandidates(pickled_mlm, top_k=5, batch_size=4, max_length=64, allow_pickle=True)
    safe = MlmCandidates(tiny_mlm_dir, top_k=5, batch_size=4, max_length=64)
    assert allowed.candidates(SENTENCES) == safe.candidates(SENTENCES)


def test_mlm_with_auto_map_refused_in_one_line(tiny_mlm_dir, tmp_path, capsys):
    """An auto_map next to model_type bert is refused in one line, never silently loaded as the built-in class."""
    import json
    import shutil

    d = tmp_path / "mlm_code"
    shutil.copytree(tiny_mlm_dir, d)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "auto_map": {"AutoModelForMaskedLM": "mine.Evil"}}))
    rc, err, out = _augment_mlm(str(d), tmp_path, capsys)
    assert rc == 1 and "ships its own Python code (auto_map AutoModelForMaskedLM -> mine.Evil)" in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1 and not out.exists()
    with pytest.raises(UserError, match="auto_map"):
        MlmCandidates(str(d), top_k=5, batch_size=4, max_length=64)


@pytest.mark.parametrize("family", ["roberta", "xlm-roberta"])
def test_a_byte_level_bpe_or_sentencepiece_mlm_gives_whole_words(family, tmp_path_factory, sst2_sentences):
    """RoBERTa's candidates are "Ġfilm"-style pieces, XLM-R's "▁film": a candidate is the word they start, never a
    marked piece, a continuation or the original; eligible words are one such piece after a space."""
    import builders as testing

    path = testing.tiny_family_mlm(str(tmp_path_factory.mktemp(f"mlm_{family}")), family, sst2_sentences)
    c = MlmCandidates(path, top_k=5, batch_size=4, max_length=64)
    assert c.word_start == {"roberta": "Ġ", "xlm-roberta": "▁"}[family]
    batched = c.candidates(SENTENCES)
    assert batched == c.candidates_one_at_a_time(SENTENCES)
    pieces = c.tokenizer.get_vocab()
    assert any(batched)
    for words, found in zip(SENTENCES, batched):
        assert sorted(found) == c.eligible(words)
        for i in found:
            assert c.tokenizer.tokenize(" " + words[i]) == [c.word_start + words[i]]
        for i, toks in found.items():
            assert len(toks) == 5 and words[i] not in toks
            assert all(t.isalpha() and c.word_start + t in pieces for t in toks), toks
    # The op writes those words into the text.
    out = mlm(words=SENTENCES[0], positions=np.array(sorted(batched[0])), rng=np.random.default_rng(0),
              candidates=batched[0])
    assert all(w in SENTENCES[0] or w in batched[0][i] for i, w in enumerate(out)) and "Ġ" not in " ".join(out)
