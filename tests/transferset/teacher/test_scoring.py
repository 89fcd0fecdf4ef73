import numpy as np
import pytest
import torch

from transferset import packed
from transferset.runtime.errors import UserError
from transferset.teacher import scoring
from tolerances import assert_reordered  # reordered sums, at most 4 layers deep

TEXTS = [
    "the movie was great",
    "bad",
    "a very very long boring film that never ends and is so dull , the plot is awful and the acting is worse",
    "i love it !",
    "zzz qqq unknownword",
    "not good , not bad , just fine",
    "one",
    "the best film ever made , with brilliant acting",
]


# Both forward paths must give every row the plain model's result: the padding-free BERT path
# (the default for BERT teachers) and the model's own forward on padded batches (every other model).
PATHS = pytest.mark.parametrize("path", ["packed", "padded"])


@PATHS
def test_predict_matches_plain_model_row_by_row(tiny_teacher, reference, path):
    # forward_rows=3 forces several sorted forward batches over rows of very different lengths.
    teacher = scoring.Teacher.load(tiny_teacher, forward_rows=3, forward=path)
    assert teacher.forward_path == path
    scores = teacher.predict(TEXTS)
    assert scores.logits.shape == (len(TEXTS), 2) and scores.logits.dtype == np.float32
    assert scores.hidden.shape == (len(TEXTS), 32)
    for i, text in enumerate(TEXTS):
        logits, hidden = reference(text)
        assert_reordered(scores.logits[i], logits, layers=4)
        assert_reordered(scores.hidden[i], hidden[-1][0], layers=4)  # [CLS] of the last layer
    np.testing.assert_array_equal(scores.labels, scores.logits.argmax(axis=1))
    # Real tokens: the unpadded lengths, [CLS] and [SEP] included.
    assert scores.num_tokens == sum(len(teacher.tokenizer(t)["input_ids"]) for t in TEXTS)
    # Rows really differ, so a row swap would have failed the loop above.
    assert np.ptp(scores.logits[:, 1] - scores.logits[:, 0]) > 0.5


@PATHS
def test_batching_changes_no_row(tiny_teacher, path):
    one_batch = scoring.Teacher.load(tiny_teacher, forward_rows=64, forward=path).predict(TEXTS)
    tiny_batches = scoring.Teacher.load(tiny_teacher, forward_rows=1, forward=path).predict(TEXTS)
    token_capped = scoring.Teacher.load(tiny_teacher, forward_rows=64, forward_tokens=40,
                                        forward=path).predict(TEXTS)
    other = {"packed": "padded", "padded": "packed"}[path]
    other_path = scoring.Teacher.load(tiny_teacher, forward=other).predict(TEXTS)
    for other in (tiny_batches, token_capped, other_path):
        assert_reordered(other.logits, one_batch.logits, layers=4)
        assert_reordered(other.hidden, one_batch.hidden, layers=4)


@PATHS
def test_mean_pooling_and_extra_layers(tiny_teacher, reference, path):
    teacher = scoring.Teacher.load(tiny_teacher, pooling="mean", layers=[-1, 0, 1], forward_rows=4,
                                   forward=path)
    assert teacher.layers == [2, 0, 1] and teacher.extra_layers == [0, 1]
    scores = teacher.predict(TEXTS)
    assert sorted(scores.layers) == [0, 1]
    for i, text in enumerate(TEXTS):
        _, hidden = reference(text)
        assert_reordered(scores.hidden[i], hidden[2].mean(axis=0), layers=4)
        assert_reordered(scores.layers[0][i], hidden[0].mean(axis=0), layers=4)
        assert_reordered(scores.layers[1][i], hidden[1].mean(axis=0), layers=4)


@PATHS
def test_sentence_pairs_and_mixed_rows(tiny_teacher, reference, path):
    teacher = scoring.Teacher.load(tiny_teacher, forward_rows=2, forward=path)
    texts_b = ["it was fine", None, "the plot", None, "great acting", "no", None, "so dull"]
    scores = teacher.predict(TEXTS, texts_b)
    for i, (a, b) in enumerate(zip(TEXTS, texts_b)):
        logits, hidden = reference(a, b)
        assert_reordered(scores.logits[i], logits, layers=4)
        assert_reordered(scores.hidden[i], hidden[-1][0], layers=4)


@PATHS
def test_truncation_to_max_length(tiny_teacher, reference, path):
    long_text = " ".join(["boring"] * 50 + ["great"] * 50)
    scores = scoring.Teacher.load(tiny_teacher, max_length=16, forward=path).predict([long_text, "great"])
    logits, _ = reference(long_text, max_length=16)
    assert_reordered(scores.logits[0], logits, layers=4)
    assert scores.num_tokens == 16 + 3  # 16 after truncation; "great" is [CLS] great [SEP]


