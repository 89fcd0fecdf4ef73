"""Building students from a scored set: the family registry, tokens, teacher initialisation, PKD columns."""
import pytest
import torch

from students import build, families, seeds, trainer
from students.build import FAMILIES, setup
from students.losses import LossWeights
from students.phases import phases
from students.trainer import make_optimizer
from transferset.config import OptimConfig, StudentConfig
from transferset.contract import schema
from transferset.runtime.errors import UserError
from transferset.training.optimizers import Optimizers


def test_one_registry_knows_every_family_and_names_them_on_a_typo():
    assert set(FAMILIES) == {"bilstm", "static", "transformer"}
    assert {name: f.default_lr for name, f in FAMILIES.items()} == {"bilstm": 2e-3, "static": 2e-3, "transformer": 1e-4}
    with pytest.raises(UserError, match=r"unknown student family 'lstm'; known: bilstm, static, transformer"):
        build.family("lstm")


@pytest.mark.parametrize("values, lr", [
    ({"student": "bilstm"}, 2e-3),
    ({"student": "transformer", "model": {"n_layer": 1}}, 1e-4),
    ({"student": "bilstm", "optim": OptimConfig(lr=0.01)}, 0.01),
])
def test_the_learning_rate_is_the_familys_default_unless_set(tiny_scored_dir, values, lr):
    s = setup(StudentConfig(vocab={"embed_init": "random"}, **values), tiny_scored_dir)
    assert make_optimizer(s, list(s.model.parameters())).param_groups[0]["lr"] == lr


def test_transformer_student_is_a_hugging_face_model_from_the_teachers_layers(tiny_scored_dir, tiny_teacher4):
    from transformers import AutoModelForSequenceClassification, BertForSequenceClassification

    s = setup(StudentConfig(student="transformer", losses={"ce": 1.0, "mse": 1.0, "pkd": 1.0}, model={"n_layer": 2}), tiny_scored_dir)
    assert isinstance(s.model, BertForSequenceClassification)
    assert s.model.config.num_hidden_layers == 2 and s.model.config.id2label == {0: "0", 1: "1"}
    assert s.model_config.teacher_layers == 4 and s.model_config.init == "skip"
    teacher = AutoModelForSequenceClassification.from_pretrained(tiny_teacher4)
    # skip: student layers 1, 2 ← teacher layers 2, 4
    torch.testing.assert_close(s.model.bert.encoder.layer[0].attention.self.query.weight,
                               teacher.bert.encoder.layer[1].attention.self.query.weight)
    torch.testing.assert_close(s.model.bert.encoder.layer[1].attention.self.query.weight,
                               teacher.bert.encoder.layer[3].attention.self.query.weight)
    # The teacher's whole vocabulary (no trimming), so the saved directory is a plain HF model.
    assert s.tokens.keep is None and s.tokens.vocab_size == teacher.config.vocab_size
    # PKD: teacher layer 2 is a column of its own, layer 4 (the last) is teacher_hidden.
    assert s.pkd_columns == [schema.hidden_layer_column(2), schema.TEACHER_HIDDEN]


def test_a_transformer_student_copies_the_teacher_layers_its_init_names(tiny_scored_dir, tiny_teacher4):
    from transformers import AutoModelForSequenceClassification

    s = setup(StudentConfig(student="transformer", losses={"kd": 1.0}, model={"n_layer": 2, "init": [1, 3]}),
              tiny_scored_dir)
    teacher = AutoModelForSequenceClassification.from_pretrained(tiny_teacher4)
    for j, k in enumerate([1, 3]):
        torch.testing.assert_close(s.model.bert.encoder.layer[j].output.dense.weight,
                                   teacher.bert.encoder.layer[k - 1].output.dense.weight)
    assert not torch.equal(s.model.bert.encoder.layer[1].output.dense.weight,
                           teacher.bert.encoder.layer[3].output.dense.weight)  # not the skip rule's layer 4
    with pytest.raises(UserError, match="names 3 teacher layers for a 2-layer student"):
        setup(StudentConfig(student="transformer", model={"n_layer": 2, "init": "1,2,3"}), tiny_scored_dir)


