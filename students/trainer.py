"""Train a student from a scored transfer set: setup → data → loss step → train → evaluate → save.

The teacher never runs here: its logits and hidden states come from the Parquet cache, read in
streaming record batches through a bounded shuffle buffer, so memory stays flat however large
the transfer set is. Both student families share this loop; what differs (the model, its
parameter groups, what it is initialised from) lives in `students/bilstm.py` and
`students/transformer.py`.
"""
from __future__ import annotations

import copy
import json
import math
import os
import random
import time
from dataclasses import asdict, dataclass
from typing import Any, Iterator, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
from tqdm import tqdm

from students import bilstm, transformer
from students.losses import NO_LABEL, TEACHER_LAYERS, LossWeights, combine
from students.schedules import SCHEDULES, Phase, phases
from students.tokens import (WordPieceTokens, WordTokens, load_tokens, pca_project, teacher_input_embeddings,
                             teacher_state, word_vectors_from_wordpiece)
from transferset import __version__, schema, sources, transfer
from transferset import config as config_lib
from transferset.config import StudentConfig
from transferset.errors import UserError
from transferset.timing import ms_per_example

MODEL_DIR = "model"
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.json"
CURVES_FILE = "curves.png"
FAMILIES = ("bilstm", "transformer")
DEFAULT_LR = {"bilstm": 2e-3, "transformer": 1e-4}


# --------------------------------------------------------------------------- setup


@dataclass
class EvalData:
    """A labeled evaluation set held in memory (dev sets are small)."""

    texts: list[str]
    texts_b: Optional[list[Optional[str]]]
    labels: np.ndarray                       # (N,) gold label index, NO_LABEL where unknown
    teacher_labels: Optional[np.ndarray]     # (N,) when the data holds teacher columns
    path: str


def _scored_parquet(path: str) -> Optional[list[str]]:
    """The Parquet files of `path` when it is a transfer-set directory or a .parquet file, else None."""
    if os.path.isdir(path):
        return transfer.data_files(path)
    if path.lower().endswith(".parquet"):
        try:
            meta = pq.read_schema(path).metadata or {}
        except (OSError, pa.ArrowInvalid) as exc:
            raise UserError(f"{path}: cannot read as Parquet: {exc}") from exc
        if schema.META_SCHEMA_VERSION.encode() in meta:
            return [path]
    return None


def read_eval_data(path: str, label_names: Sequence[str], *, text_column: Optional[str] = None,
                   label_column: str = sources.DEFAULT_LABEL_COLUMN, text_b_column: Optional[str] = None) -> EvalData:
    """Read a labeled file (TSV/CSV/JSONL/Parquet) or a transferset Parquet set for evaluation.

    Refuses data whose labels are not among `label_names` (the transfer set's / the model's).
    """
    files = _scored_parquet(path)
    if files is not None:
        meta = (transfer.read_metadata(path) if os.path.isdir(path)
                else schema.check_schema(pq.read_schema(path), where=path))
        theirs = list(meta.get(schema.META_LABEL_NAMES) or [])
        if theirs != list(label_names):
            raise UserError(f"{path}: label names {theirs} differ from the transfer set's / model's "
                            f"{list(label_names)}; evaluate on data with the same label set")
        cols = [schema.TEXT, schema.TEXT_B, schema.LABEL]
        has_teacher = schema.TEACHER_LABEL in pq.read_schema(files[0]).names
        table = pa.concat_tables(pq.read_table(f, columns=cols + ([schema.TEACHER_LABEL] if has_teacher else []))
                                 for f in files)
        labels = table.column(schema.LABEL).fill_null(NO_LABEL).to_numpy().astype(np.int64)
        texts_b = table.column(schema.TEXT_B).to_pylist()
        return EvalData(texts=table.column(schema.TEXT).to_pylist(),
                        texts_b=texts_b if any(t is not None for t in texts_b) else None,
                        labels=labels,
                        teacher_labels=(table.column(schema.TEACHER_LABEL).to_numpy().astype(np.int64)
                                        if has_teacher else None),
                        path=path)
    found = sources.infer_label_names(path, label_column)
    extra = sorted(set(found) - set(label_names))
    if extra:
        raise UserError(f"{path}: label names {list(found)} differ from the transfer set's / model's "
                        f"{list(label_names)} ({extra} unknown); use data with the same label set")
    spec = sources.SourceSpec(path=path, text_column=text_column, label_column=label_column,
                              text_b_column=text_b_column, label_names=tuple(label_names))
    texts, texts_b, labels, rejects = [], [], [], []
    for rec in sources.read_source(spec):
        if isinstance(rec, sources.Reject):
            rejects.append(rec)
        else:
            texts.append(rec.text)
            texts_b.append(rec.text_b)
            labels.append(rec.label)
    if not texts:
        raise UserError(sources.summarize_rejects(path, rejects))
    if rejects:
        tqdm.write(f"{path}: skipped {len(rejects)} bad row(s), e.g. line {rejects[0].line}: {rejects[0].reason}")
    return EvalData(texts, texts_b if text_b_column else None, np.asarray(labels, dtype=np.int64), None, path)