@PATHS
def test_empty_batch(tiny_teacher, path):
    scores = scoring.Teacher.load(tiny_teacher, forward=path).predict([])
    assert scores.logits.shape == (0, 2) and scores.hidden.shape == (0, 32) and scores.num_tokens == 0


def test_cls_pooling_finds_first_real_token_with_left_padding(tiny_teacher):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_teacher, padding_side="left")
    feats = [{"input_ids": [5, 6, 7]}, {"input_ids": [8]}]
    batch = tok.pad(feats, padding=True, return_tensors="pt")  # as Teacher._forward_padded pads
    pad = tok.pad_token_id
    assert batch["input_ids"].tolist() == [[5, 6, 7], [pad, pad, 8]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [0, 0, 1]]
    hidden = torch.arange(2 * 3 * 1, dtype=torch.float32).reshape(2, 3, 1)  # (B, T, H)
    assert scoring.pool(hidden, batch["attention_mask"], "cls").flatten().tolist() == [0.0, 5.0]
    assert scoring.pool(hidden, batch["attention_mask"], "mean").flatten().tolist() == [1.0, 5.0]


def test_layer_specs():
    assert scoring.normalize_layers([-1, 0, 6, -7], 6) == [6, 0]
    with pytest.raises(UserError, match="layer 7 does not exist; the teacher has 6 layers"):
        scoring.normalize_layers([7], 6)


def test_unknown_pooling_refused(tiny_teacher):
    with pytest.raises(UserError, match="--hidden 'max'"):
        scoring.Teacher.load(tiny_teacher, pooling="max")


def test_metadata_facts(tiny_teacher):
    import hashlib
    import os

    teacher = scoring.Teacher.load(tiny_teacher, layers=[-1, 1])
    assert teacher.label_names == ["0", "1"] and teacher.num_classes == 2 and teacher.hidden_size == 32
    with open(os.path.join(tiny_teacher, "model.safetensors"), "rb") as fh:
        assert teacher.weights_sha256() == hashlib.sha256(fh.read()).hexdigest()
    spec = teacher.hidden_spec()
    assert (spec["pooling"], spec["layer"], spec["extra_layers"], spec["hidden_size"]) == ("cls", 2, [1], 32)
    info = teacher.tokenizer_info()
    assert info["vocab_size"] == teacher.tokenizer.vocab_size and info["do_lower_case"] is True


def test_packed_path_is_the_default_for_bert_and_caps_real_tokens(tiny_teacher):
    teacher = scoring.Teacher.load(tiny_teacher)
    assert teacher.forward_path == "packed" and teacher.packed_reason == ""
    assert (teacher.forward_rows, teacher.forward_tokens) == (scoring.PACKED_FORWARD_ROWS,
                                                              scoring.PACKED_FORWARD_TOKENS)
    lengths = [len(f["input_ids"]) for f in teacher.tokenize(TEXTS)]
    order = sorted(range(len(TEXTS)), key=lambda i: -lengths[i])
    capped = scoring.Teacher.load(tiny_teacher, forward_tokens=20)
    batches = list(capped._forward_batches(order, lengths))
    assert sorted(i for b in batches for i in b) == list(range(len(TEXTS)))
    # Packed: the cap counts real tokens (a row longer than the cap goes alone).
    assert all(sum(lengths[i] for i in b) <= 20 or len(b) == 1 for b in batches)
    assert any(len(b) > 1 for b in batches)
    padded = scoring.Teacher.load(tiny_teacher, forward_tokens=20, forward="padded")
    assert (padded.forward_rows, padded.forward_tokens) == (scoring.DEFAULT_FORWARD_ROWS, 20)
    for b in padded._forward_batches(order, lengths):  # padded: longest × rows
        assert max(lengths[i] for i in b) * len(b) <= 20 or len(b) == 1
    with pytest.raises(UserError, match="--forward-rows and --forward-tokens must be at least 1"):
        scoring.Teacher.load(tiny_teacher, forward_tokens=0)


def test_auto_takes_the_packed_path_on_cpu_only(tiny_teacher, monkeypatch):
    assert scoring.Teacher.load(tiny_teacher, forward="auto").forward_path == "packed"
    # Not measured on a GPU: there auto keeps the model's own forward (only the device is faked here).
    monkeypatch.setattr(scoring.Teacher, "device", property(lambda self: torch.device("cuda")))
    teacher = scoring.Teacher.load(tiny_teacher, device="cpu")
    assert teacher.forward_path == "padded" and "CPU only" in teacher.packed_reason


