"""Typed configuration: one dataclass per stage and the run that composes them.

This module is the only place a default is written. Command-line flags
(`transferset augment --n-iter 20`) and run-YAML sections (`augment: {n_iter: 20}`) map onto
the fields one to one: `add_arguments` builds the flags and their `--help` (the comment after
each field) from the dataclass, and `load` type-checks every value with pydantic before any
stage runs, refusing a bad one with its key, the value, the expected type and where it came
from. Stage functions receive these objects; no argv is built in between.

Paths (inputs, outputs) and one-off switches (`--overwrite`, `--resume`) are not settings:
they are arguments of the stage functions, so a run YAML cannot point two stages at one folder.
"""
from __future__ import annotations

import dataclasses
import inspect
import io
import json
import tokenize
import typing
from dataclasses import dataclass, field
from typing import Annotated, Any, Mapping, Optional, TypeVar, Union

import pydantic
from pydantic import BeforeValidator, ConfigDict, with_config

from transferset.errors import UserError

T = TypeVar("T")

# Values that travel through several modules but are defaults of settings, written once here.
DEFAULT_TEACHER_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
DEFAULT_RUNNER = "FnApiRunner"


def _split_commas(value: Any) -> Any:
    # "a,b" on a command line or in YAML means the list [a, b]; lists and tuples pass as they are.
    if isinstance(value, str):
        return tuple(s.strip() for s in value.split(",") if s.strip())
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,)
    return value


Names = Annotated[tuple[str, ...], BeforeValidator(_split_commas)]
Ints = Annotated[tuple[int, ...], BeforeValidator(_split_commas)]

_STRICT = ConfigDict(extra="forbid")


class ConfigError(UserError, ValueError):
    """A setting has the wrong type or value, or is unknown."""


# --- stages ----------------------------------------------------------------------------------