def _existing_dir(value: Any) -> Optional[str]:
    return value if isinstance(value, str) and os.path.isdir(value) else None


def resolve_teacher_dir(cfg: StudentConfig, meta: dict) -> Optional[str]:
    return cfg.teacher or _existing_dir(meta.get(schema.META_TEACHER_ID))


def resolve_tokenizer_dir(cfg: StudentConfig, meta: dict) -> str:
    for candidate in (cfg.tokenizer, meta.get(schema.META_TOKENIZER), resolve_teacher_dir(cfg, meta)):
        if _existing_dir(candidate):
            return candidate
    if isinstance(meta.get(schema.META_TOKENIZER), str):
        return meta[schema.META_TOKENIZER]  # maybe a cached hub name; WordPieceTokens explains a failure
    raise UserError("the transfer set names no tokenizer directory; set `tokenizer: PATH` (the teacher's "
                    "directory) in the --config YAML, or `tokens: words`")


def _pkd_columns(transfer_dir: str, names: Sequence[str], meta: dict, layer_map: Sequence[int]) -> list[str]:
    """The column holding teacher layer k's pooled state for each k in `layer_map`.

    `transferset score` writes the last layer to teacher_hidden and only the other layers to
    teacher_hidden_l{k}, so the last one is found through the hidden spec.
    """
    spec = meta.get(schema.META_HIDDEN_SPEC)
    main_layer = spec.get("layer") if isinstance(spec, dict) else None
    out, missing = [], []
    for k in layer_map:
        if schema.hidden_layer_column(k) in names:
            out.append(schema.hidden_layer_column(k))
        elif k == main_layer:
            out.append(schema.TEACHER_HIDDEN)
        else:
            missing.append(k)
    if missing:
        have = hidden_layer_columns(names) + ([main_layer] if main_layer is not None else [])
        raise UserError(f"{transfer_dir}: pkd needs the teacher's hidden states of layers {list(layer_map)} "
                        f"(student layer j ↔ teacher layer), the set has layers {sorted(set(have))}; rescore with "
                        f"`transferset score --layers {','.join(str(k) for k in layer_map)}`")
    return out


def hidden_layer_columns(names: Sequence[str]) -> list[int]:
    """Teacher layers k with a teacher_hidden_l{k} column, in order."""
    out = []
    for n in names:
        if n.startswith(schema.TEACHER_HIDDEN_LAYER_PREFIX):
            try:
                out.append(int(n[len(schema.TEACHER_HIDDEN_LAYER_PREFIX):]))
            except ValueError:
                pass
    return sorted(out)


@dataclass
class Setup:
    cfg: StudentConfig
    family: str
    model: torch.nn.Module
    model_config: Any
    tokens: Any
    label_names: list[str]
    meta: dict
    columns: list[str]
    pkd_columns: list[str]           # column of the teacher layer behind each student layer (PKD), else []
    num_rows: int
    num_labeled: int


def _count_rows(directory: str) -> tuple[int, int]:
    total = labeled = 0
    for rb in transfer.iter_batches(directory, [schema.LABEL], batch_size=65536):
        total += rb.num_rows
        labeled += rb.num_rows - rb.column(0).null_count
    return total, labeled


def _texts(transfer_dir: str) -> Iterator[list[str]]:
    """The set's texts (and second texts of pairs), a record batch at a time."""
    for rb in transfer.iter_batches(transfer_dir, [schema.TEXT, schema.TEXT_B], batch_size=8192):
        yield [t for col in (rb.column(0), rb.column(1)) for t in col.to_pylist() if t]


