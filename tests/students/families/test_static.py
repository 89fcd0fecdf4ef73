"""The static student (students/families/static.py): its forward pass and pooling over real tokens, its setup on a
scored set (the BiLSTM's tokens and teacher vectors, frozen), and a student trained by `transferset train` that
saves, loads, exports to ONNX, predicts and evaluates (tests/students/shipped.py trains it)."""
import json

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from shipped import dev_rows, scored, trained
from students import trainer
from students.build import setup
from students.evaluate import evaluate
from students.families import bilstm, frozen_embeddings, static
from students.losses import LossWeights
from students.phases import phases
from students.student import OnnxStudent, Student
from transferset.app.cli import main
from transferset.config import StudentConfig
from transferset.contract import schema
from transferset.runtime.errors import UserError
from tolerances import reordered

E, H = 8, 6  # the tiny model's vector and MLP widths


def _tiny(**settings) -> static.Static:
    torch.manual_seed(0)
    return static.Static(static.StaticConfig(vocab_size=40, embed_dim=E, hidden=H, num_classes=3, **settings)).eval()


@pytest.mark.parametrize("pooling, width", [("mean", E), ("max", E), ("mean+max", 2 * E)])
def test_forward_shapes_and_the_pooled_values(pooling, width):
    model = _tiny(pooling=pooling, layers=2)
    ids = torch.tensor([[5, 6, 7, 0], [9, 10, 11, 12]])
    mask = ids != 0
    with torch.no_grad():
        out = model(ids, mask)
        pooled = model.pool(model.embed(ids), mask)
    assert out["logits"].shape == (2, 3) and out["repr"].shape == (2, H) and pooled.shape == (2, width)
    assert model.head[0].in_features == width and len(model.head) == 2
    # Row 0 pools its three real tokens only.
    x = model.embed.weight[[5, 6, 7]].detach()                          # (3, E)
    want = {"mean": x.mean(0), "max": x.max(0).values, "mean+max": torch.cat([x.mean(0), x.max(0).values])}[pooling]
    torch.testing.assert_close(pooled[0], want, atol=reordered(want.numpy(), terms=3, reductions=1), rtol=0)


def test_padding_and_what_it_holds_do_not_change_a_rows_output():
    model = _tiny()
    ids = torch.tensor([[5, 6, 7, 0, 0, 0], [9, 10, 11, 12, 13, 14]])
    mask = ids != 0
    junk = ids.clone()
    junk[0, 3:] = torch.tensor([20, 30, 39])  # real token ids under a zero mask: must be ignored, not the pad row
    with torch.no_grad():
        padded = model(ids, mask)["logits"]
        with_junk = model(junk, mask)["logits"]
        alone = model(ids[:1, :3], mask[:1, :3])["logits"]
    assert torch.equal(padded, with_junk)  # masked positions are filled before any sum: the same numbers
    # A batch of 2 against 1 row: a mean over up to 6 tokens, then the head's 2E-wide and the classifier's sums
    # in another order (tests/tolerances.py).
    torch.testing.assert_close(padded[:1], alone, atol=reordered(alone.numpy(), terms=2 * E, reductions=3), rtol=0)
    assert not torch.allclose(padded[0], padded[1])


def test_a_row_without_real_tokens_pools_to_zeros_not_nan():
    model = _tiny()
    ids = torch.tensor([[5, 6], [0, 0]])
    with torch.no_grad():
        pooled = model.pool(model.embed(ids), ids != 0)
        logits = model(ids, ids != 0)["logits"]
    assert torch.equal(pooled[1], torch.zeros(2 * E)) and torch.isfinite(logits).all()


def test_word_dropout_pools_a_random_subset_of_the_real_tokens_in_training_only():
    model = _tiny(word_dropout=0.5)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 0, 0], [11, 0, 0, 0, 0, 0, 0, 0]])
    mask = (ids != 0).long()
    torch.manual_seed(0)
    kept = model.drop_words(mask)
    assert kept.dtype == mask.dtype and not (kept.bool() & ~mask.bool()).any()  # only real positions are kept
    assert 0 < int(kept[0].sum()) < 6  # this seed drops some of row 0's six and keeps some
    # Over many draws each real position is kept about half the time; a row that would keep none keeps its own.
    draws = torch.stack([model.drop_words(mask) for _ in range(2000)]).float()  # (2000, B, T)
    rate = draws[:, 0, :6].mean()
    assert abs(float(rate) - 0.5) < 0.02, rate
    assert torch.equal(draws[:, 1, 0], torch.ones(2000))  # one token: never left with none
    with torch.no_grad():
        x = model.embed(ids)
        model.train()
        model.drop = torch.nn.Identity()  # the feature dropout off: the pooling's input is what differs
        torch.manual_seed(0)
        trained = model(ids, mask)["logits"]
        torch.manual_seed(0)
        subset = model.drop_words(mask)
        model.eval()
        evaluated = model(ids, mask)["logits"]

        def head(pooled):
            for layer in model.head:
                pooled = torch.nn.functional.gelu(layer(pooled))
            return model.classifier(pooled)
        torch.testing.assert_close(trained, head(model.pool(x, subset)), atol=1e-6, rtol=0)
        torch.testing.assert_close(evaluated, head(model.pool(x, mask)), atol=1e-6, rtol=0)  # evaluation: every token
    assert not torch.allclose(trained[0], evaluated[0])