@with_config(_STRICT)
@dataclass(frozen=True)
class AugmentConfig:
    """`transferset augment` and the run's `augment:` section."""

    # reading
    text_column: Optional[str] = None  # text column of the inputs (None: `sentence`, else `text`)
    label_column: str = "label"  # label column of --input files
    text_b_column: Optional[str] = None  # second text column, for sentence pairs
    labels: Optional[Names] = None  # the label set in class order, e.g. neg,pos (None: the first input's labels)
    max_chars: int = 5000  # reject rows whose text is longer
    limit: Optional[int] = None  # read only the first N rows of each input
    # augmentation
    recipe: str = "tang"  # tang: mask-or-POS per word, then n-gram (Tang et al. 2019); tinybert: MLM replacement
    ops: Optional[Names] = None  # compose ops by name instead of a recipe, e.g. mask,ngram (None: the recipe's)
    n_iter: int = 20  # variants sampled per example (Tang et al.: 20; TinyBERT SST-2: 20)
    unlabeled_n_iter: Optional[int] = None  # variants per unlabeled example (None: n_iter; 0: the text as is)
    seed: int = 0  # a row depends only on (seed, source id, variant index, settings)
    p_mask: float = 0.1  # per word: probability of [MASK]
    p_pos: float = 0.1  # per word: probability of a same-POS word drawn from the corpus unigram distribution
    p_ng: float = 0.25  # per variant: probability of keeping only a random n-gram
    max_n: int = 5  # n-gram length is uniform in 1..max_n
    p_mlm: float = 0.4  # per eligible word: probability of one of the top-M MLM candidates
    mlm_model: str = "bert-base-uncased"  # any AutoModelForMaskedLM: local directory or hub name
    mlm_top_k: int = 15  # M candidates per word
    mask_token: str = "[MASK]"  # what the mask op writes
    spacy_model: str = "en_core_web_sm"  # spaCy pipeline used for POS tags
    # execution (not part of what a row depends on)
    tag_batch_size: int = 256  # rows per spaCy call
    mlm_batch_size: int = 64  # rows per MLM forward pass (their masked copies share it)
    torch_threads: Optional[int] = None  # torch threads per worker for the MLM (None: torch's; use cores / workers)

    EXECUTION = ("tag_batch_size", "mlm_batch_size", "torch_threads")

    def __post_init__(self):
        from transferset.augment import registry

        if self.ops is None:
            if self.recipe not in registry.RECIPES:
                raise ValueError(f"unknown recipe {self.recipe!r}; known: {', '.join(sorted(registry.RECIPES))}")
            object.__setattr__(self, "ops", tuple(registry.RECIPES[self.recipe]))
        for name in self.ops:
            try:
                registry.get(name)
            except KeyError as exc:  # a ValueError reaches the user as a config error
                raise ValueError(exc.args[0]) from None
        _at_least(self, n_iter=0, unlabeled_n_iter=0, max_n=1, mlm_top_k=1, max_chars=1, tag_batch_size=1, mlm_batch_size=1)
        _probabilities(self, "p_mask", "p_pos", "p_ng", "p_mlm")
        total = sum(getattr(self, registry.get(n).prob) for n in self.word_ops)
        if total > 1:
            raise ValueError(f"word-op probabilities sum to {total} > 1 for ops {self.word_ops}")

    def variants_for(self, labeled: bool) -> int:
        """How many variants an example gets: unlabeled text may have its own number."""
        if labeled or self.unlabeled_n_iter is None:
            return self.n_iter
        return self.unlabeled_n_iter

    @property
    def makes_variants(self) -> bool:
        return self.variants_for(True) > 0 or self.variants_for(False) > 0

    @property
    def word_ops(self) -> tuple[str, ...]:
        from transferset.augment import registry

        return tuple(n for n in self.ops if registry.get(n).kind == registry.WORD)

    @property
    def sequence_ops(self) -> tuple[str, ...]:
        from transferset.augment import registry

        return tuple(n for n in self.ops if registry.get(n).kind == registry.SEQUENCE)

    def needs(self, what: str) -> bool:
        from transferset.augment import registry

        return any(what in registry.get(n).needs for n in self.ops)

    def to_json(self) -> str:
        """The settings a transfer set depends on (recorded in its Parquet metadata)."""
        values = {k: v for k, v in dataclasses.asdict(self).items() if k not in self.EXECUTION}
        return json.dumps(values, sort_keys=True)


@with_config(_STRICT)
@dataclass(frozen=True)
class TeacherConfig:
    """`transferset teacher` and the run's `teacher:` section."""

    model: str = DEFAULT_TEACHER_MODEL  # base model: hub name or local directory (the default is packaged offline)
    epochs: int = 3  # passes over the labeled data; the best dev checkpoint is kept
    lr: float = 5e-5  # peak learning rate (AdamW, linear warm-up and decay)
    batch_size: int = 32
    max_length: int = 128  # tokens per row; longer rows are truncated
    warmup: float = 0.1  # fraction of the steps with a linear warm-up
    weight_decay: float = 0.01
    max_steps: Optional[int] = None  # stop after N optimizer steps in total
    seed: int = 0
    eval_batch_size: int = 128
    limit: Optional[int] = None  # read at most N rows of each input (the run sets it from labeled_limit)
    text_column: Optional[str] = None  # text column (None: `sentence`, else `text`)
    text_b_column: Optional[str] = None  # second text column for sentence pairs
    label_column: str = "label"
    labels: Optional[Names] = None  # label names in class order (None: the train file's labels)
    allow_pickle: bool = False  # accept pickle weights (pytorch_model.bin) for the base model: only files you trust
    trust_remote_code: bool = False  # run Python code shipped with the model: only models you trust
    progress: Optional[bool] = None  # a progress bar (None: when stderr is a terminal)

    def __post_init__(self):
        _at_least(self, epochs=1, batch_size=1, max_length=2, eval_batch_size=1, max_steps=1, limit=1)
        _positive(self, "lr")
        _probabilities(self, "warmup")