def test_other_architectures_use_the_padded_path(tiny_teacher):
    from transformers import AutoTokenizer, DebertaConfig, DebertaForSequenceClassification

    tok = AutoTokenizer.from_pretrained(tiny_teacher)
    torch.manual_seed(0)
    model = DebertaForSequenceClassification(DebertaConfig(  # DeBERTa v1: no packed path
        vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_labels=2, relative_attention=True, pos_att_type=["p2c", "c2p"])).eval()
    teacher = scoring.Teacher(model, tok)
    assert teacher.forward_path == "padded" and "DebertaForSequenceClassification" in teacher.packed_reason
    scores = teacher.predict(TEXTS)
    with torch.no_grad():
        for i, text in enumerate(TEXTS):
            enc = tok(text, return_tensors="pt")
            enc.pop("token_type_ids", None)
            assert_reordered(scores.logits[i], model(**enc).logits[0].numpy(), layers=4)
    with pytest.raises(UserError, match="not available for this teacher: DebertaForSequenceClassification"):
        scoring.Teacher(model, tok, forward="packed")
    with pytest.raises(UserError, match="--forward 'fast': choose one of"):
        scoring.Teacher(model, tok, forward="fast")


def test_probe_check_falls_back_when_the_packed_path_disagrees(tiny_teacher, reference, monkeypatch):
    def uniform_attention(q, k, v, scale):  # a wrong attention: ignores the queries
        return v.mean(dim=2, keepdim=True).expand_as(v)

    # the packed layers look `attention` up in their own module: patch it there
    monkeypatch.setattr(packed.encoder, "attention", uniform_attention)
    teacher = scoring.Teacher.load(tiny_teacher)
    assert teacher.forward_path == "padded" and "differ from the model's own forward" in teacher.packed_reason
    scores = teacher.predict(TEXTS[:3])
    for i, text in enumerate(TEXTS[:3]):
        assert_reordered(scores.logits[i], reference(text)[0], layers=4)

    def broken(q, k, v, scale):
        raise RuntimeError("no kernel")

    monkeypatch.setattr(packed.encoder, "attention", broken)
    teacher = scoring.Teacher.load(tiny_teacher)
    assert teacher.forward_path == "padded" and "(aten) failed: RuntimeError: no kernel" in teacher.packed_reason
    with pytest.raises(UserError, match="probe forward .* failed"):
        scoring.Teacher.load(tiny_teacher, forward="packed")


def test_bf16_precision_on_either_path_near_fp32(tiny_teacher):
    full = scoring.Teacher.load(tiny_teacher, forward="padded").predict(TEXTS)
    half = {}
    for path in ("packed", "padded"):
        teacher = scoring.Teacher.load(tiny_teacher, forward=path, precision="bf16")
        assert teacher.forward_path == path and teacher.precision == "bf16"  # the packed probe passes in bf16 too
        assert {p.dtype for p in teacher.model.parameters()} == {torch.bfloat16}
        half[path] = teacher.predict(TEXTS)
        assert half[path].logits.dtype == half[path].hidden.dtype == np.float32  # handed back as float32
    # The two paths in bf16 differ by rounding only (a wrong layout would be off by the logits' size, ~4 here)
    np.testing.assert_allclose(half["packed"].logits, half["padded"].logits, atol=0.1)
    np.testing.assert_allclose(half["packed"].hidden, half["padded"].hidden, atol=0.1)
    # This tiny random model amplifies bfloat16's rounding (8 significant bits) to 0.5 on a logit of 4, and
    # keeps every row's label and the rows' order by margin
    margin = {k: s.logits[:, 1] - s.logits[:, 0] for k, s in dict(half, fp32=full).items()}
    for path in ("packed", "padded"):
        assert 0 < np.abs(half[path].logits - full.logits).max() < 0.15 * np.abs(full.logits).max()
        np.testing.assert_array_equal(half[path].labels, full.labels)
        assert np.corrcoef(margin[path], margin["fp32"])[0, 1] > 0.99


def test_auto_precision_scores_bf16_only_where_the_device_has_bfloat16_arithmetic(tiny_teacher, monkeypatch):
    from transferset.training import engine

    assert scoring.Teacher.load(tiny_teacher, device="cpu", precision="auto").precision == "fp32"  # the suite's
    monkeypatch.setattr(engine, "has_bf16", lambda device: device.type == "cpu")
    teacher = scoring.Teacher.load(tiny_teacher, device="cpu", precision="auto")
    assert teacher.precision == "bf16" and next(teacher.model.parameters()).dtype == torch.bfloat16
    assert scoring.resolved_precision("auto", "cpu") == "bf16" and scoring.resolved_precision("fp32") == "fp32"


def test_unknown_precision_refused(tiny_teacher):
    with pytest.raises(UserError, match="--precision 'fp16': choose one of"):
        scoring.Teacher.load(tiny_teacher, precision="fp16")


def test_bf16_on_a_cpu_without_bfloat16_arithmetic_warns_and_scores(tiny_teacher, monkeypatch, caplog):
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)
    with caplog.at_level("WARNING", logger="transferset.teacher"):
        teacher = scoring.Teacher.load(tiny_teacher, precision="bf16")
    assert "no bfloat16 arithmetic" in caplog.text and "drop --precision bf16" in caplog.text
    assert teacher.predict(TEXTS[:2]).logits.shape == (2, 2)