def test_bilstm_trims_the_vocabulary_and_random_init_differs_by_seed(tiny_scored_dir):
    a = setup(StudentConfig(model={"embed_dim": 8, "hidden": 8}, vocab={"embed_init": "random", "trim_vocab": True}, seed=0),
              tiny_scored_dir)
    assert a.tokens.keep is not None and a.model.embed.num_embeddings == len(a.tokens.keep) < a.tokens.tokenizer.vocab_size
    full = setup(StudentConfig(model={"embed_dim": 8, "hidden": 8}, vocab={"embed_init": "random"}), tiny_scored_dir)
    assert full.tokens.keep is None and full.model.embed.num_embeddings == full.tokens.tokenizer.vocab_size
    b = setup(StudentConfig(model={"embed_dim": 8, "hidden": 8}, vocab={"embed_init": "random", "trim_vocab": True}, seed=0),
              tiny_scored_dir)
    c = setup(StudentConfig(model={"embed_dim": 8, "hidden": 8}, vocab={"embed_init": "random", "trim_vocab": True}, seed=1),
              tiny_scored_dir)
    assert torch.equal(a.model.lstm.weight_ih_l0, b.model.lstm.weight_ih_l0)
    assert not torch.equal(a.model.lstm.weight_ih_l0, c.model.lstm.weight_ih_l0)


def test_setup_leaves_the_callers_random_state_and_threads_alone(tiny_scored_dir):
    threads = torch.get_num_threads()
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    setup(StudentConfig(student="transformer", model={"n_layer": 1, "init": "random"}), tiny_scored_dir)
    assert torch.equal(torch.rand(3), expected)
    assert torch.get_num_threads() == threads


def test_pkd_refuses_a_set_without_the_layers_it_needs(tiny_scored_dir):
    with pytest.raises(UserError) as err:
        setup(StudentConfig(student="transformer", losses={"ce": 1.0, "mse": 1.0, "pkd": 1.0}, model={"n_layer": 4, "init": "first"}), tiny_scored_dir)
    msg = str(err.value)
    assert "layers [1, 2, 3, 4]" in msg and "has layers [2, 4]" in msg and "--layers 1,2,3,4" in msg


@pytest.mark.parametrize("values, message", [
    ({"student": "transformer", "vocab": {"tokens": "words"}}, "the transformer student uses the teacher's WordPiece tokens"),
    ({"student": "transformer", "preset": "tang"}, "preset 'tang' is not a transformer preset"),
    ({"student": "transformer", "model": {"shape": "tang"}}, "unknown transformer setting(s) ['shape']"),
    ({"student": "transformer", "model": {"n_layer": 5}}, "a 5-layer student cannot take layers from a 4-layer"),
    ({"student": "transformer", "model": {"d_model": 8}}, "unknown transformer setting(s) ['d_model']"),
    ({"student": "bilstm", "losses": {"ce": 1.0, "mse": 1.0, "pkd": 1.0}}, "pkd loss needs a transformer student"),
    ({"student": "bilstm", "model": {"hiden": 3}}, "unknown BiLSTM setting(s) ['hiden']"),
    ({"student": "transformer", "vocab": {"embed_init": "model2vec"}}, "a transformer student takes embed_init: teacher or"),
])
def test_setup_refuses_settings_that_do_not_fit_the_family(tiny_scored_dir, values, message):
    with pytest.raises(UserError) as err:
        setup(StudentConfig(**values), tiny_scored_dir)
    assert message in str(err.value)


@pytest.mark.parametrize("method", ["word2vec", "model2vec"])
def test_bilstm_word_vectors_come_from_embed_init_over_the_kept_ids_and_stay_frozen(tiny_scored_dir, tiny_teacher4,
                                                                                    method):
    from students.data import iter_texts
    from students.data.vectors import embedding_table

    cfg = StudentConfig(model={"embed_dim": 8, "hidden": 8}, vocab={"embed_init": method, "trim_vocab": True}, seed=2)
    s = setup(cfg, tiny_scored_dir)
    init_seed = seeds.torch_seed(seeds.stream(2, seeds.INIT))  # what setup hands the family
    table = embedding_table(s.tokens.tokenizer, tiny_teacher4, 8, method, iter_texts(tiny_scored_dir), init_seed)
    expected = table[torch.tensor(s.tokens.keep)]
    expected[s.tokens.pad_id] = 0
    assert torch.allclose(s.model.embed.weight, expected, atol=1e-5)
    assert families.frozen_embeddings(cfg)