@with_config(_STRICT)
@dataclass(frozen=True)
class ScoreConfig:
    """`transferset score` and the run's `score:` section."""

    hidden: str = "cls"  # teacher_hidden pooling of the last layer: cls ([CLS] token) | mean (masked mean)
    # hidden_states layers to store: the last (-1) is always teacher_hidden; each other k adds
    # teacher_hidden_l{k} (0 = embeddings, negative counts from the last). On a command line write --layers=-1,3
    layers: Ints = (-1,)
    # rows per model call (BatchElements maximum); each call is sorted by length, so larger
    # calls pad less: 1,024 rows scored ~10% faster than 256 on SST-2 (benchmarks/score.py)
    batch_size: int = 1024
    min_batch_size: Optional[int] = None  # BatchElements minimum (None: batch_size; lower it for streaming inputs)
    max_length: Optional[int] = None  # tokens per row (None: the teacher's training max_length, else 128)
    # teacher forward pass: packed (padding-free, BERT classifiers; checked against the model's own forward
    # on load), padded (the model's own forward on length-sorted padded batches), auto (packed for BERT on CPU)
    forward: str = "auto"
    forward_rows: Optional[int] = None  # rows per forward pass (None: 1,024 packed, 128 padded)
    forward_tokens: Optional[int] = None  # tokens per forward pass, padding included (None: 4,096 packed, 2,048 padded)
    shard_rows: int = 10_000  # rows per committed output shard: the unit a resumed run can skip
    # also commit a shard once its oldest row has waited this long, so a killed run loses at most
    # about this much scoring (10,000 rows of a large teacher on CPU can take an hour)
    shard_seconds: float = 60.0
    # score an input without its _COMPLETE marker (a killed `augment` run): only to salvage its rows
    allow_incomplete: bool = False
    large_model: bool = False  # one teacher per machine, shared by its worker processes (big teachers)
    torch_threads: Optional[int] = None  # torch threads per worker (None: cores / local workers)
    allow_pickle: bool = False  # accept pickle weights (pytorch_model.bin): only files you trust
    trust_remote_code: bool = False  # run Python code shipped with the teacher: only models you trust

    def __post_init__(self):
        from transferset.teacher.scoring import POOLINGS, check_forward_options

        if self.hidden not in POOLINGS:
            raise ValueError(f"hidden must be one of {list(POOLINGS)}, got {self.hidden!r}")
        _at_least(self, batch_size=1, min_batch_size=1, max_length=2, shard_rows=1, torch_threads=1,
                   shard_seconds=0)
        try:
            check_forward_options(self.forward, self.forward_rows, self.forward_tokens)
        except UserError as exc:  # a ValueError, so that `load` reports it with its key
            raise ConfigError(str(exc)) from None


