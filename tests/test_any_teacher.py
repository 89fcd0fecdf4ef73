"""Students on any tokenizer: a tiny random teacher of each encoder family (transferset.testing.FAMILIES:
WordPiece, byte-level BPE and SentencePiece-like Unigram tokenizers trained on SST-2 sentences) through
augment → score → train → evaluate → export → predict with the BiLSTM, and the transformer student cut from
each family's teacher trained, saved and predicting.

One augment run (the CLI, on Beam) serves every family: its ops read no model. A Beam score run costs
seconds of graph construction and runner start whatever the teacher, so each family's set is scored in this
process by the score stage's own parts (the plan and its checks, the pipeline's model handler, the shard
writer), and `test_score_pipeline_gives_the_in_process_scores` shows, for a byte-level BPE teacher, that the
Beam pipeline writes the same set. The later stages are the functions the commands call (the CLI's parser
costs a second a call here; tests/test_remote_chain.py runs them through it). Scoring takes the padded path
for all but BERT (transferset/packed.py serves BERT only).
"""
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

import builders as testing
from transferset import fs
from transferset.app.cli import main
from transferset.contract import schema
from transferset.data import transfer
from tolerances import assert_reordered, tiny_bert

# Whole pipelines (augment, score) and training: `integration`, run by `make test` and CI.
pytestmark = pytest.mark.integration

FAMILIES = tuple(testing.FAMILIES)
TRAIN_ROWS, DEV_ROWS, MAX_LENGTH = 24, 24, 32
LAYERS = (-1, 2)  # teacher_hidden and teacher_hidden_l2: the pkd targets of a 2-layer student of a 4-layer teacher
# The large-vocabulary kinds (byte-level BPE, Unigram: 50k-250k pieces in real checkpoints) train trimmed.
TRIMMED = {f for f, kind in testing.FAMILIES.items() if kind != "wordpiece"}
STUDENT = {"epochs": 1, "batch_size": 32, "threads": 1, "report": {"latency_examples": 1, "agreement_rows": 64},
           "data": {"max_length": MAX_LENGTH}}
BILSTM = testing.small_student(16, **STUDENT, student="bilstm", model={"head_dim": 16})
# A 2-layer student cut from the 4-layer teacher (skip: layers 2 and 4) on every loss at once, in one phase:
# TinyBERT's preset (embedding, hidden and attention-score MSE, KD) with MiniLM's attention and value-relation
# KL, DistilBERT's cosine and PKD, the layer losses against the teacher run alongside.
LOSSES = {"emb_mse", "hidden_mse", "att_mse", "att_kl", "value_kl", "cos", "kd", "pkd"}
TRANSFORMER = {**STUDENT, "student": "transformer", "preset": "tinybert", "phases": "joint",
               "losses": {"att_kl": 1.0, "value_kl": 1.0, "cos": 1.0, "pkd": 1.0}, "optim": {"lr": 1e-3},
               "model": {"n_layer": 2}}


def _head(src: Path, dst: Path, n: int) -> str:
    dst.write_text("".join(src.read_text(encoding="utf-8").splitlines(keepends=True)[:n + 1]), encoding="utf-8")
    return str(dst)


def _dev_rows(path: str) -> tuple[list[str], list[int]]:
    lines = Path(path).read_text(encoding="utf-8").splitlines()[1:]
    return [ln.split("\t")[0] for ln in lines], [int(ln.split("\t")[1]) for ln in lines]


def score_in_process(input_dir: str, teacher_dir: str, output: str) -> str:
    """`transferset score --layers=-1,2 --max-length 32` without Beam: the same plan, model handler and shards."""
    from pipelines.score import TeacherModelHandler
    from transferset.config import ScoreConfig
    from transferset.scored import plan as score_plan
    from transferset.scored import shards

    job = score_plan.ScoreJob(input=input_dir, teacher=teacher_dir, output=output,
                              cfg=ScoreConfig(layers=LAYERS, max_length=MAX_LENGTH))
    out = score_plan.output(output, input=input_dir, teacher=teacher_dir)
    with out.open():
        p = score_plan.plan(job)
        handler = TeacherModelHandler(teacher_dir, layers=p.layers, max_length=p.max_length,
                                      sha256=p.metadata[schema.META_TEACHER_SHA256])
        model = handler.load_model()
        rows = [row for path in p.input_files for _, (row, *_) in shards.read_input_rows(path)]
        shards.write_shard(p.data_dir, p.prefix, handler.run_inference(rows, model), p.output_schema)
        fs.write_text(fs.join(output, schema.COMPLETE_MARKER), "")
    return output