@pytest.mark.parametrize("student", ["bilstm", "static"])
def test_contextual_vectors_are_pcad_after_trimming_like_the_teachers_rows(tiny_scored_dir, tiny_teacher4, student):
    from students.data import iter_texts
    from students.data.tokens import pca_project
    from students.data.vectors import contextual_table

    cfg = StudentConfig(student=student, model={"embed_dim": 8, "hidden": 8}, vocab={"embed_init": "contextual", "trim_vocab": True}, seed=2)
    s = setup(cfg, tiny_scored_dir)
    init_seed = seeds.torch_seed(seeds.stream(2, seeds.INIT))
    wide = contextual_table(s.tokens.tokenizer, tiny_teacher4, iter_texts(tiny_scored_dir), s.tokens.max_length)
    expected = pca_project(wide[torch.tensor(s.tokens.keep)], 8, init_seed)
    expected[s.tokens.pad_id] = 0
    signs = torch.sign((s.model.embed.weight.detach() * expected).sum(0))  # a principal axis up to its sign
    assert torch.allclose(s.model.embed.weight.detach(), expected * signs, atol=1e-4)
    assert families.frozen_embeddings(cfg)


@pytest.mark.parametrize("student", ["bilstm", "static"])
def test_a_sparse_table_learns_by_lazy_adam_only_in_the_rows_a_batch_used(tiny_scored_dir, student):
    cfg = StudentConfig(student=student, model={"embed_dim": 8, "hidden": 8, "sparse": True}, vocab={"embed_init": "random"},
                        optim=OptimConfig(lr=0.01, embed_lr=0.003), threads=1)
    s = setup(cfg, tiny_scored_dir)
    opt = make_optimizer(s, list(s.model.parameters()))
    assert isinstance(opt, Optimizers) and [type(o).__name__ for o in opt.optimizers] == ["SparseAdam", "AdamW"]
    assert [g["lr"] for g in opt.param_groups] == [0.003, 0.01] and opt.param_groups[0]["params"] == [s.model.embed.weight]
    batch = next(trainer.train_batches(s, tiny_scored_dir, seed=0))
    used = torch.zeros(s.model_config.vocab_size, dtype=torch.bool)
    used[batch["ids"].flatten()] = True
    table = s.model.embed.weight.detach().clone()
    (phase,) = phases("joint", LossWeights(kd=1.0, ce=1.0), 1, s.family.param_groups(s.model).keys())
    trainer.fit(s, phase, [batch])  # grad_clip 1.0 (the default): clipped with the sparse gradient
    moved = (s.model.embed.weight.detach() != table).any(dim=1)
    assert torch.equal(moved, used & (torch.arange(len(used)) != s.tokens.pad_id))  # those rows, every one of them


@pytest.mark.parametrize("student", ["bilstm", "static"])
def test_a_sparse_table_that_is_kept_fixed_is_refused(tiny_scored_dir, student):
    with pytest.raises(UserError, match=r"model: \{sparse: true\} is for a word table that trains; .*"
                                         "freeze_embeddings: false"):
        setup(StudentConfig(student=student, model={"embed_dim": 8, "hidden": 8, "sparse": True}, threads=1),
              tiny_scored_dir)


def test_embed_lr_gives_the_table_its_own_optimizer_group(tiny_scored_dir):
    s = setup(StudentConfig(model={"embed_dim": 8, "hidden": 8}, vocab={"embed_init": "random"},
                            optim=OptimConfig(lr=0.01, embed_lr=0.001)),
              tiny_scored_dir)
    groups = make_optimizer(s, list(s.model.parameters())).param_groups
    assert [g["lr"] for g in groups] == [0.01, 0.001]
    assert groups[1]["params"] == [s.model.embed.weight]
    assert sum(len(g["params"]) for g in groups) == len(list(s.model.parameters()))