def build_tokens(cfg: StudentConfig, transfer_dir: str, meta: dict, max_length: int):
    """→ (the student's tokens, the teacher's WordPiece tokens or None when not needed)."""
    if cfg.tokens not in ("wordpiece", "words"):
        raise UserError(f"unknown tokens {cfg.tokens!r}; use wordpiece or words")
    if cfg.tokens == "words" and cfg.student == "transformer":
        raise UserError("the transformer student uses the teacher's WordPiece tokens; drop `tokens: words`")
    wordpiece = None
    if cfg.tokens == "wordpiece" or cfg.embed_init == "teacher":
        wordpiece = WordPieceTokens.from_dir(resolve_tokenizer_dir(cfg, meta), max_length)
    if cfg.tokens == "words":
        texts = (t for batch in _texts(transfer_dir) for t in batch)
        return WordTokens.build(texts, max_length, cfg.min_count, cfg.max_vocab), wordpiece
    if cfg.trim_vocab:
        return WordPieceTokens(wordpiece.tokenizer, max_length, keep=wordpiece.seen_ids(_texts(transfer_dir))), wordpiece
    return wordpiece, wordpiece


def _model_values(defaults: dict, cfg: StudentConfig, tokens, num_classes: int, known: set[str], what: str) -> dict:
    """Model settings: defaults < the config's `model:` < what the data fixes (vocabulary, classes)."""
    values = {**defaults, **cfg.model, "vocab_size": tokens.vocab_size, "num_classes": num_classes,
              "pad_id": tokens.pad_id}
    unknown = sorted(set(values) - known)
    if unknown:
        raise UserError(f"model: unknown {what} setting(s) {unknown}; known: {sorted(known)}")
    return values


def _no_teacher_dir(meta: dict, what: str, instead: str) -> UserError:
    return UserError(f"{what} needs the teacher's weights, but the transfer set's teacher_id "
                     f"{meta.get(schema.META_TEACHER_ID)!r} is not a directory: set `teacher: PATH` in --config, "
                     f"or {instead}")


def build_bilstm(cfg: StudentConfig, tokens, wordpiece, teacher_dir: Optional[str], meta: dict,
                 num_classes: int, hidden_width: int):
    if cfg.preset and cfg.preset not in bilstm.PRESETS:
        raise UserError(f"unknown bilstm preset {cfg.preset!r}; known: {', '.join(bilstm.PRESETS)}")
    if cfg.pkd:
        raise UserError("pkd loss needs a transformer student (`--student transformer`)")
    defaults = {"head_dim": hidden_width, **(bilstm.PRESETS[cfg.preset] if cfg.preset else {})}
    mcfg = bilstm.BiLSTMConfig(**_model_values(defaults, cfg, tokens, num_classes, bilstm.config_fields(), "BiLSTM"))
    model = bilstm.BiLSTM(mcfg)
    if cfg.embed_init == "teacher":
        if teacher_dir is None:
            raise _no_teacher_dir(meta, "embed_init: teacher", "`embed_init: random`")
        table = teacher_input_embeddings(teacher_dir)                      # (V_wp, H_t)
        if isinstance(tokens, WordTokens):
            table = word_vectors_from_wordpiece(tokens.vocab, wordpiece.tokenizer, table)
        elif tokens.keep is not None:
            table = table[torch.tensor(tokens.keep)]                       # (V_kept, H_t)
        model.init_embeddings(pca_project(table, mcfg.embed_dim, cfg.seed))
    elif cfg.embed_init != "random":
        raise UserError(f"unknown embed_init {cfg.embed_init!r}; use teacher or random")
    return model, mcfg, []


