"""The padding-free forward (transferset/packed.py) on every encoder family it serves, against the model's
own forward on padded batches; the families it does not serve fall back with their reason.

Random 2-layer models built from each family's config (tests/family_models.py); token ids are drawn
directly, so no tokenizer is needed except where the scorer itself is exercised.
"""
import logging

import numpy as np
import pytest
import torch

import family_models as fm
from transferset import packed
from transferset.packed.biases import _DisentangledBias, _MPNetBias
from transferset.teacher import scoring
from tolerances import assert_reordered  # reordered sums, at most 4 layers deep

SERVED = ["bert", "roberta", "xlm-roberta", "camembert", "electra", "distilbert", "mpnet", "deberta-v2", "modernbert"]
# Two pairs of equal length (one attention call each) and rows of other lengths, longest 40 tokens
# (beyond the tiny ModernBERT's local attention window of 8 tokens each side).
LENGTHS = [40, 23, 23, 11, 7, 4, 4, 2]
LAYERS = [0, 1, 2]  # hidden_states indices: embeddings, layer 1, layer 2 (the last)


def padded_forward(model, rows, pad_id):
    """The model's own forward on the rows right-padded into one batch: logits (B, C) and hidden_states."""
    width = max(len(r["input_ids"]) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    types = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        n = len(r["input_ids"])
        ids[i, :n], mask[i, :n] = torch.tensor(r["input_ids"]), 1
        if "token_type_ids" in r:
            types[i, :n] = torch.tensor(r["token_type_ids"])
    kwargs = {"token_type_ids": types} if "token_type_ids" in rows[0] else {}
    with torch.inference_mode():
        out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True, **kwargs)
    return out.logits, out.hidden_states, mask


def assert_packed_logits_match(model):
    """The packed path builds for `model` and its logits (cls pooling) are the model's own on LENGTHS' rows;
    returns those logits."""
    path, why = packed.PackedClassifier.build(model)
    assert path is not None, why
    rows = fm.ids_rows(model, LENGTHS)
    logits, _, _ = padded_forward(model, rows, model.config.pad_token_id)
    with torch.inference_mode():
        got, _ = path.score(rows, layers=[], pooling="cls")
    assert_reordered(got.numpy(), logits.numpy(), layers=4)
    return logits


@pytest.mark.parametrize("family", SERVED)
def test_packed_matches_the_padded_forward_of_each_family(family):
    model = fm.build(family)
    path, why = packed.PackedClassifier.build(model)
    assert path is not None and why == "", why
    assert path.family == packed.CLASSIFIERS[type(model).__name__]
    rows = fm.ids_rows(model, LENGTHS, token_types=family in ("bert", "electra"))
    pad_id = model.config.pad_token_id
    logits, hidden, mask = padded_forward(model, rows, pad_id)
    for pooling in ("cls", "mean"):
        with torch.inference_mode():
            got, pooled = path.score(rows, layers=LAYERS, pooling=pooling)
        assert_reordered(got.numpy(), logits.numpy(), layers=4)
        for k in LAYERS:  # the pooled hidden layers the scorer stores
            assert_reordered(pooled[k].numpy(), scoring.pool(hidden[k], mask, pooling).numpy(), layers=4)
    # The rows really differ (a row swap or one row's result everywhere would have failed above).
    assert float((logits[:, 0] - logits[:, 1]).std()) > 1e-3


@pytest.mark.parametrize("share_att_key,pos_att_type", [(False, ["p2c", "c2p"]), (True, ["c2p"]), (True, ["p2c"])])
def test_deberta_disentangled_terms_alone_and_with_their_own_projections(share_att_key, pos_att_type):
    # The packed path multiplies only the relative embeddings rows of a length can reach, then gathers
    # (_DisentangledBias._scores): each term alone, and the separate pos_key/pos_query projections, against
    # the model's own forward on rows long enough for the log buckets (position_buckets 16).
    import transformers

    cfg = fm.config("deberta-v2")
    cfg.share_att_key, cfg.pos_att_type = share_att_key, pos_att_type
    torch.manual_seed(0)
    model = transformers.DebertaV2ForSequenceClassification(cfg).eval()
    logits = assert_packed_logits_match(model)
    assert float((logits[:, 0] - logits[:, 1]).std()) > 1e-3


