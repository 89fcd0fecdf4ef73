"""Typed configuration: one dataclass per stage and the run that composes them.

This module is the only place a default is written, but for three kinds it takes from their owner:
each augment op's settings (a dataclass in its module, transferset/augment/OP.py: AugmentConfig is
composed of them), the readers' label column and row-length limit (transferset.sources) and the
teacher's default model (transferset.loading, which finds it offline): config is imported by the
augment package's neighbours, so those cannot import config. Command-line flags
(`transferset augment --n-iter 20`) and run-YAML sections (`augment: {n_iter: 20}`) map onto
the fields one to one: transferset/app/flags.py builds the flags and their `--help` (the comment
after each field) from these dataclasses, and transferset/typed.py type-checks every value with
pydantic before any stage runs, refusing a bad one with its key, the value, the expected type and
where it came from. Stage functions receive these objects; no argv is built in between.

Paths (inputs, outputs) and one-off switches (`--overwrite`, `--resume`) are not settings:
they are arguments of the stage functions, so a run YAML cannot point two stages at one folder.
Queries that belong to a package live there (augment.compose.word_ops, students.losses.weights_of,
pipelines.runtime.beam_flags); the checks here look at values only.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Optional

from pydantic import AfterValidator, BeforeValidator, ConfigDict, model_validator, with_config

from transferset import augment  # importing it registers every op, whose settings AugmentConfig is made of
from transferset import labels as label_rule
from transferset.errors import ConfigError
from transferset.loading import DEFAULT_TEACHER_MODEL  # the packaged model loading finds offline
from transferset.sources import DEFAULT_LABEL_COLUMN, DEFAULT_MAX_CHARS
from transferset.typed import AtLeast, NonNegative, Positive, Probability

# Values that travel through several modules but are defaults of settings, written once here.
DEFAULT_RUNNER = "FnApiRunner"
# Tokens per row wherever no setting or recorded value says otherwise (teacher, scoring, students, report).
DEFAULT_MAX_LENGTH = 128
# DEFAULT_MAX_CHARS (longer rows are rejected: augment, predict) is the readers' (transferset.sources).
PREDICTION_FORMATS = ("parquet", "jsonl")  # PredictConfig.format
POOLINGS = ("cls", "mean")  # ScoreConfig.hidden
# Named op sequences; `AugmentConfig.recipe` picks one unless `ops` is given. The op names are checked
# against the registry by transferset.augment.check_ops, which every augment entry point calls.
RECIPES: dict[str, tuple[str, ...]] = {
    "tang": ("mask", "pos", "ngram"),  # Tang et al. 2019
    "tinybert": ("mlm",),  # Jiao et al. 2020
}
# auto: packed on CPU for the encoder families packed.py serves (measured, benchmarks/README.md), padded elsewhere; the
# packed path is not measured on a GPU yet, where many small attention calls may cost more than padding.
FORWARDS = ("auto", "packed", "padded")  # ScoreConfig.forward
# ScoreConfig.combine: with several teachers, teacher_logits is their mean logits, or the log of their mean
# probabilities (log-probs: a softmax gives that mean back), or one member's logits by its index (from 0)
COMBINES = ("mean", "probs")


def _as_text(value: Any) -> Any:
    # YAML `combine: 1` (a member's index) means the string "1" that flags take.
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


def check_combine(value: str) -> None:
    """Refuse a ScoreConfig.combine that is neither a known rule nor a member index (range: at scoring)."""
    if value not in COMBINES and not value.isdigit():
        raise ConfigError(f"--combine {value!r}: choose one of {list(COMBINES)}, or the index of one teacher "
                          "(0 for the first --teacher)")


def _split_commas(value: Any) -> Any:
    # "a,b" on a command line or in YAML means the list [a, b]; lists and tuples pass as they are.
    if isinstance(value, str):
        return tuple(s.strip() for s in value.split(",") if s.strip())
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (value,)
    return value


Names = Annotated[tuple[str, ...], BeforeValidator(_split_commas)]
# A label set by the one label rule (transferset.labels): what one command accepts, every command does.
LabelNames = Annotated[Names, AfterValidator(lambda names: label_rule.check_names(names, where=""))]
Ints = Annotated[tuple[int, ...], BeforeValidator(_split_commas)]
Speeds = Annotated[tuple[Probability, ...], BeforeValidator(_split_commas)]

_STRICT = ConfigDict(extra="forbid")

# Bounds are part of a setting's type (transferset.typed: AtLeast, Probability, Positive, NonNegative).


def check_forward_options(forward: str, forward_rows: Optional[int], forward_tokens: Optional[int]) -> None:
    """Refuse a --forward choice or forward cap that cannot work (None caps: the path's default)."""
    if any(v is not None and v < 1 for v in (forward_rows, forward_tokens)):
        raise ConfigError("--forward-rows and --forward-tokens must be at least 1")
    if forward not in FORWARDS:
        raise ConfigError(f"--forward {forward!r}: choose one of {list(FORWARDS)}")


# --- the engine every trainer runs on (transferset/training) -------------------------------------

DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("fp32", "bf16", "fp16")
LR_SCHEDULES = ("constant", "linear", "cosine")
TRACKERS = ("none", "tensorboard", "mlflow", "wandb")


@with_config(_STRICT)
@dataclass(frozen=True)
class EngineConfig:
    """How a trainer runs: the `engine:` section of the teacher, each student, prune and exits (flags alike)."""

    device: Literal[DEVICES] = "auto"  # cpu | cuda | auto (cuda when torch sees one)
    # fp32 | bf16 (autocast: GPUs, CPUs with AMX / AVX512-BF16) | fp16 (autocast and a gradient scaler: CUDA only)
    precision: Literal[PRECISIONS] = "fp32"
    # processes the launcher started (`torchrun --nproc_per_node N -m transferset.app.cli ...`), checked against it
    # (None: whatever it started, 1 without one)
    processes: Optional[AtLeast(1)] = None
    grad_accum: AtLeast(1) = 1  # batches whose gradients add up to one optimizer step (effective batch: x batch_size x processes)
    # learning rate per optimizer step of a phase: constant | linear (warm-up, then linear decay to 0) | cosine
    # (warm-up, then cosine decay to 0)
    schedule: Literal[LR_SCHEDULES] = "constant"
    warmup: Probability = 0.0  # fraction of a phase's optimizer steps with a linear warm-up from 0
    # where each step's loss and each epoch's figures go besides OUTPUT/metrics.jsonl (always written):
    # none | tensorboard | mlflow | wandb (its package installed; `pip install transferset[tracking]`: tensorboard)
    tracker: Literal[TRACKERS] = "none"


# A trainer's engine section: what the YAML / flags give, over the trainer's own defaults (a partial section
# keeps the rest of them); the trainer's flat settings of before the section (`legacy`: device, bf16, report_to,
# warmup) still load into it. The students, prune's recovery and exits train at a constant rate unless a preset
# or the section says otherwise.
def engine_section(values: Any, defaults: dict, legacy: tuple[str, ...] = ()) -> Any:
    if not isinstance(values, dict):
        return values
    values = dict(values)
    engine = values.get("engine")
    engine = dict(engine) if isinstance(engine, dict) else ({} if engine is None else engine)
    if not isinstance(engine, dict):
        return values
    for old in legacy:
        if old in values:
            value = values.pop(old)
            new = {"bf16": "precision", "report_to": "tracker"}.get(old, old)
            engine.setdefault(new, ("bf16" if value else "fp32") if old == "bf16" else value)
    values["engine"] = {**defaults, **engine}
    return values


# The teacher fine-tunes as BERT was: linear warm-up over 10 % of the steps, then linear decay.
TEACHER_ENGINE = {"schedule": "linear", "warmup": 0.1}


# --- stages ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class _AugmentCommon:
    """The augment settings no single op owns; each op's own come from its module (transferset.augment)."""

    # reading
    text_column: Optional[str] = None  # text column of the inputs (None: `sentence`, else `text`)
    label_column: str = DEFAULT_LABEL_COLUMN  # label column of --input files
    text_b_column: Optional[str] = None  # second text column, for sentence pairs
    labels: Optional[LabelNames] = None  # the label set in class order, e.g. neg,pos (None: the first input's labels)
    max_chars: AtLeast(1) = DEFAULT_MAX_CHARS  # reject rows whose text is longer
    limit: Optional[int] = None  # read only the first N rows of each input
    # augmentation
    recipe: str = "tang"  # tang: mask-or-POS per word, then n-gram (Tang et al. 2019); tinybert: MLM replacement
    ops: Optional[Names] = None  # compose ops by name instead of a recipe, e.g. mask,ngram (None: the recipe's)
    n_iter: AtLeast(0) = 20  # variants sampled per example (Tang et al.: 20; TinyBERT SST-2: 20)
    unlabeled_n_iter: Optional[AtLeast(0)] = None  # variants per unlabeled example (None: n_iter; 0: the text as is)
    # variants by length: an example of W words gets ceil(W / words_per_variant) variants, at most n_iter
    # (unlabeled_n_iter), at least 1; so long sentences, rare in a set of phrases, get more (None: n_iter each)
    words_per_variant: Optional[AtLeast(1)] = None
    seed: int = 0  # a row depends only on (seed, source id, variant index, settings)


# Each registered op's settings class (transferset/augment/OP.py) adds its fields after the common
# ones: its defaults and comments are written there once, and become flags, --help and YAML keys here.
_OP_SETTINGS = augment.settings_classes()


@with_config(_STRICT)
@dataclass(frozen=True)
class AugmentConfig(*reversed(_OP_SETTINGS), _AugmentCommon):
    """`transferset augment` and the run's `augment:` section: the common settings, then every op's."""

    # settings no row depends on (left out of to_json and of the run's stage key)
    EXECUTION = tuple(name for cls in _OP_SETTINGS for name in getattr(cls, "EXECUTION", ()))

    def __post_init__(self):
        if self.ops is None:
            if self.recipe not in RECIPES:
                raise ValueError(f"unknown recipe {self.recipe!r}; known: {', '.join(sorted(RECIPES))}")
            object.__setattr__(self, "ops", tuple(RECIPES[self.recipe]))
        for cls in _OP_SETTINGS:  # each op checks its own settings
            if "__post_init__" in vars(cls):
                cls.__post_init__(self)

    def variants_for(self, labeled: bool, words: Optional[int] = None) -> int:
        """How many variants an example gets: unlabeled text may have its own number; with words_per_variant,
        an example of `words` words gets one per that many words, up to that number (at least one)."""
        most = self.n_iter if labeled or self.unlabeled_n_iter is None else self.unlabeled_n_iter
        if self.words_per_variant is None or words is None or most == 0:
            return most
        return min(most, max(1, -(-words // self.words_per_variant)))

    @property
    def makes_variants(self) -> bool:
        return self.variants_for(True) > 0 or self.variants_for(False) > 0

    COLUMNS = ("text_column", "label_column", "text_b_column")

    def column_kwargs(self) -> dict:
        """The input files' columns, as write_eval_set and evaluate take them: the run's dev and test files
        are read with the columns of its train file."""
        return {k: getattr(self, k) for k in self.COLUMNS}

    def to_json(self) -> str:
        """The settings a transfer set depends on (recorded in its Parquet metadata)."""
        values = {k: v for k, v in dataclasses.asdict(self).items() if k not in self.EXECUTION}
        return json.dumps(values, sort_keys=True)


@with_config(_STRICT)
@dataclass(frozen=True)
class TeacherConfig:
    """`transferset teacher` and the run's `teacher:` section."""

    model: str = DEFAULT_TEACHER_MODEL  # base model: hub name or local directory (the default is packaged offline)
    epochs: AtLeast(1) = 3  # passes over the labeled data; the best dev checkpoint is kept
    lr: Positive = 5e-5  # peak learning rate (AdamW, linear warm-up and decay)
    batch_size: AtLeast(1) = 32
    max_length: AtLeast(2) = DEFAULT_MAX_LENGTH  # tokens per row; longer rows are truncated
    weight_decay: float = 0.01
    max_steps: Optional[AtLeast(1)] = None  # stop after N optimizer steps in total
    seed: int = 0
    eval_batch_size: AtLeast(1) = 128
    limit: Optional[AtLeast(1)] = None  # read at most N rows of each input (the run sets it from labeled_limit)
    text_column: Optional[str] = None  # text column (None: `sentence`, else `text`)
    text_b_column: Optional[str] = None  # second text column for sentence pairs
    label_column: str = "label"
    labels: Optional[LabelNames] = None  # label names in class order (None: the train file's labels)
    allow_pickle: bool = False  # accept pickle weights (pytorch_model.bin) for the base model: only files you trust
    trust_remote_code: bool = False  # run Python code shipped with the model: only models you trust
    progress: Optional[bool] = None  # a progress bar (None: when stderr is a terminal)
    resume: bool = False  # go on from OUTPUT/checkpoint/ of a killed fine-tuning with the same settings
    # also write the checkpoint every N optimizer steps (None: per epoch): a large teacher's epoch on CPU takes hours
    checkpoint_steps: Optional[AtLeast(1)] = None
    # device, precision, processes, grad_accum, schedule (linear), warmup (0.1), tracker (transferset/training)
    engine: EngineConfig = field(default_factory=lambda: EngineConfig(**TEACHER_ENGINE))

    @model_validator(mode="before")
    @classmethod
    def _engine(cls, values: Any) -> Any:
        return engine_section(values, TEACHER_ENGINE, legacy=("warmup",))


@with_config(_STRICT)
@dataclass(frozen=True)
class ScoreConfig:
    """`transferset score` and the run's `score:` section."""

    hidden: Literal[POOLINGS] = "cls"  # teacher_hidden pooling of the last layer: cls ([CLS] token) | mean (masked mean)
    # hidden_states layers to store: the last (-1) is always teacher_hidden; each other k adds
    # teacher_hidden_l{k} (0 = embeddings, negative counts from the last). On a command line write --layers=-1,3
    layers: Ints = (-1,)
    # rows per model call (BatchElements maximum); each call is sorted by length, so larger
    # calls pad less: 1,024 rows scored ~10% faster than 256 on SST-2 (benchmarks/score.py)
    batch_size: AtLeast(1) = 1024
    min_batch_size: Optional[AtLeast(1)] = None  # BatchElements minimum (None: batch_size; lower it for streaming inputs)
    max_length: Optional[AtLeast(2)] = None  # tokens per row (None: the teacher's training max_length, else 128)
    # teacher forward pass: packed (padding-free, the families packed.py serves; checked against the model's own
    # forward on load), padded (the model's own forward on length-sorted padded batches), auto (packed on CPU)
    forward: str = "auto"
    forward_rows: Optional[int] = None  # rows per forward pass (None: 1,024 packed, 128 padded)
    forward_tokens: Optional[int] = None  # tokens per forward pass, padding included (None: 4,096 packed, 2,048 padded)
    shard_rows: AtLeast(1) = 10_000  # rows per committed output shard: the unit a resumed run can skip
    # also commit a shard once its oldest row has waited this long, so a killed run loses at most
    # about this much scoring (10,000 rows of a large teacher on CPU can take an hour)
    shard_seconds: NonNegative = 60.0
    # score an input without its _COMPLETE marker (a killed `augment` run): only to salvage its rows
    allow_incomplete: bool = False
    large_model: bool = False  # one teacher per machine, shared by its worker processes (big teachers)
    torch_threads: Optional[AtLeast(1)] = None  # torch threads per worker (None: cores / local workers)
    allow_pickle: bool = False  # accept pickle weights (pytorch_model.bin): only files you trust
    trust_remote_code: bool = False  # run Python code shipped with the teacher: only models you trust
    # several --teacher (an ensemble): teacher_logits holds mean (their mean logits) | probs (log of their
    # mean probabilities) | K (teacher K's own logits, 0 = the first); each member's are kept beside
    combine: Annotated[str, BeforeValidator(_as_text)] = "mean"

    def __post_init__(self):
        check_forward_options(self.forward, self.forward_rows, self.forward_tokens)  # a ValueError too
        check_combine(self.combine)


# StudentConfig.lr when it is None, per student family: AdamW's peak learning rate.
DEFAULT_LR = {"bilstm": 2e-3, "transformer": 1e-4}

# Transformer presets (`preset: NAME`): a published recipe's settings, under the ones given (a setting in
# the YAML or on the command line wins). Paper settings and what differs here: README.md, "Layer-wise
# transfer with the teacher online, and the presets".
# The transformer presets' learning rate: the schedule their authors' code trains with, BERT's (linear warm-up
# over 10 % of the steps, then linear decay to 0; DistilBERT's train.py warms up over 5 %). The BiLSTM presets
# (tang: Adadelta, xtremedistil: Adam) keep a constant rate, as their papers.
_BERT_SCHEDULE = {"schedule": "linear", "warmup": 0.1}
STUDENT_PRESETS: dict[str, dict[str, Any]] = {
    # Jiao et al. 2020, task distillation: embedding, hidden and attention-score MSE, then soft CE (T = 1).
    "tinybert": {"student": "transformer", "schedule": "two-step", "layer_map": "uniform", "emb_mse": 1.0,
                 "hidden_mse": 1.0, "att_mse": 1.0, "kd": 1.0, "temperature": 1.0, "ce": 0.0, "mse": 0.0, "engine": _BERT_SCHEDULE},
    # Sun et al. 2020: feature-map and attention transfer, progressive (layer by layer), then prediction KD.
    "mobilebert": {"student": "transformer", "schedule": "pkt", "layer_map": "uniform", "hidden_mse": 1.0,
                   "att_kl": 1.0, "kd": 1.0, "temperature": 1.0, "ce": 0.0, "mse": 0.0, "engine": _BERT_SCHEDULE},
    # Wang et al. 2020: the last layer's attention and value-relation KL, then prediction KD.
    "minilm": {"student": "transformer", "schedule": "two-step", "layer_map": "last-1", "att_kl": 1.0,
               "value_kl": 1.0, "kd": 1.0, "temperature": 1.0, "ce": 0.0, "mse": 0.0, "engine": _BERT_SCHEDULE},
    # Sanh et al. 2019 without the MLM term: 5·KD(T = 2) + 1·cosine of the last hidden states, skip init.
    "distilbert": {"student": "transformer", "schedule": "joint", "kd": 5.0, "temperature": 2.0, "cos": 1.0,
                   "ce": 0.0, "mse": 0.0, "engine": {"schedule": "linear", "warmup": 0.05}},
    # Sun et al. 2019 (PKD-skip): (1 - α)·CE + α·KD(T) + β·PKD with α = 0.7, T = 5, β = 100.
    "pkd": {"student": "transformer", "schedule": "joint", "ce": 0.3, "kd": 0.7, "temperature": 5.0,
            "pkd": 100.0, "mse": 0.0, "engine": _BERT_SCHEDULE},
}


def with_preset(values: Any) -> Any:
    """StudentConfig settings with a transformer preset's values under the given ones (other values as they are)."""
    if isinstance(values, dict) and values.get("preset") in STUDENT_PRESETS:
        return {**STUDENT_PRESETS[values["preset"]], **values}
    return values


def _layer_map(value: Any) -> Any:
    # YAML `layer_map: [2, 4, 6]` (or `6` for a 1-layer student) means the string "2,4,6" that flags take.
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return ",".join(str(v) for v in value) if isinstance(value, (list, tuple)) else value


LAYER_TEXTS_REST = "rest"  # a run config's students.NAME.layer_texts: the run makes the set (runner)


@with_config(_STRICT)
@dataclass(frozen=True)
class StudentConfig:
    """`transferset train` (flags or --config YAML) and each entry of the run's `students:` section."""

    student: str = "bilstm"  # student family: bilstm | transformer
    schedule: str = "joint"  # joint | progressive | distill-then-finetune | two-step | pkt
    epochs: AtLeast(1) = 5  # at most this many epochs per phase (progressive: per unfreezing step)
    # two-step / pkt: epochs of each layer-loss phase (TinyBERT: 20 intermediate, 3 prediction); unset: epochs
    layer_epochs: Optional[AtLeast(1)] = None
    # a transfer set (`transferset augment`'s output; scored or not) that the phases training on layer losses
    # alone read instead of the scored set (two-step's intermediate step, pkt's layer stages): more unlabeled
    # text for them, as TinyBERT's general distillation; they need only text (the teacher runs alongside).
    # In a run config, `rest` (LAYER_TEXTS_REST): the train file's rows that no pool, validation or test
    # sentence holds, as they are (the run's layer_texts stage)
    layer_texts: Optional[str] = None
    lr: Optional[Positive] = None  # None: the family's DEFAULT_LR (BiLSTM 2e-3, transformer 1e-4)
    batch_size: AtLeast(1) = 64  # rows per step
    patience: AtLeast(1) = 2  # epochs without a better dev accuracy before a phase stops
    seed: int = 0  # initialisation, shuffling and dropout all derive from it
    weight_decay: NonNegative = 0.01
    grad_clip: NonNegative = 1.0  # max gradient norm (0: no clipping)
    max_length: Optional[AtLeast(2)] = None  # tokens per row (None: the scored set's max_length, else 128)
    shuffle_rows: AtLeast(1) = 16384  # rows held in memory for shuffling
    threads: Optional[AtLeast(1)] = None  # torch CPU threads (None: leave torch's setting alone)
    dev_text_b_column: Optional[str] = None  # sentence pairs: the dev file's second text column
    allow_incomplete: bool = False  # train on a scored set whose run did not finish (no _COMPLETE marker)
    # loss weights (of the joint schedule; the other schedules use them where their stage needs one)
    ce: NonNegative = 1.0  # cross-entropy on gold labels (rows with a label)
    mse: NonNegative = 1.0  # MSE on logits (Tang et al. 2019)
    kd: NonNegative = 0.0  # KL(softmax(t/T) || softmax(s/T)) * T^2 (Hinton et al. 2015)
    repr: NonNegative = 0.0  # MSE of the student's representation head to teacher_hidden (XtremeDistil)
    pkd: NonNegative = 0.0  # BERT-PKD: normalised [CLS] of intermediate layers (transformer student)
    # layer losses against the teacher run alongside (transformer student, the teacher's tokenizer)
    emb_mse: NonNegative = 0.0  # TinyBERT: MSE of the embedding layer's output (through W_h across widths)
    hidden_mse: NonNegative = 0.0  # TinyBERT / MobileBERT: per-token MSE of mapped layers' hidden states
    att_mse: NonNegative = 0.0  # TinyBERT: MSE of mapped layers' attention scores (before softmax)
    att_kl: NonNegative = 0.0  # MobileBERT / MiniLM: KL of mapped layers' attention distributions
    value_kl: NonNegative = 0.0  # MiniLM: KL of mapped layers' value relations softmax(V·V^T/sqrt(d_k))
    cos: NonNegative = 0.0  # DistilBERT: 1 - cosine of the last hidden states, per token
    # student layer -> teacher layer for the layer losses: uniform | first | last | last-K | 2,4,6 | 3:6,4:12
    layer_map: Annotated[str, BeforeValidator(_layer_map)] = "uniform"
    temperature: Positive = 1.0  # T of the kd loss
    # tokens and initialisation
    tokens: Literal["wordpiece", "words"] = "wordpiece"  # wordpiece (the teacher's) | words (vocabulary from the transfer set)
    min_count: AtLeast(1) = 1  # words: keep words seen at least this often
    max_vocab: AtLeast(2) = 50000  # words: vocabulary size cap
    # bilstm + wordpiece: embed only the WordPiece ids the transfer set uses. Off by default: with the
    # teacher's whole vocabulary, words the transfer set never shows keep their teacher-derived
    # (PCA) vectors instead of becoming [UNK] (+1.6 on SST-2 dev, benchmarks/README.md)
    trim_vocab: bool = False
    # teacher (PCA of the teacher's input embeddings: the BiLSTM's table, a narrower transformer's tables) | random
    embed_init: Literal["teacher", "random"] = "teacher"
    # keep the embedding table fixed in every phase ("static" embeddings): words the transfer set
    # never shows keep teacher-derived vectors in the same space as the rest, and an epoch is ~3x
    # faster with the whole vocabulary. None: frozen for a BiLSTM whose embeddings come from the teacher
    freeze_embeddings: Optional[bool] = None
    teacher: Optional[str] = None  # teacher directory (None: the set's teacher_id metadata when a directory)
    tokenizer: Optional[str] = None  # tokenizer directory (None: the set's tokenizer metadata, else the teacher's)
    # bilstm presets: tang | xtremedistil; transformer presets (settings of a published recipe, under the ones
    # given; applied where settings are read): tinybert | mobilebert | minilm | distilbert | pkd
    preset: Optional[str] = None
    model: dict[str, Any] = field(default_factory=dict)  # the student model's own settings, e.g. {hidden: 150}
    # reporting
    latency_examples: AtLeast(1) = 256  # dev rows timed for the latency figures
    agreement_rows: AtLeast(1) = 5000  # transfer rows used for teacher agreement when dev has no teacher columns
    resume: bool = False  # go on from OUTPUT/checkpoint/ of a killed run with the same settings
    checkpoint_steps: Optional[AtLeast(1)] = None  # also write the checkpoint every N optimizer steps (None: per epoch)
    # device, precision, processes (`torchrun --nproc_per_node N -m transferset.app.cli train ...`: DDP, gloo on
    # CPU), grad_accum, schedule, warmup, tracker (transferset/training)
    engine: EngineConfig = field(default_factory=EngineConfig)

    @model_validator(mode="before")
    @classmethod
    def _preset(cls, values: Any) -> Any:
        preset = values.get("preset") if isinstance(values, dict) else None
        defaults = STUDENT_PRESETS.get(preset, {}).get("engine", {})  # a partial engine section keeps the preset's
        return engine_section(with_preset(values), defaults, legacy=("device", "bf16", "report_to"))

    def frozen_embeddings(self) -> bool:
        """Whether the embedding table stays fixed (`freeze_embeddings`, None: a teacher-initialised BiLSTM)."""
        if self.freeze_embeddings is not None:
            return self.freeze_embeddings
        return self.student == "bilstm" and self.embed_init == "teacher"


@with_config(_STRICT)
@dataclass(frozen=True)
class BeamConfig:
    """The run's `beam:` section: where the augment and score pipelines run."""

    runner: str = DEFAULT_RUNNER  # FnApiRunner runs locally and offline; DataflowRunner for Google Cloud Dataflow
    workers: AtLeast(1) = 1  # local worker processes (FnApiRunner's direct_num_workers, multi-processing)
    # any other Beam pipeline option, e.g. {project: P, region: europe-west4, temp_location: gs://B/tmp}
    options: dict[str, Any] = field(default_factory=dict)


@with_config(_STRICT)
@dataclass(frozen=True)
class PredictConfig:
    """`transferset predict`'s settings (what is not a path or a one-off switch)."""

    format: Literal[PREDICTION_FORMATS] = "parquet"  # parquet (zstd) or jsonl
    text_column: Optional[str] = None  # text column of the inputs (None: sentence, else text)
    text_b_column: Optional[str] = None  # second text column: sentence pairs (written as text_b)
    max_chars: AtLeast(1) = DEFAULT_MAX_CHARS  # longer rows are rejected, as augment rejects them
    batch_size: AtLeast(1) = 256  # rows per forward pass
    max_length: Optional[AtLeast(1)] = None  # tokens per row (None: the model's own)
    threads: Optional[AtLeast(1)] = None  # torch and onnxruntime CPU threads (None: torch's setting; per worker on Beam)
    # inputs of at least this many rows run on Apache Beam, fewer in this process (--beam, --runner or
    # --workers: Beam whatever the size)
    beam_above: AtLeast(1) = 100_000
    # a model with early exits (`transferset exits`): a row leaves at the first layer whose branch's normalised
    # entropy is below this (0 or None: every layer, the model without exits; 1: the earliest exits)
    speed: Optional[Probability] = None


EXIT_TARGETS = ("auto", "cached", "own")


@with_config(_STRICT)
@dataclass(frozen=True)
class ExitsConfig:
    """`transferset exits`: FastBERT's branches after every layer of a frozen model, self-distilled."""

    # what each branch learns (KL): cached = the scored set's teacher_logits (the model must be the set's
    # teacher: same weights); own = the model's final classifier on each row (a transformer student);
    # auto = cached when the model is the set's teacher, else own
    targets: Literal[EXIT_TARGETS] = "auto"
    pool: Literal["mean", "cls"] = "mean"  # what a branch reads of its layer: the masked mean of its tokens, or [CLS]
    width: AtLeast(1) = 128  # the branch's inner width (pooled states → width → classes), FastBERT's 128
    epochs: AtLeast(1) = 10  # passes over the rows' cached pooled states (the frozen model runs once)
    lr: Positive = 1e-3  # AdamW learning rate of the branches
    batch_size: AtLeast(1) = 64  # rows per step, and per forward of the frozen model
    seed: int = 0  # the branches' init and the rows' order
    max_rows: Optional[AtLeast(1)] = None  # use the set's first N rows only (None: all of them)
    # tokens per row, kept by the saved model (None: the model's own); for the teacher, the length the set was
    # scored at (its stats.json max_length) puts the branches' inputs and the cached logits on the same tokens
    max_length: Optional[AtLeast(1)] = None
    threads: Optional[AtLeast(1)] = None  # torch CPU threads (None: torch's setting)
    engine: EngineConfig = field(default_factory=EngineConfig)  # how the branches train (transferset/training)

    @model_validator(mode="before")
    @classmethod
    def _engine(cls, values: Any) -> Any:
        return engine_section(values, {})


@with_config(_STRICT)
@dataclass(frozen=True)
class PruneConfig:
    """`transferset prune`'s settings: attention heads ranked on the selection split, removed, recovered."""

    # heads to remove: a count (e.g. 12) or a fraction of the model's heads (e.g. 0.25); 0 removes none and
    # only the recovery runs: the model distilled on its own cached logits (a born-again model)
    heads: NonNegative = 0.25
    # importance = |d loss / d head gate| summed over the selection rows; the loss is cross-entropy against
    # labels (the gold label, the model's own predicted label where a row has none) or predicted (always its own)
    importance_loss: Literal["labels", "predicted"] = "labels"
    normalize: bool = True  # divide each layer's importances by their L2 norm before the global ranking (Michel et al.)
    epochs: AtLeast(0) = 2  # recovery: epochs of distillation from the scored set's teacher_logits (0: none)
    max_steps: Optional[AtLeast(1)] = None  # recovery: at most this many optimizer steps in all (None: whole epochs)
    loss: Literal["mse", "kd"] = "mse"  # recovery loss on teacher_logits: mse (Tang et al.) or kd (KL at temperature)
    temperature: Positive = 1.0  # kd's T
    lr: Positive = 3e-5  # AdamW learning rate of the recovery
    batch_size: AtLeast(1) = 32  # rows per recovery step and per importance batch
    weight_decay: NonNegative = 0.01
    grad_clip: NonNegative = 1.0  # max gradient norm (0: no clipping)
    seed: int = 0  # shuffling and dropout of the recovery
    shuffle_rows: AtLeast(1) = 16384  # rows held in memory for shuffling
    max_length: Optional[AtLeast(2)] = None  # tokens per row (None: the model's own)
    threads: Optional[AtLeast(1)] = None  # torch CPU threads (None: leave torch's setting alone)
    engine: EngineConfig = field(default_factory=EngineConfig)  # how the recovery trains (the ranking runs on the CPU)

    @model_validator(mode="before")
    @classmethod
    def _engine(cls, values: Any) -> Any:
        return engine_section(values, {}, legacy=("device",))


@with_config(_STRICT)
@dataclass(frozen=True)
class LowResConfig:
    """k labeled rows per class (seeded), the rest of train, labels dropped, as unlabeled text."""

    per_class: AtLeast(1) = 500
    seed: int = 0


@with_config(_STRICT)
@dataclass(frozen=True)
class ValidationConfig:
    """A validation split carved from train (seeded): every choice is made on it, the dev file becomes the test."""

    rows: AtLeast(1) = 2000
    seed: int = 0
    # sentence: rows are drawn among those no other train row contains (whole sentences, when train also
    # holds their phrases as SST-2 does) and every train row inside a validation row leaves the pools, so
    # no part of a validation sentence reaches the teacher or the transfer set | row: any row (the pools
    # lose exact copies only)
    by: Literal["sentence", "row"] = "sentence"


@with_config(_STRICT)
@dataclass(frozen=True)
class ReportConfig:
    """The run's `report:` section: how its latency columns are taken (every model timed together, one
    thread, batch 1 and 64; transferset.timing)."""

    latency_rows: AtLeast(1) = 256  # the first N rows of the selection split are timed
    latency_rounds: AtLeast(1) = 5  # interleaved rounds; the table shows each model's median


@with_config(_STRICT)
@dataclass(frozen=True)
class CompressConfig:
    """The run's `compress:` section: cheaper models made from the run's own (issue 28), each scored on the
    test split and timed in the report beside the teacher and the students, so the report's table and
    accuracy/latency plot show what each way of saving time costs. Every part is off until set."""

    # ONNX int8 exports (`transferset export --quantize int8`, checked against PyTorch) of these models:
    # `teacher` and/or student names, e.g. [teacher, distilled]
    int8: Names = ()
    # FastBERT's early exits on the teacher (`transferset exits`), trained on the scored set's logits; the
    # report shows the teacher with exits at each of `exit_speeds`
    exits: Optional[ExitsConfig] = None
    exit_speeds: Speeds = (0.5,)  # thresholds on a branch's normalised entropy: 0 runs every layer, 1 exits first
    # the teacher's least important attention heads removed and recovered on the scored set (`transferset prune`)
    prune: Optional[PruneConfig] = None

    def __post_init__(self):
        if not self.exit_speeds:
            raise ValueError("exit_speeds is empty: give at least one speed (e.g. 0.5), or leave exits out")
        if len(set(self.int8)) != len(self.int8):
            raise ValueError(f"int8 {list(self.int8)} names a model twice")

    def active(self) -> bool:
        return bool(self.int8) or self.exits is not None or self.prune is not None


@with_config(_STRICT)
@dataclass(frozen=True)
class RunConfig:
    """`transferset run --config YAML`: the whole chain, teacher → augment → score → students → report."""

    run_dir: str = "runs/run"  # every stage writes into a folder of it
    data: Optional[str] = None  # folder with train.tsv and dev.tsv (None: ../shared/data/sst2, else the hub's GLUE SST-2)
    # labeled test file: every model is scored on it at the end and no choice ever sees it (None: the data
    # folder's test.tsv when there is one; with `validation`, the dev file)
    test: Optional[str] = None
    # carve a validation split from train for early stopping and the teacher's best epoch: the dev file
    # then becomes the test split (for tasks whose labeled test split is not public, as SST-2's)
    validation: Optional[ValidationConfig] = None
    labeled_limit: Optional[AtLeast(1)] = None  # the first N train rows as labeled data
    unlabeled_rows: Optional[AtLeast(-1)] = None  # the next N train rows, labels dropped, as unlabeled text (-1: all the rest)
    lowres: Optional[LowResConfig] = None  # k labeled rows per class, the rest of train as unlabeled text
    unlabeled_limit: Optional[AtLeast(0)] = None  # at most N unlabeled rows
    teacher_path: Optional[str] = None  # reuse this fine-tuned teacher instead of training one
    # a teacher ensemble, scored once by each member (score.combine: how their logits become the target):
    teacher_seeds: Optional[Ints] = None  # fine-tune one teacher per seed with the teacher: section, e.g. [0, 1, 2]
    teacher_paths: Optional[Names] = None  # or reuse these fine-tuned teachers (same labels; any backbones)
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    score: ScoreConfig = field(default_factory=ScoreConfig)
    students: dict[str, StudentConfig] = field(default_factory=dict)
    beam: BeamConfig = field(default_factory=BeamConfig)
    report: ReportConfig = field(default_factory=ReportConfig)
    compress: CompressConfig = field(default_factory=CompressConfig)

    def __post_init__(self):
        if self.lowres is not None and self.unlabeled_rows is not None:
            raise ValueError("lowres and unlabeled_rows both choose the unlabeled text: set one of them")
        if not self.students:
            raise ValueError("no students: add e.g. students: {distilled: {student: bilstm}}")
        given = [k for k in ("teacher_path", "teacher_seeds", "teacher_paths") if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(f"{' and '.join(given)} each choose the teacher: set one of them")
        for key in ("teacher_seeds", "teacher_paths"):
            values = getattr(self, key)
            if values is not None and not values:
                raise ValueError(f"{key} is empty: an ensemble needs at least one teacher (or leave {key} out)")
            if values is not None and len(set(values)) != len(values):
                raise ValueError(f"{key} {list(values)} names a teacher twice: each member must be another teacher")
        unknown = [n for n in self.compress.int8 if n != "teacher" and n not in self.students]
        if unknown:
            raise ValueError(f"compress.int8 names {unknown}: neither `teacher` nor a student of this run "
                             f"({', '.join(self.students)})")
        ensemble = len(self.teacher_seeds or self.teacher_paths or ()) > 1
        compressed = [k for k, on in (("int8: [teacher]", "teacher" in self.compress.int8),
                                      ("exits", self.compress.exits is not None),
                                      ("prune", self.compress.prune is not None)) if on]
        if ensemble and compressed:
            raise ValueError(f"compress: {', '.join(compressed)} work on one teacher, and this run's teacher is an "
                             "ensemble; compress a member with `transferset export/exits/prune --model "
                             "RUN/teachers/seedS`, or compress the students only")