def build_transformer(cfg: StudentConfig, tokens, teacher_dir: Optional[str], meta: dict, num_classes: int,
                      hidden_width: int, transfer_dir: str, column_names: Sequence[str]):
    """→ (model, config, PKD columns): layers copied from the teacher unless init is random."""
    if cfg.preset:
        raise UserError(f"preset {cfg.preset!r} is a BiLSTM preset; the transformer takes `model:` settings")
    defaults: dict = {"head_dim": hidden_width}
    spec = meta.get(schema.META_HIDDEN_SPEC)
    if isinstance(spec, dict) and spec.get("num_hidden_layers"):
        defaults["teacher_layers"] = int(spec["num_hidden_layers"])
    init = cfg.model.get("init", transformer.TransformerConfig.init)
    tstate = None
    if teacher_dir is not None:
        with open(os.path.join(teacher_dir, "config.json"), encoding="utf-8") as fh:
            tconf = json.load(fh)
        defaults.update(teacher_layers=tconf["num_hidden_layers"], max_position=tconf["max_position_embeddings"],
                        type_vocab_size=tconf.get("type_vocab_size", 2), ln_eps=tconf.get("layer_norm_eps", 1e-12))
        if init != "random":
            defaults.update(d_model=tconf["hidden_size"], n_head=tconf["num_attention_heads"],
                            d_ff=tconf["intermediate_size"])
            tstate = teacher_state(teacher_dir)
            if tokens.keep is not None:
                # The trimmed vocabulary keeps the teacher's rows for the ids it kept.
                key = next(k for k in tstate if k.endswith("word_embeddings.weight"))
                tstate[key] = tstate[key][torch.tensor(tokens.keep)]
    elif init != "random":
        raise _no_teacher_dir(meta, f"init: {init}", "`model: {init: random}`")
    mcfg = transformer.TransformerConfig(**_model_values(defaults, cfg, tokens, num_classes,
                                                         transformer.config_fields(), "transformer"))
    try:
        layer_map = transformer.teacher_layer_map(mcfg.n_layer, mcfg.teacher_layers, mcfg.init)
        model = transformer.Transformer(mcfg)
        if tstate is not None:
            model.load_teacher(tstate, layer_map)
    except ValueError as exc:
        raise UserError(f"transformer student: {exc}") from exc
    pkd_columns: list[str] = []
    if cfg.pkd:
        if mcfg.d_model != hidden_width:
            raise UserError(f"pkd compares [CLS] states: the student's width {mcfg.d_model} must equal "
                            f"the teacher's {hidden_width}")
        pkd_columns = _pkd_columns(transfer_dir, column_names, meta, layer_map)
    return model, mcfg, pkd_columns


def setup(cfg: StudentConfig, transfer_dir: str) -> Setup:
    """Check the scored set, build tokens and the student (initialised from the teacher if asked)."""
    if cfg.student not in FAMILIES:
        raise UserError(f"unknown student {cfg.student!r}; known: {', '.join(FAMILIES)}")
    if cfg.schedule not in SCHEDULES:
        raise UserError(f"unknown schedule {cfg.schedule!r}; known: {', '.join(SCHEDULES)}")
    meta = transfer.read_metadata(transfer_dir, scored=True)  # refuses sets without teacher columns
    label_names = list(meta.get(schema.META_LABEL_NAMES) or [])
    if len(label_names) < 2:
        raise UserError(f"{transfer_dir}: the transfer set records label names {label_names}; "
                        "a classifier needs at least two (rebuild it with `transferset augment --labels`)")
    file_schema = pq.read_schema(transfer.data_files(transfer_dir)[0])
    logits_width = file_schema.field(schema.TEACHER_LOGITS).type.list_size
    if logits_width != len(label_names):
        raise UserError(f"{transfer_dir}: teacher_logits has {logits_width} classes but the set names "
                        f"{len(label_names)} labels {label_names}; it was scored by a teacher for another task")
    hidden_width = file_schema.field(schema.TEACHER_HIDDEN).type.list_size
    num_rows, num_labeled = _count_rows(transfer_dir)
    if num_rows == 0:
        raise UserError(f"{transfer_dir}: the transfer set has no rows")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)

    max_length = cfg.max_length or int(meta.get(schema.META_MAX_LENGTH) or 128)
    tokens, wordpiece = build_tokens(cfg, transfer_dir, meta, max_length)
    teacher_dir = resolve_teacher_dir(cfg, meta)
    if cfg.student == "bilstm":
        model, mcfg, pkd_columns = build_bilstm(cfg, tokens, wordpiece, teacher_dir, meta, len(label_names),
                                                hidden_width)
    else:
        model, mcfg, pkd_columns = build_transformer(cfg, tokens, teacher_dir, meta, len(label_names), hidden_width,
                                                     transfer_dir, file_schema.names)
    if (cfg.repr or cfg.schedule == "progressive") and mcfg.head_dim != hidden_width:
        raise UserError(f"the representation loss (repr, and stage 1 of the progressive schedule) needs the "
                        f"student's head width ({mcfg.head_dim}) to equal the teacher's hidden width "
                        f"({hidden_width}); drop the head_dim / preset override, or set repr: 0")
    columns = [schema.TEXT, schema.TEXT_B, schema.LABEL, schema.TEACHER_LOGITS, schema.TEACHER_HIDDEN]
    columns += [c for c in pkd_columns if c not in columns]
    return Setup(cfg, cfg.student, model, mcfg, tokens, label_names, meta, columns, pkd_columns,
                 num_rows, num_labeled)