@pytest.mark.parametrize("family", ["mpnet", "deberta-v2", "modernbert"])
def test_the_probe_catches_a_wrong_relative_position_bias(family, monkeypatch):
    # Without its position-dependent scores (MPNet's relative bias, DeBERTa's disentangled terms, ModernBERT's
    # local window) the family's packed path is wrong; the probe at load must see it.
    model = fm.build(family)
    if family == "modernbert":
        assert any(layer.window == 8 for layer in packed.PackedClassifier(model).layers)
        monkeypatch.setattr(packed.PackedEncoder, "_band", lambda self, length, window, like: None)
    else:
        bias = {"mpnet": _MPNetBias, "deberta-v2": _DisentangledBias}[family]
        assert all(isinstance(layer.bias, bias) for layer in packed.PackedClassifier(model).layers)
        monkeypatch.setattr(bias, "__call__", lambda self, q, k, length: None)
    path, why = packed.PackedClassifier.build(model)
    assert path is None and "differ from the model's own forward" in why


def test_modernbert_mean_pooling_head():
    model = fm.build("modernbert")
    model.config.classifier_pooling = "mean"
    assert_packed_logits_match(model)


@pytest.mark.parametrize("family", ["bert", "roberta", "electra", "distilbert", "mpnet"])
def test_packed_mlm_logits_at_chosen_tokens(family):
    model = fm.build(family, "mlm")
    path, why = packed.PackedMaskedLM.build(model)
    assert path is not None and why == "", why
    rows = fm.ids_rows(model, [13, 9, 9, 5], seed=1)
    at = [12, 0, 4, 2]
    with torch.inference_mode():
        got = path.logits_at(rows, at)
    logits, _, _ = padded_forward(model, rows, model.config.pad_token_id)
    want = logits[torch.arange(len(rows)), torch.tensor(at)]
    assert_reordered(got.numpy(), want.numpy(), layers=4)


@pytest.mark.parametrize("family,kind,reason", [
    ("deberta", "classifier", "DeBERTa v1 (a different disentangled attention)"),
    ("modernbert", "mlm", "ModernBERT's MLM"),
    ("deberta-v2", "mlm", "DeBERTa-v2's MLM head"),
])
def test_families_not_served_fall_back_with_their_reason(family, kind, reason):
    model = fm.build(family, kind)
    build = packed.PackedClassifier.build if kind == "classifier" else packed.PackedMaskedLM.build
    path, why = build(model)
    assert path is None and reason in why


def test_a_deberta_with_a_convolution_falls_back():
    model = fm.build("deberta-v2")
    model.deberta.encoder.conv = torch.nn.Identity()  # what conv_kernel_size > 0 adds after the first layer
    path, why = packed.PackedClassifier.build(model)
    assert path is None and "convolution" in why


def test_a_subclass_is_not_served():
    from transformers import RobertaForSequenceClassification

    class Custom(RobertaForSequenceClassification):  # its forward may differ from the family's
        pass

    torch.manual_seed(0)
    model = Custom(fm.config("roberta")).eval()
    path, why = packed.PackedClassifier.build(model)
    assert path is None and "Custom is not served padding-free" in why


@pytest.mark.parametrize("family", ["roberta", "distilbert", "deberta-v2", "modernbert"])
def test_the_scorer_takes_the_packed_path_for_other_families(tiny_teacher, family, caplog):
    # The whole scoring path (tokenize, sort, forward batches, input order) with a real tokenizer: the
    # tiny teacher's WordPiece vocabulary under a random model of the family (pad id 0 as the tokenizer's).
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_teacher)
    model = fm.build_for_tokenizer(family, tok)
    texts = ["the movie was great", "bad", "not good , not bad , just fine", "i love it !", "one",
             "a very long boring film that never ends and is so dull , the plot is awful"]
    with caplog.at_level(logging.INFO, logger="transferset.teacher"):
        fast = scoring.Teacher(model, tok, forward="auto", forward_rows=4, pooling="mean", layers=[-1, 1])
    assert fast.forward_path == "packed" and "teacher forward pass: packed" in caplog.text
    slow = scoring.Teacher(model, tok, forward="padded", forward_rows=4, pooling="mean", layers=[-1, 1])
    a, b = fast.predict(texts), slow.predict(texts)
    assert_reordered(a.logits, b.logits, layers=4)
    assert_reordered(a.hidden, b.hidden, layers=4)
    assert_reordered(a.layers[1], b.layers[1], layers=4)


def test_the_scorer_logs_why_a_family_not_served_takes_the_padded_path(tiny_teacher, caplog):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_teacher)
    model = fm.build("deberta", vocab=tok.vocab_size)
    with caplog.at_level(logging.INFO, logger="transferset.teacher"):
        teacher = scoring.Teacher(model, tok, forward="auto")
    assert teacher.forward_path == "padded" and "DeBERTa v1" in teacher.packed_reason
    assert "teacher forward pass: padded (DebertaForSequenceClassification: DeBERTa v1" in caplog.text