@with_config(_STRICT)
@dataclass(frozen=True)
class StudentConfig:
    """`transferset train` (flags or --config YAML) and each entry of the run's `students:` section."""

    student: str = "bilstm"  # student family: bilstm | transformer
    schedule: str = "joint"  # joint | progressive | distill-then-finetune
    epochs: int = 5  # at most this many epochs per phase (progressive: per unfreezing step)
    lr: Optional[float] = None  # None: 2e-3 for the BiLSTM, 1e-4 for the transformer
    batch_size: int = 64  # rows per step
    patience: int = 2  # epochs without a better dev accuracy before a phase stops
    seed: int = 0  # initialisation, shuffling and dropout all derive from it
    weight_decay: float = 0.01
    grad_clip: float = 1.0  # max gradient norm (0: no clipping)
    max_length: Optional[int] = None  # tokens per row (None: the scored set's max_length, else 128)
    shuffle_rows: int = 16384  # rows held in memory for shuffling
    threads: Optional[int] = None  # torch CPU threads (None: leave torch's setting alone)
    dev_text_b_column: Optional[str] = None  # sentence pairs: the dev file's second text column
    allow_incomplete: bool = False  # train on a scored set whose run did not finish (no _COMPLETE marker)
    # loss weights (of the joint schedule; the other schedules use them where their stage needs one)
    ce: float = 1.0  # cross-entropy on gold labels (rows with a label)
    mse: float = 1.0  # MSE on logits (Tang et al. 2019)
    kd: float = 0.0  # KL(softmax(t/T) || softmax(s/T)) * T^2 (Hinton et al. 2015)
    repr: float = 0.0  # MSE of the student's representation head to teacher_hidden (XtremeDistil)
    pkd: float = 0.0  # BERT-PKD: normalised [CLS] of intermediate layers (transformer student)
    temperature: float = 1.0  # T of the kd loss
    # tokens and initialisation
    tokens: str = "wordpiece"  # wordpiece (the teacher's) | words (vocabulary from the transfer set)
    min_count: int = 1  # words: keep words seen at least this often
    max_vocab: int = 50000  # words: vocabulary size cap
    # bilstm + wordpiece: embed only the WordPiece ids the transfer set uses. Off by default: with the
    # teacher's whole vocabulary, words the transfer set never shows keep their teacher-derived
    # (PCA) vectors instead of becoming [UNK] (+1.6 on SST-2 dev, benchmarks/README.md)
    trim_vocab: bool = False
    embed_init: str = "teacher"  # teacher (PCA of the teacher's input embeddings) | random
    # keep the embedding table fixed in every phase ("static" embeddings): words the transfer set
    # never shows keep teacher-derived vectors in the same space as the rest, and an epoch is ~3x
    # faster with the whole vocabulary. None: frozen for a BiLSTM whose embeddings come from the teacher
    freeze_embeddings: Optional[bool] = None
    teacher: Optional[str] = None  # teacher directory (None: the set's teacher_id metadata when a directory)
    tokenizer: Optional[str] = None  # tokenizer directory (None: the set's tokenizer metadata, else the teacher's)
    preset: Optional[str] = None  # bilstm presets: tang | xtremedistil
    model: dict[str, Any] = field(default_factory=dict)  # the student model's own settings, e.g. {hidden: 150}
    # reporting
    latency_examples: int = 256  # dev rows timed for the latency figures
    agreement_rows: int = 5000  # transfer rows used for teacher agreement when dev has no teacher columns

    def __post_init__(self):
        _at_least(self, epochs=1, batch_size=1, patience=1, shuffle_rows=1, max_length=2, threads=1,
                  min_count=1, max_vocab=2, latency_examples=1, agreement_rows=1)
        _positive(self, "lr", "temperature")
        for name in ("ce", "mse", "kd", "repr", "pkd", "weight_decay", "grad_clip"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        _one_of(self, tokens=("wordpiece", "words"), embed_init=("teacher", "random"))

    def frozen_embeddings(self) -> bool:
        """Whether the embedding table stays fixed (`freeze_embeddings`, None: a teacher-initialised BiLSTM)."""
        if self.freeze_embeddings is not None:
            return self.freeze_embeddings
        return self.student == "bilstm" and self.embed_init == "teacher"

    def loss_weights(self):
        from students.losses import LossWeights

        return LossWeights(ce=self.ce, mse=self.mse, kd=self.kd, repr=self.repr, pkd=self.pkd,
                           temperature=self.temperature)


@with_config(_STRICT)
@dataclass(frozen=True)
class BeamConfig:
    """The run's `beam:` section: where the augment and score pipelines run."""

    runner: str = DEFAULT_RUNNER  # FnApiRunner runs locally and offline; DataflowRunner for Google Cloud Dataflow
    workers: int = 1  # local worker processes (FnApiRunner's direct_num_workers, multi-processing)
    # any other Beam pipeline option, e.g. {project: P, region: europe-west4, temp_location: gs://B/tmp}
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        _at_least(self, workers=1)

    def flags(self) -> list[str]:
        """The pipeline options as Beam flags."""
        out = [f"--runner={self.runner}"]
        if self.workers > 1:
            out += [f"--direct_num_workers={self.workers}", "--direct_running_mode=multi_processing"]
        for key, value in self.options.items():
            if isinstance(value, bool):
                out.append(f"--{key}" if value else f"--no_{key}")
            elif isinstance(value, (list, tuple)):
                out += [f"--{key}={v}" for v in value]
            elif value is not None:
                out.append(f"--{key}={value}")
        return out


@with_config(_STRICT)
@dataclass(frozen=True)
class LowResConfig:
    """k labeled rows per class (seeded), the rest of train, labels dropped, as unlabeled text."""

    per_class: int = 500
    seed: int = 0

    def __post_init__(self):
        _at_least(self, per_class=1)


@with_config(_STRICT)
@dataclass(frozen=True)
class RunConfig:
    """`transferset run --config YAML`: the whole chain, teacher → augment → score → students → report."""

    run_dir: str = "runs/run"  # every stage writes into a folder of it
    data: Optional[str] = None  # folder with train.tsv and dev.tsv (None: ../shared/data/sst2, else the hub's GLUE SST-2)
    labeled_limit: Optional[int] = None  # the first N train rows as labeled data
    unlabeled_rows: Optional[int] = None  # the next N train rows, labels dropped, as unlabeled text (-1: all the rest)
    lowres: Optional[LowResConfig] = None  # k labeled rows per class, the rest of train as unlabeled text
    unlabeled_limit: Optional[int] = None  # at most N unlabeled rows
    teacher_path: Optional[str] = None  # reuse this fine-tuned teacher instead of training one
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    score: ScoreConfig = field(default_factory=ScoreConfig)
    students: dict[str, StudentConfig] = field(default_factory=dict)
    beam: BeamConfig = field(default_factory=BeamConfig)

    def __post_init__(self):
        _at_least(self, labeled_limit=1, unlabeled_limit=0)
        if self.unlabeled_rows is not None and self.unlabeled_rows < -1:
            raise ValueError(f"unlabeled_rows must be -1 (all) or >= 0, got {self.unlabeled_rows}")
        if self.lowres is not None and self.unlabeled_rows is not None:
            raise ValueError("lowres and unlabeled_rows both choose the unlabeled text: set one of them")
        if not self.students:
            raise ValueError("no students: add e.g. students: {distilled: {student: bilstm}}")


# --- checks shared by the __post_init__ methods ------------------------------------------------

def _at_least(obj, **minimums: int) -> None:
    for name, low in minimums.items():
        value = getattr(obj, name)
        if value is not None and value < low:
            raise ValueError(f"{name} must be at least {low}, got {value}")


def _positive(obj, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if value is not None and not value > 0:
            raise ValueError(f"{name} must be positive, got {value}")


def _probabilities(obj, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if not 0 <= value <= 1:
            raise ValueError(f"{name} must be a probability in [0, 1], got {value}")


def _one_of(obj, **choices: tuple[str, ...]) -> None:
    for name, allowed in choices.items():
        if getattr(obj, name) not in allowed:
            raise ValueError(f"{name} must be one of {list(allowed)}, got {getattr(obj, name)!r}")


# --- loading and checking ----------------------------------------------------------------------

def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Annotated:
        return _type_name(typing.get_args(tp)[0])
    if origin is Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        inner = " or ".join(_type_name(a) for a in args)
        return f"{inner} or null" if len(args) < len(typing.get_args(tp)) else inner
    if origin in (tuple, list):
        args = typing.get_args(tp)
        return f"list of {_type_name(args[0])}" if args else "list"
    if origin is dict:
        return f"mapping of {_type_name(typing.get_args(tp)[1])}"
    if dataclasses.is_dataclass(tp):
        return f"mapping ({tp.__name__})"
    return getattr(tp, "__name__", str(tp))


def _unwrap(tp: Any) -> Any:
    """The type inside Optional[...] and Annotated[...] (the first non-None member of a Union)."""
    while typing.get_origin(tp) in (Union, Annotated):
        tp = [a for a in typing.get_args(tp) if a is not type(None)][0]
    return tp


def _expected(cls: type, loc: tuple) -> Optional[str]:
    """The expected type at `loc` (a pydantic error location) inside dataclass `cls`."""
    tp: Any = cls
    for part in loc:
        tp = _unwrap(tp)
        if dataclasses.is_dataclass(tp) and isinstance(part, str):
            hints = typing.get_type_hints(tp, include_extras=True)
            if part not in hints:
                return None
            tp = hints[part]
        elif typing.get_origin(tp) is dict:
            tp = typing.get_args(tp)[1]
        elif typing.get_origin(tp) in (tuple, list) and isinstance(part, int):
            tp = typing.get_args(tp)[0]
        else:
            break
    return _type_name(tp)


def _key(loc: tuple, flag_style: bool) -> str:
    parts = [str(p) for p in loc if not str(p).startswith("function-")]
    if flag_style and parts:
        return "--" + parts[0].replace("_", "-") + "".join(f"[{p}]" for p in parts[1:])
    return ".".join(parts)


def format_errors(cls: type, exc: pydantic.ValidationError, where: str, flag_style: bool = False) -> str:
    lines = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        key = _key(loc, flag_style)
        if err["type"] == "unexpected_keyword_argument":
            parent = _expected(cls, loc[:-1]) if loc[:-1] else cls.__name__
            known = _known_keys(cls, loc[:-1])
            lines.append(f"{where}: {key}: unknown setting" + (f"; known: {', '.join(known)}" if known else "")
                         + (f" ({parent})" if not known else ""))
            continue
        if err["type"] == "value_error":
            message = str(err.get("ctx", {}).get("error") or err["msg"])
            lines.append(f"{where}: {key or cls.__name__}: {message}")
            continue
        expected = _expected(cls, loc)
        value = err.get("input")
        lines.append(f"{where}: {key} = {value!r}: {err['msg'].lower()}"
                     + (f" (expected {expected})" if expected else ""))
    return "\n".join(lines)


def _known_keys(cls: type, loc: tuple) -> list[str]:
    tp: Any = cls
    for part in loc:
        tp = _unwrap(tp)
        if dataclasses.is_dataclass(tp) and isinstance(part, str):
            tp = typing.get_type_hints(tp, include_extras=True).get(part)
        elif typing.get_origin(tp) is dict:
            tp = typing.get_args(tp)[1]
    tp = _unwrap(tp)
    return [f.name for f in dataclasses.fields(tp)] if dataclasses.is_dataclass(tp) else []


def load(cls: type[T], values: Mapping[str, Any], where: str, flag_style: bool = False) -> T:
    """Build a `cls` from plain values (YAML, flags), type-checked; a ConfigError lists every problem."""
    if values is None:
        values = {}
    if not isinstance(values, Mapping):
        raise ConfigError(f"{where}: expected a mapping of settings, got {type(values).__name__} {values!r}")
    try:
        return pydantic.TypeAdapter(cls).validate_python(dict(values))
    except pydantic.ValidationError as exc:
        raise ConfigError(format_errors(cls, exc, where, flag_style)) from None


def read_yaml(path: str, what: str = "config") -> dict[str, Any]:
    """A YAML file of settings as a plain mapping; a missing, unparsable or non-mapping file is a UserError."""
    import yaml

    try:
        with open(path, encoding="utf-8") as fh:
            raw = yaml.safe_load(fh)
    except FileNotFoundError:
        raise UserError(f"{path}: no such {what} file (see configs/ for examples)") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read the {what} file: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise UserError(f"{path}: not valid YAML: {exc}") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise UserError(f"{path}: a {what} is a YAML mapping of settings, got {type(raw).__name__}")
    return raw


def to_dict(cfg: Any) -> dict[str, Any]:
    """Plain values (lists for tuples) that `load` accepts back: for YAML, JSON and stage hashes."""
    return json.loads(json.dumps(dataclasses.asdict(cfg), default=list))


# --- command-line flags from a dataclass -------------------------------------------------------

def field_help(cls: type) -> dict[str, str]:
    """The comment on (or just above) each field: the dataclass's own documentation."""
    try:
        lines, _ = inspect.getsourcelines(cls)
    except (OSError, TypeError):
        return {}
    names = {f.name for f in dataclasses.fields(cls)}
    out: dict[str, str] = {}
    pending: list[str] = []
    for tok_line in _logical_lines("".join(lines)):
        code, comment = tok_line
        if not code:
            if comment:
                pending.append(comment)
            else:
                pending = []
            continue
        name = code.split(":", 1)[0].strip()
        if name in names and ":" in code:
            # A field's own comment wins; lines above it document it only when it has none
            # (otherwise they are a section heading, e.g. "# loss weights").
            text = comment or " ".join(pending)
            if text:
                out[name] = text
        pending = []
    return out


def _logical_lines(source: str) -> list[tuple[str, str]]:
    """(code, comment) per physical line; a comment-only line has empty code."""
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    out = []
    for i, line in enumerate(source.splitlines(), start=1):
        code = line.split("#", 1)[0].strip() if i in comments else line.strip()
        out.append((code, comments.get(i, "")))
    return out


def _metavar(tp: Any) -> str:
    name = _type_name(tp)
    if name.startswith("list of"):
        return "A,B"
    return {"int": "N", "float": "X", "str": "TEXT"}.get(name.replace(" or null", ""), "VALUE")


def _is_bool(tp: Any) -> bool:
    tp = _unwrap(tp)
    return tp is bool


def _is_mapping(tp: Any) -> bool:
    tp = _unwrap(tp)
    return typing.get_origin(tp) is dict or dataclasses.is_dataclass(tp)


def add_arguments(parser, cls: type, *, title: Optional[str] = None, skip: tuple[str, ...] = (),
                  defaults: Optional[Mapping[str, Any]] = None) -> None:
    """One flag per field of `cls` (mappings excepted): --field-name, help from the field's comment.

    Every flag defaults to argparse.SUPPRESS: a flag not given leaves no attribute, so the
    dataclass default (or a YAML value) stands and `from_args` knows what the user set.
    `--help` shows the dataclass default (or `defaults`, where a command documents another).
    """
    import argparse

    group = parser.add_argument_group(title) if title else parser
    helps = field_help(cls)
    hints = typing.get_type_hints(cls, include_extras=True)
    for f in dataclasses.fields(cls):
        if f.name in skip or _is_mapping(hints[f.name]):
            continue
        default = (defaults or {}).get(f.name, f.default if f.default is not dataclasses.MISSING else None)
        shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
        help_text = helps.get(f.name, "")
        help_text = f"{help_text} (default: {shown})" if help_text else f"default: {shown}"
        flag = "--" + f.name.replace("_", "-")
        if _is_bool(hints[f.name]):
            group.add_argument(flag, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                               help=help_text.replace("%", "%%"))
        else:
            group.add_argument(flag, default=argparse.SUPPRESS, metavar=_metavar(hints[f.name]),
                               help=help_text.replace("%", "%%"))


def from_args(cls: type[T], args: Any, base: Optional[Mapping[str, Any]] = None, where: str = "command line") -> T:
    """`cls` from the flags the user gave, on top of `base` (e.g. a --config YAML), type-checked."""
    values = dict(base or {})
    for f in dataclasses.fields(cls):
        if hasattr(args, f.name):
            value = getattr(args, f.name)
            values[f.name] = None if isinstance(value, str) and value.lower() in ("none", "null") else value
    return load(cls, values, where, flag_style=base is None)