# --------------------------------------------------------------------------- data


def _table_arrays(table: pa.Table, s: Setup) -> dict[str, Any]:
    """Convert one shuffle buffer to numpy once; minibatches index into it."""
    texts_b = table.column(schema.TEXT_B).to_pylist()
    out = {
        schema.TEXT: table.column(schema.TEXT).to_pylist(),
        schema.TEXT_B: texts_b if any(t is not None for t in texts_b) else None,
        schema.LABEL: table.column(schema.LABEL).fill_null(NO_LABEL).to_numpy().astype(np.int64),
        schema.TEACHER_LOGITS: transfer.fixed_list_to_numpy(table.column(schema.TEACHER_LOGITS)),
        schema.TEACHER_HIDDEN: transfer.fixed_list_to_numpy(table.column(schema.TEACHER_HIDDEN)),
    }
    if s.pkd_columns:
        out[TEACHER_LAYERS] = np.stack([transfer.fixed_list_to_numpy(table.column(c)) for c in s.pkd_columns],
                                       axis=1)                                       # (N, L, H)
    return out


def make_batch(s: Setup, arrays: dict[str, Any], idx: Sequence[int]) -> dict[str, torch.Tensor]:
    texts_b = arrays[schema.TEXT_B]
    texts = [arrays[schema.TEXT][i] for i in idx]
    ids, mask, types = s.tokens.encode(texts, [texts_b[i] for i in idx] if texts_b is not None else None)
    idx = np.asarray(idx)
    batch = {"ids": ids, "mask": mask, "type_ids": types, schema.TEXT: texts,
             schema.LABEL: torch.from_numpy(arrays[schema.LABEL][idx]),
             schema.TEACHER_LOGITS: torch.from_numpy(arrays[schema.TEACHER_LOGITS][idx]),
             schema.TEACHER_HIDDEN: torch.from_numpy(arrays[schema.TEACHER_HIDDEN][idx])}
    if TEACHER_LAYERS in arrays:
        batch[TEACHER_LAYERS] = torch.from_numpy(arrays[TEACHER_LAYERS][idx])
    return batch


def iter_train_batches(s: Setup, transfer_dir: str, seed: int, labeled_only: bool = False
                       ) -> Iterator[dict[str, torch.Tensor]]:
    """One epoch of shuffled minibatches, streamed.

    Rows are shuffled within a buffer of `shuffle_rows` (and shards are visited in a shuffled
    order); inside the buffer, rows of similar length share a minibatch (less padding: the
    BiLSTM's cost follows the longest row), and the minibatch order is shuffled again.
    """
    cfg = s.cfg
    rng = np.random.default_rng(seed)
    buffer: list[pa.RecordBatch] = []
    held = 0

    def drain() -> Iterator[dict[str, torch.Tensor]]:
        arrays = _table_arrays(pa.Table.from_batches(buffer), s)
        n = len(arrays[schema.TEXT])
        order = rng.permutation(n)
        lengths = np.fromiter((len(t) for t in arrays[schema.TEXT]), dtype=np.int64, count=n)
        chunk = cfg.batch_size * 32
        batches = []
        for start in range(0, n, chunk):
            part = order[start:start + chunk]
            part = part[np.argsort(lengths[part], kind="stable")]
            batches += [part[i:i + cfg.batch_size] for i in range(0, len(part), cfg.batch_size)]
        for j in rng.permutation(len(batches)):
            yield make_batch(s, arrays, batches[j])

    for rb in transfer.iter_batches(transfer_dir, s.columns, batch_size=min(cfg.shuffle_rows, 8192),
                                    rng=random.Random(seed)):
        if labeled_only:
            rb = rb.filter(pc.is_valid(rb.column(schema.LABEL)))
        if rb.num_rows == 0:
            continue
        buffer.append(rb)
        held += rb.num_rows
        if held >= cfg.shuffle_rows:
            yield from drain()
            buffer, held = [], 0
    if buffer:
        yield from drain()


# --------------------------------------------------------------------------- loss step / train