@pytest.mark.parametrize("settings, message", [
    ({"word_dropout": 1.0}, "word_dropout must be in \\[0, 1\\)"),
    ({"word_dropout": -0.1}, "word_dropout must be in \\[0, 1\\)"),
    ({"pooling": "sum"}, "pooling must be one of mean, max, mean\\+max"),
    ({"act": "tanh"}, "act must be one of gelu, relu"),
    ({"layers": 0}, "layers and hidden must be at least 1"),
])
def test_bad_settings_are_refused(settings, message):
    with pytest.raises(ValueError, match=message):
        static.Static(static.StaticConfig(vocab_size=10, **settings))


def test_setup_takes_the_bilstms_tokens_and_teacher_vectors_and_keeps_them_frozen(tiny_scored_dir):
    cfg = StudentConfig(student="static", threads=1, vocab={"trim_vocab": True}, model={"embed_dim": 16, "hidden": 12})
    s = setup(cfg, tiny_scored_dir)
    twin = setup(StudentConfig(student="bilstm", threads=1, vocab={"trim_vocab": True}, model={"embed_dim": 16, "hidden": 8}),
                 tiny_scored_dir)
    assert isinstance(s.model, static.Static) and s.model_config.hidden == 12 and s.model_config.embed_dim == 16
    assert s.tokens.keep == twin.tokens.keep and s.model_config.vocab_size == len(s.tokens.keep) < 1000
    # The same vectors as the BiLSTM's table (same tokens, same PCA), pad row zero.
    assert torch.equal(s.model.embed.weight, twin.model.embed.weight)
    assert s.model.embed.weight[s.tokens.pad_id].abs().sum() == 0 and s.model.embed.weight.std() > 0.5
    assert frozen_embeddings(cfg) and s.cfg.engine.schedule == "linear" and s.projection is None
    table = s.model.embed.weight.detach().clone()
    head = s.model.head[0].weight.detach().clone()
    batch = next(trainer.train_batches(s, tiny_scored_dir, seed=0))
    (phase,) = phases("joint", LossWeights(kd=1.0, ce=1.0), 1, s.family.param_groups(s.model).keys())
    trainer.fit(s, phase, [batch])
    assert torch.equal(s.model.embed.weight, table) and not torch.equal(s.model.head[0].weight, head)


def test_word_tokens_take_the_bilstms_word_vectors(tiny_scored_dir):
    values = dict(vocab={"tokens": "words"}, threads=1, model={"embed_dim": 16, "hidden": 8})
    s = setup(StudentConfig(student="static", **values), tiny_scored_dir)
    twin = setup(StudentConfig(student="bilstm", **values), tiny_scored_dir)
    assert s.tokens.kind == "words" and s.tokens.vocab == twin.tokens.vocab
    assert torch.equal(s.model.embed.weight, twin.model.embed.weight) and s.model.embed.weight.std() > 0.5


def test_repr_across_widths_goes_through_a_projection_and_the_progressive_schedule_runs(tiny_scored_dir):
    s = setup(StudentConfig(student="static", threads=1, phases="progressive", model={"embed_dim": 16,
                                                                                       "hidden": 12}),
              tiny_scored_dir)
    assert s.projection is not None and s.projection.in_features == 12
    groups = list(s.family.param_groups(s.model))
    assert groups == ["embeddings", "head", "classifier"]
    plan = phases("progressive", LossWeights.of(s.cfg), 1, groups)
    assert plan[0].trainable == ("embeddings", "head") and plan[-1].trainable == ("embeddings", "head", "classifier")


@pytest.mark.parametrize("values, message", [
    ({"preset": "tang"}, "the static student has no presets"),
    ({"losses": {"pkd": 1.0}}, "pkd loss needs a transformer student"),
    ({"model": {"head_dim": 8}}, r"unknown static setting\(s\) \['head_dim'\]"),
    ({"model": {"pooling": "sum"}}, "static student: pooling must be one of"),
])
def test_settings_that_do_not_fit_are_refused_with_the_remedy(tiny_scored_dir, values, message):
    with pytest.raises(UserError, match=message):
        setup(StudentConfig(student="static", threads=1, **values), tiny_scored_dir)