@pytest.fixture(scope="module")
def data(tmp_path_factory, sst2_dir):
    """A few dozen SST-2 rows and their transfer set (mask and n-gram variants, the dev rows excluded)."""
    root = tmp_path_factory.mktemp("any_teacher")
    train = _head(sst2_dir / "train.tsv", root / "train.tsv", TRAIN_ROWS)
    dev = _head(sst2_dir / "dev.tsv", root / "dev.tsv", DEV_ROWS)
    out = str(root / "transfer")
    assert main(["augment", "--input", train, "--exclude", dev, "--output", out, "--ops", "mask,ngram",
                 "--n-iter", "2", "--seed", "1", "--runner", "FnApiRunner"]) == 0
    return {"root": root, "train": train, "dev": dev, "transfer": out}


@pytest.fixture(scope="module")
def scored(data, family_teacher):
    """family → its teacher's scored set, scored once."""
    done = {}

    def get(family: str) -> str:
        if family not in done:
            done[family] = score_in_process(data["transfer"], family_teacher(family),
                                            str(data["root"] / f"scored_{family}"))
        return done[family]

    return get


def _by_id(directory: str) -> dict:
    return {r[schema.ID]: r for r in transfer.read_table(directory).to_pylist()}


def test_score_pipeline_gives_the_in_process_scores(data, scored, family_teacher):
    family = "roberta"
    out = str(data["root"] / f"beam_{family}")
    assert main(["score", "--input", data["transfer"], "--teacher", family_teacher(family), "--output", out,
                 "--max-length", str(MAX_LENGTH), f"--layers={','.join(map(str, LAYERS))}",
                 "--runner", "FnApiRunner"]) == 0
    beam, ours = _by_id(out), _by_id(scored(family))
    assert beam.keys() == ours.keys() and len(beam) > TRAIN_ROWS
    for column in (schema.TEACHER_LOGITS, schema.TEACHER_HIDDEN, schema.hidden_layer_column(2)):
        # Beam's batches against the in-process ones: reordered sums through the 4-layer family teacher
        # (tests/tolerances.py); the float16 hidden columns may round to the neighbouring float16 (2**-10 relative)
        want = np.asarray([ours[i][column] for i in sorted(beam)], dtype=np.float32)
        np.testing.assert_allclose([beam[i][column] for i in sorted(beam)], want,
                                   rtol=0 if column == schema.TEACHER_LOGITS else 2.0 ** -10,
                                   atol=tiny_bert(want, layers=4))
    meta, theirs = transfer.read_metadata(out, scored=True), transfer.read_metadata(scored(family), scored=True)
    for key in (schema.META_TOKENIZER, schema.META_HIDDEN_SPEC, schema.META_TEACHER_SHA256, schema.META_MAX_LENGTH):
        assert meta[key] == theirs[key]


def _check_scores(scored_dir: str, teacher_dir: str):
    """The scored logits are the teacher's own forward on the same rows (the padded path, any family)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(teacher_dir)
    rows = transfer.read_table(scored_dir).to_pylist()[:6]
    teacher = AutoModelForSequenceClassification.from_pretrained(teacher_dir).eval()
    with torch.no_grad():
        ref = teacher(**tok([r[schema.TEXT] for r in rows], padding=True, truncation=True, max_length=MAX_LENGTH,
                            return_tensors="pt")).logits.numpy()
    assert_reordered([r[schema.TEACHER_LOGITS] for r in rows], ref, layers=4)  # reordered sums (tests/tolerances.py)
    return tok


def _train(scored_dir: str, dev: str, out: Path, settings: dict) -> dict:
    from students.trainer import train
    from transferset.config import StudentConfig
    from transferset.runtime import typed

    return train(typed.load(StudentConfig, settings, "test"), scored_dir, dev, str(out), progress=False)


def _predict(model: str, dev: str, out: Path) -> list[str]:
    """`transferset predict` in process (the labels, in input order)."""
    from students.predict import load_predictor, predict_files

    stats = predict_files(load_predictor(model), [dev], str(out), model=model, progress=False)
    assert stats["predicted"] == DEV_ROWS and stats["rejected"] == 0
    return _predicted(out)


def _declared_inputs(tok) -> list[str]:
    """The arrays the family's tokenizer emits: the inputs an export declares (token_type_ids only where it has them)."""
    return [n for n in ("input_ids", "attention_mask", "token_type_ids") if n in tok(["a"], ["b"])]