def forward(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    if isinstance(model, transformer.Transformer):
        return model(batch["ids"], batch["mask"], batch["type_ids"])
    return model(batch["ids"], batch["mask"])


def set_trainable(model: torch.nn.Module, phase: Phase) -> list[torch.nn.Parameter]:
    """Apply the phase's freezing; return the parameters that learn."""
    groups = model.param_groups()
    unknown = set(phase.trainable) - set(groups)
    if unknown:
        raise ValueError(f"phase {phase.name!r} names unknown parameter groups {sorted(unknown)}")
    learn = []
    for name, params in groups.items():
        for p in params:
            p.requires_grad_(name in phase.trainable)
            if name in phase.trainable:
                learn.append(p)
    return learn


def make_optimizer(cfg: StudentConfig, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    # A fresh optimiser per phase holding only the trainable parameters: frozen ones then stay
    # bit-identical (AdamW's decoupled weight decay would otherwise still move them).
    lr = cfg.lr if cfg.lr is not None else DEFAULT_LR[cfg.student]
    return torch.optim.AdamW(params, lr=lr, weight_decay=cfg.weight_decay)


def train_step(model, optimizer, batch, weights: LossWeights, grad_clip: float) -> tuple[float, dict]:
    model.train()
    loss, parts = combine(forward(model, batch), batch, weights)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if grad_clip:
        torch.nn.utils.clip_grad_norm_([p for g in optimizer.param_groups for p in g["params"]], grad_clip)
    optimizer.step()
    return float(loss.detach()), parts


# --------------------------------------------------------------------------- evaluate


class Student:
    """A trained student ready to predict: model + tokens + label names."""

    def __init__(self, model: torch.nn.Module, tokens, label_names: Sequence[str]):
        self.model = model
        self.tokens = tokens
        self.label_names = list(label_names)

    @torch.inference_mode()
    def logits(self, texts: Sequence[str], texts_b: Optional[Sequence[Optional[str]]] = None,
               batch_size: int = 256) -> np.ndarray:
        """(N, C) logits; rows are length-sorted into batches and returned in input order."""
        self.model.eval()
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out = np.zeros((len(texts), len(self.label_names)), dtype=np.float32)
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            ids, mask, types = self.tokens.encode([texts[i] for i in idx],
                                                  [texts_b[i] for i in idx] if texts_b is not None else None)
            out[idx] = forward(self.model, {"ids": ids, "mask": mask, "type_ids": types})["logits"].numpy()
        return out

    def predict(self, texts, texts_b=None, batch_size: int = 256) -> np.ndarray:
        return self.logits(texts, texts_b, batch_size).argmax(-1)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())


def accuracy(pred: np.ndarray, labels: np.ndarray) -> float:
    keep = labels != NO_LABEL
    return float((pred[keep] == labels[keep]).mean()) if keep.any() else float("nan")


def latency_ms(student: Student, texts: Sequence[str], batch_size: int, limit: int) -> float:
    """CPU milliseconds per example, tokenization included, at a fixed batch size."""
    return ms_per_example(lambda chunk: student.logits(chunk, batch_size=batch_size), texts, batch_size, limit)


def teacher_agreement_on_transfer(student: Student, transfer_dir: str, limit: int) -> tuple[float, int]:
    texts, texts_b, teacher = [], [], []
    for rb in transfer.iter_batches(transfer_dir, [schema.TEXT, schema.TEXT_B, schema.TEACHER_LABEL]):
        texts += rb.column(0).to_pylist()
        texts_b += rb.column(1).to_pylist()
        teacher += rb.column(2).to_pylist()
        if len(texts) >= limit:
            break
    texts, texts_b, teacher = texts[:limit], texts_b[:limit], teacher[:limit]
    pred = student.predict(texts, texts_b if any(t is not None for t in texts_b) else None)
    return float((pred == np.asarray(teacher)).mean()), len(texts)


# --------------------------------------------------------------------------- save / load


def save_student(model_dir: str, s: Setup) -> None:
    from safetensors.torch import save_file

    os.makedirs(model_dir, exist_ok=True)
    # LSTM weights can be views of one flat buffer; safetensors wants contiguous, unshared tensors.
    state = {k: v.detach().contiguous().clone() for k, v in s.model.state_dict().items()}
    save_file(state, os.path.join(model_dir, WEIGHTS_FILE))
    config = {
        "family": s.family,
        "model": asdict(s.model_config),
        "label_names": s.label_names,
        "tokens": s.tokens.save(model_dir),
        "teacher_id": s.meta.get(schema.META_TEACHER_ID),
        "library_version": __version__,
    }
    with open(os.path.join(model_dir, CONFIG_FILE), "w", encoding="utf-8") as fh:
        json.dump(config, fh, indent=2)


def load_student(path: str) -> Student:
    """Load a student saved by `transferset train` (the run directory or its model/ directory)."""
    from safetensors.torch import load_file

    model_dir = os.path.join(path, MODEL_DIR) if os.path.isdir(os.path.join(path, MODEL_DIR)) else path
    cfg_path = os.path.join(model_dir, CONFIG_FILE)
    if not os.path.isfile(cfg_path):
        raise UserError(f"{path}: no {MODEL_DIR}/{CONFIG_FILE}; pass the --output directory of `transferset train`")
    with open(cfg_path, encoding="utf-8") as fh:
        config = json.load(fh)
    family = config.get("family")
    if family == "bilstm":
        model = bilstm.BiLSTM(bilstm.BiLSTMConfig(**config["model"]))
    elif family == "transformer":
        model = transformer.Transformer(transformer.TransformerConfig(**config["model"]))
    else:
        raise UserError(f"{cfg_path}: unknown student family {family!r}; known: {', '.join(FAMILIES)}")
    model.load_state_dict(load_file(os.path.join(model_dir, WEIGHTS_FILE)))
    model.eval()
    return Student(model, load_tokens(model_dir, config["tokens"]), config["label_names"])


# --------------------------------------------------------------------------- the whole run


def _batches_per_epoch(s: Setup, phase: Phase) -> int:
    rows = s.num_labeled if phase.labeled_only else s.num_rows
    return math.ceil(rows / s.cfg.batch_size)


def plot_curves(history: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_acc) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    x = list(range(1, len(history) + 1))
    ax_loss.plot(x, [h["train_loss"] for h in history], marker="o")
    ax_loss.set_ylabel("train loss")
    ax_loss.set_yscale("log")
    ax_acc.plot(x, [h["dev_accuracy"] for h in history], marker="o", color="tab:green")
    ax_acc.set_ylabel("dev accuracy")
    ax_acc.set_xlabel("epoch (all phases)")
    prev = None
    for i, h in enumerate(history, start=1):
        if h["phase"] != prev:
            for ax in (ax_loss, ax_acc):
                ax.axvline(i - 0.5, color="grey", linestyle="--", linewidth=0.8)
            # The short name ("2b logits"): the trainable groups are in metrics.json.
            ax_acc.text(i - 0.45, 0.02, h["phase"].split(":")[0], rotation=90, fontsize=7,
                        transform=ax_acc.get_xaxis_transform(), va="bottom")
            prev = h["phase"]
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def train(cfg: StudentConfig, transfer_dir: str, dev_path: str, output: str, *, overwrite: bool = False,
          progress: bool = True) -> dict:
    """Train a student; write OUTPUT/model/, OUTPUT/metrics.json, OUTPUT/curves.png; return the metrics."""
    model_dir = os.path.join(output, MODEL_DIR)
    if os.path.exists(model_dir) and not overwrite:
        raise UserError(f"{model_dir} already exists; pass --overwrite or choose another --output")
    # ---- setup
    # The dev data is checked against the set's label names before the (longer) setup.
    dev = read_eval_data(dev_path, transfer.label_names(transfer_dir, scored=True),
                         text_b_column=cfg.dev_text_b_column)
    s = setup(cfg, transfer_dir)
    student = Student(s.model, s.tokens, s.label_names)
    weights = cfg.loss_weights()
    try:
        plan = phases(cfg.schedule, weights, cfg.epochs, s.model.param_groups().keys())
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    dev_counts = np.bincount(dev.labels[dev.labels != NO_LABEL], minlength=len(s.label_names))
    majority = float(dev_counts.max() / max(1, dev_counts.sum()))

    # ---- train
    history: list[dict] = []
    phase_log: list[dict] = []
    last_acc = "-"  # shown in the progress bar: the dev accuracy after the previous epoch
    started = time.perf_counter()
    for p_index, phase in enumerate(plan):
        if phase.labeled_only and s.num_labeled == 0:
            phase_log.append({"phase": phase.name, "stage": phase.stage, "skipped":
                              "the transfer set has no row with a gold label"})
            continue
        params = set_trainable(s.model, phase)
        optimizer = make_optimizer(cfg, params)
        best_acc, best_state, bad, run = -1.0, None, 0, 0
        start_acc = None
        if phase.early_stop:
            # The model as it enters the step competes too: a step that never beats it on dev
            # leaves it unchanged rather than keep its least bad epoch.
            start_acc = accuracy(student.predict(dev.texts, dev.texts_b), dev.labels)
            best_acc, best_state = start_acc, copy.deepcopy(s.model.state_dict())
        for epoch in range(phase.epochs):
            t0 = time.perf_counter()
            total, parts_sum, n = 0.0, {}, 0
            bar = tqdm(iter_train_batches(s, transfer_dir, seed=cfg.seed * 1000 + p_index * 100 + epoch,
                                          labeled_only=phase.labeled_only),
                       total=_batches_per_epoch(s, phase), desc=f"{phase.name} ep {epoch + 1}/{phase.epochs}",
                       disable=not progress, leave=False, dynamic_ncols=True)
            for batch in bar:
                loss, parts = train_step(s.model, optimizer, batch, phase.weights, cfg.grad_clip)
                total += loss
                n += 1
                for k, v in parts.items():
                    parts_sum[k] = parts_sum.get(k, 0.0) + v
                if n % 10 == 0:
                    bar.set_postfix(loss=f"{total / n:.4f}", dev_acc=last_acc)
            bar.close()
            dev_acc = accuracy(student.predict(dev.texts, dev.texts_b), dev.labels)
            run += 1
            last_acc = f"{dev_acc:.4f}"
            record = {"phase": phase.name, "stage": phase.stage, "epoch": epoch + 1,
                      "train_loss": total / max(1, n), "losses": {k: v / max(1, n) for k, v in parts_sum.items()},
                      "dev_accuracy": dev_acc, "seconds": time.perf_counter() - t0,
                      "trainable": list(phase.trainable)}
            history.append(record)
            if progress:
                tqdm.write(f"{phase.name} epoch {epoch + 1}: loss {record['train_loss']:.4f} "
                           f"dev acc {dev_acc:.4f} ({record['seconds']:.1f}s)")
            if not phase.early_stop:
                continue
            if dev_acc > best_acc:
                best_acc, bad = dev_acc, 0
                best_state = copy.deepcopy(s.model.state_dict())
            else:
                bad += 1
                if bad >= cfg.patience:
                    break
        if best_state is not None:
            s.model.load_state_dict(best_state)  # each step keeps its best dev checkpoint
        phase_log.append({"phase": phase.name, "stage": phase.stage, "epochs_run": run,
                          "start_dev_accuracy": start_acc,
                          "best_dev_accuracy": best_acc if phase.early_stop else None,
                          "trainable": list(phase.trainable), "losses": phase.weights.active()})
    train_seconds = time.perf_counter() - started
    for p in s.model.parameters():
        p.requires_grad_(True)

    # ---- evaluate
    dev_pred = student.predict(dev.texts, dev.texts_b)
    if dev.teacher_labels is not None:
        agreement, agreement_on = float((dev_pred == dev.teacher_labels).mean()), f"dev ({len(dev.texts)} rows)"
    else:
        agreement, n_rows = teacher_agreement_on_transfer(student, transfer_dir, cfg.agreement_rows)
        agreement_on = f"transfer set, first {n_rows} rows (training rows: dev has no teacher columns)"
    metrics = {
        "student": s.family,
        "schedule": cfg.schedule,
        "dev": dev_path,
        "dev_rows": int(len(dev.texts)),
        "dev_accuracy": accuracy(dev_pred, dev.labels),
        "dev_majority_baseline": majority,
        "teacher_agreement": agreement,
        "teacher_agreement_on": agreement_on,
        "parameters": student.num_parameters(),
        "latency_ms_per_example": {
            "batch_1": latency_ms(student, dev.texts, 1, min(cfg.latency_examples, 128)),
            "batch_64": latency_ms(student, dev.texts, 64, cfg.latency_examples),
        },
        "latency_note": f"CPU, {torch.get_num_threads()} torch thread(s), tokenization included",
        "train_seconds": train_seconds,
        "transfer": {"dir": transfer_dir, "rows": s.num_rows, "labeled_rows": s.num_labeled,
                     "teacher_id": s.meta.get(schema.META_TEACHER_ID)},
        "phases": phase_log,
        "history": history,
        "config": config_lib.to_dict(cfg),
        "model_config": asdict(s.model_config),
    }

    # ---- save
    os.makedirs(output, exist_ok=True)
    save_student(model_dir, s)
    with open(os.path.join(output, METRICS_FILE), "w", encoding="utf-8") as fh:
        json.dump(metrics, fh, indent=2)
    if history:
        plot_curves(history, os.path.join(output, CURVES_FILE))
    return metrics