# --------------------------------------------------------------------------- a trained student, shipped


@pytest.fixture(scope="module")
def shipped_static(tmp_path_factory, sst2_dir, sst2_dev200):
    """(the `transferset train` output of the shipped static student, its ONNX export)."""
    _, scored_dir = scored(tmp_path_factory, sst2_dir)
    run = trained(tmp_path_factory, "static", scored_dir, sst2_dev200)
    out = tmp_path_factory.mktemp("static_onnx") / "onnx"
    assert main(["export", "--model", str(run), "--output", str(out), "--format", "onnx"]) == 0
    return str(run), str(out)


def test_train_saves_a_student_that_loads_with_identical_predictions(shipped_static, sst2_dev200, tmp_path):
    run, _ = shipped_static
    metrics = json.loads(open(f"{run}/{schema.METRICS_FILE}").read())
    assert metrics["student"] == "static" and metrics["model_config"]["pooling"] == "mean+max"
    texts, _ = dev_rows(sst2_dev200, 200)
    student = Student.from_pretrained(run)
    assert student.family.name == "static" and isinstance(student.model, static.Static)
    before = student.logits(texts)
    assert len(set(np.round(before[:, 0], 5))) > 20  # not a constant function
    student.save_pretrained(str(tmp_path / "again"))
    assert np.array_equal(Student.from_pretrained(str(tmp_path / "again")).logits(texts), before)


def test_the_onnx_export_matches_pytorch_and_evaluates_alike(shipped_static, sst2_dev200):
    run, exported = shipped_static
    texts, _ = dev_rows(sst2_dev200, 200)
    ours, onnx = Student.from_pretrained(run), Student.from_pretrained(exported)
    assert isinstance(onnx, OnnxStudent) and onnx.family_name == "static"
    E, H = ours.config.embed_dim, ours.config.hidden
    for texts_b, batch_size in ((None, 64), (texts[::-1], 64), (None, 1)):
        ref = ours.logits(texts, texts_b)
        got = onnx.logits(texts, texts_b, batch_size=batch_size)
        # ONNX Runtime's kernels against PyTorch's, in other batches: a mean over up to 64 tokens, the head's
        # 2E-wide sum and the classifier's (tests/tolerances.py).
        np.testing.assert_allclose(got, ref, atol=reordered(ref, terms=max(64, 2 * E, H), reductions=3), rtol=0)
    assert onnx.predict(texts).labels == ours.predict(texts).labels
    assert evaluate(exported, sst2_dev200) == {**evaluate(run, sst2_dev200), "data": sst2_dev200}


def test_predict_writes_the_students_labels_from_the_export(shipped_static, sst2_dev200, tmp_path, capsys):
    run, exported = shipped_static
    out = tmp_path / "preds"
    assert main(["predict", "--model", exported, "--input", sst2_dev200, "--output", str(out)]) == 0
    assert "200 predicted" in capsys.readouterr().out
    rows = [r for f in sorted((out / schema.DATA_DIR).glob("*.parquet")) for r in pq.read_table(f).to_pylist()]
    texts = [r[schema.TEXT] for r in rows]
    assert sorted(texts) == sorted(dev_rows(sst2_dev200, 200)[0])
    assert [r[schema.PREDICTED_LABEL] for r in rows] == Student.from_pretrained(run).predict(texts).labels


def test_the_static_family_shares_the_bilstms_file_format():
    assert static.FAMILY.save is bilstm.save and static.FAMILY.tokens == bilstm.FAMILY.tokens


def test_the_int8_export_quantizes_the_table_and_the_mlp_within_its_tolerance(shipped_static, sst2_dev200, tmp_path):
    import onnx

    from students.compress.export import INT8_TOLERANCE
    from students.student import ONNX_FILE

    run, _ = shipped_static
    out = tmp_path / "int8"
    assert main(["export", "--model", run, "--output", str(out), "--quantize", "int8"]) == 0
    kinds = [n.op_type for n in onnx.load(str(out / ONNX_FILE)).graph.node]
    # The embedding table stored in int8 (dequantized as it is read) and the MLP's matrix products in int8.
    assert "DequantizeLinear" in kinds and "MatMulInteger" in kinds
    texts, _ = dev_rows(sst2_dev200, 200)
    ref = Student.from_pretrained(run).logits(texts)
    got = Student.from_pretrained(str(out)).logits(texts)
    # The export's own bound (students/compress/export.py), in units of the range of PyTorch's logits.
    assert np.abs(got - ref).max() <= INT8_TOLERANCE * max(1.0, float(ref.max() - ref.min()))