def _predicted(pred_dir: Path) -> list[str]:
    files = sorted((pred_dir / schema.DATA_DIR).glob("*.parquet"))
    rows = [r for f in files for r in pq.read_table(f).to_pylist()]
    rows.sort(key=lambda r: r[schema.INPUT_LINE])
    return [r[schema.PREDICTED_LABEL] for r in rows]


@pytest.mark.parametrize("family", FAMILIES)
def test_bilstm_on_each_family_score_train_evaluate_export_predict(family, data, scored, family_teacher, tmp_path):
    from students.compress.export import export
    from students.data.tokens import pca_project, teacher_input_embeddings
    from students.evaluate import evaluate
    from students.student import Student

    teacher_dir = family_teacher(family)
    scored_dir = scored(family)
    tok = _check_scores(scored_dir, teacher_dir)
    out = tmp_path / "bilstm"
    _train(scored_dir, data["dev"], out, {**BILSTM, "vocab": {"trim_vocab": family in TRIMMED}})
    student = Student.from_pretrained(str(out))
    tokens = student.tokens
    assert tokens.tokenizer.get_vocab() == tok.get_vocab()  # the teacher's tokenizer, whatever its kind

    # The table: one row per token (or per token the transfer set uses), the teacher's input embeddings (cut to
    # its tokenizer: DeBERTa-v3 and ModernBERT have more rows) projected by PCA, kept frozen.
    table = teacher_input_embeddings(teacher_dir, len(tok))
    if family in TRIMMED:
        assert tokens.keep is not None and len(tokens.keep) == tokens.vocab_size < len(tok)
        table = table[torch.tensor(tokens.keep)]
    else:
        assert tokens.keep is None and tokens.vocab_size == len(tok)
    expected = pca_project(table, 16, 0)
    expected[tokens.pad_id] = 0
    torch.testing.assert_close(student.model.embed.weight.detach(), expected)

    # Pieces of the family's kind; a byte-level BPE never needs an unknown piece.
    pieces = tok.tokenize("a gripping film")
    kind = testing.FAMILIES[family]
    assert any(p.startswith({"bpe": "Ġ", "unigram": "▁", "wordpiece": "##"}[kind]) for p in pieces) or kind == "wordpiece"
    if kind == "bpe":
        assert tok.unk_token_id not in tok("Zürich ☃ naïve")["input_ids"]

    texts, labels = _dev_rows(data["dev"])
    evaluated = evaluate(str(out), data["dev"])
    mine = student.predict_ids(texts)
    assert evaluated["rows"] == DEV_ROWS
    assert evaluated["accuracy"] == pytest.approx(float(np.mean(mine == np.array(labels))))

    onnx_dir = tmp_path / "onnx"
    assert export(str(out), str(onnx_dir))["inputs"] == _declared_inputs(tok)
    exported = Student.from_pretrained(str(onnx_dir))
    assert_reordered(exported.logits(texts), student.logits(texts), layers=4)  # reordered sums (tests/tolerances.py)
    assert _predict(str(onnx_dir), data["dev"], tmp_path / "pred") == [student.label_names[i] for i in mine]


@pytest.mark.parametrize("family", FAMILIES)
def test_transformer_student_cut_from_each_family_trains_and_predicts(family, data, scored, family_teacher, tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from students.student import Student

    out = tmp_path / "transformer"
    metrics = _train(scored(family), data["dev"], out, TRANSFORMER)
    assert np.isfinite(metrics["history"][0]["train_loss"]) and set(metrics["history"][0]["losses"]) == LOSSES
    assert all(np.isfinite(v) for v in metrics["history"][0]["losses"].values())
    # A plain Hugging Face model of the teacher's family with 2 layers, and its tokenizer, beside it.
    model_dir = out / schema.STUDENT_MODEL_DIR
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    teacher = AutoModelForSequenceClassification.from_pretrained(family_teacher(family))
    assert type(model) is type(teacher) and model.config.num_hidden_layers == 2
    tok = AutoTokenizer.from_pretrained(model_dir)
    texts, _ = _dev_rows(data["dev"])
    with torch.no_grad():
        ref = model(**tok(texts, padding=True, truncation=True, return_tensors="pt")).logits.numpy()
    student = Student.from_pretrained(str(out))
    assert_reordered(student.logits(texts), ref, layers=4)  # reordered sums (tests/tolerances.py)
    assert _predict(str(out), data["dev"], tmp_path / "pred") == [model.config.id2label[int(i)] for i in ref.argmax(1)]
