"""Typed configuration: one dataclass per stage and the run that composes them.

This package is the only place a default is written (this module, and for their sections augment_settings.py,
compress.py and student.py, whose names it imports back; common.py holds the value types they share), but for
three kinds it takes from their owner:
each augment op's settings (a dataclass in its module, transferset/augment/OP.py: AugmentConfig is
composed of them), the readers' label column and row-length limit (transferset.sources) and the
teacher's default model (transferset.models.loading, which finds it offline): config is imported by the
augment package's neighbours, so those cannot import config. Command-line flags
(`transferset augment --n-iter 20`) and run-YAML sections (`augment: {n_iter: 20}`) map onto
the fields one to one: transferset/app/cli/flags.py builds the flags and their `--help` (the comment
after each field) from these dataclasses, and transferset/runtime/typed.py type-checks every value with
pydantic before any stage runs, refusing a bad one with its key, the value, the expected type and
where it came from. Stage functions receive these objects; no argv is built in between.

Paths (inputs, outputs) and one-off switches (`--overwrite`, `--resume`) are not settings:
they are arguments of the stage functions, so a run YAML cannot point two stages at one folder.
Queries that belong to a package live there (augment.compose.word_ops, students.losses.LossWeights.of,
pipelines.runtime.beam_flags); the checks here look at values only.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BeforeValidator, PlainValidator, model_validator, with_config

from transferset.models.loading import DEFAULT_TEACHER_MODEL  # the packaged model loading finds offline
from transferset.runtime.typed import AtLeast, NonNegative, Positive, Probability
from transferset.sources import DEFAULT_MAX_CHARS
# Shared value types and checks, the compress section's settings and a student's: modules of this package,
# imported back so that `from transferset.config import X` finds every setting.
from transferset.config.augment_settings import RECIPES, AugmentConfig, nested_ops  # noqa: F401
from transferset.config.common import (_STRICT, COMBINES, FORWARDS, POOLINGS, SCORE_PRECISIONS,  # noqa: F401
                                       Ints, LabelNames, Names, Speeds, _as_text, _split_commas, check_combine,
                                       check_forward_options)
from transferset.config.compress import EXIT_TARGETS, CompressConfig, ExitsConfig, PruneConfig  # noqa: F401
from transferset.config.engine import (DEVICES, LR_SCHEDULES, PRECISIONS, StudentEngineConfig,  # noqa: F401
                                       TEACHER_ENGINE, TEACHER_OPTIM, PRUNE_OPTIM, EXITS_OPTIM, TRACKERS,
                                       EngineConfig, TrainerOptimConfig, engine_section, section_over)
from transferset.config.precedence import STUDENT_LAYERS, STUDENT_PRESETS  # noqa: F401
from transferset.config.search import SearchConfig  # noqa: F401
from transferset.config.student import (LAYER_TEXTS_REST, ModelSettings, OptimConfig, StudentConfig,  # noqa: F401
                                        StudentDataConfig, StudentReportConfig, VocabConfig)

# Values that travel through several modules but are defaults of settings, written once here.
DEFAULT_RUNNER = "FnApiRunner"
# Tokens per row wherever no setting or recorded value says otherwise (teacher, scoring, students, report).
DEFAULT_MAX_LENGTH = 128
# DEFAULT_MAX_CHARS (longer rows are rejected: augment, predict) is the readers' (transferset.sources).
PREDICTION_FORMATS = ("parquet", "jsonl")  # PredictConfig.format
# --- stages ----------------------------------------------------------------------------------

@with_config(_STRICT)
@dataclass(frozen=True)
class TeacherConfig:
    """`transferset teacher` and the run's `teacher:` section."""

    model: str = DEFAULT_TEACHER_MODEL  # base model: hub name or local directory (the default is packaged offline)
    epochs: AtLeast(1) = 3  # passes over the labeled data at most; the best dev checkpoint is kept
    # stop after this many epochs without a better selection accuracy (None: every epoch runs): an epoch that does
    # not improve the teacher is minutes its students never use
    patience: Optional[AtLeast(1)] = 1
    batch_size: AtLeast(1) = 32
    max_length: AtLeast(2) = DEFAULT_MAX_LENGTH  # tokens per row; longer rows are truncated
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
    # AdamW: lr (5e-5, peak of the engine's linear warm-up and decay), weight_decay (0.01), grad_clip (1.0)
    optim: TrainerOptimConfig = field(default_factory=lambda: TrainerOptimConfig(**TEACHER_OPTIM))

    @model_validator(mode="before")
    @classmethod
    def _engine(cls, values: Any) -> Any:
        return section_over(engine_section(values, TEACHER_ENGINE), "optim", TEACHER_OPTIM)


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
    # the teacher's weights and arithmetic when scoring: fp32 | bf16 (1.5-1.75x the rows/s of fp32 on a CPU with
    # AVX512-BF16 or AMX, not measured on a GPU; logits within ~0.1 of fp32's, benchmarks/score.py) | auto (bf16
    # where the scoring device has bfloat16 arithmetic, else fp32; decided where the pipeline is launched). Each
    # shard records the precision it was scored at.
    precision: Literal[SCORE_PRECISIONS] = "auto"
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
    # entropy is below this (0: every layer, the model without exits; 1: the earliest exits; None: the speed the
    # folder's exits.json records, a search's chosen student, else 0)
    speed: Optional[Probability] = None


@with_config(_STRICT)
@dataclass(frozen=True)
class LowResConfig:
    """k labeled rows per class (seeded), the rest of train, labels dropped, as unlabeled text."""

    per_class: AtLeast(1) = 500
    seed: int = 0


def _rows(value: Any) -> Any:
    if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value
    raise ValueError(f"{value!r}: give a number of rows (1 or more), or auto")


Rows = Annotated[Union[int, Literal["auto"]], PlainValidator(_rows)]


@with_config(_STRICT)
@dataclass(frozen=True)
class ValidationConfig:
    """A validation split carved from train (seeded): every choice is made on it, the dev file becomes the test."""

    # how many train rows: N, or auto: 10 % of the accepted rows, raised toward 5 per class (never above 20 % of
    # them), at most 2,000; a file too small for any carve (fewer than 2 rows per class) is refused
    rows: Rows = "auto"
    seed: int = 0
    # sentence: rows are drawn among those no other train row contains (whole sentences, when train also
    # holds their phrases as SST-2 does) and every train row inside a validation row leaves the pools, so
    # no part of a validation sentence reaches the teacher or the transfer set | row: any row (the pools
    # lose exact copies only)
    by: Literal["sentence", "row"] = "sentence"
    # per class: null (auto) keeps the seeded draw over all rows when every class keeps train rows and, with at
    # least as many rows as classes, every class with 2 rows or more has one in validation, else carves as true
    # does | true: each class gives its share of the rows (at least one where it can), never all of its rows |
    # false: the seeded draw over all rows, whatever it leaves
    stratify: Optional[bool] = None


@with_config(_STRICT)
@dataclass(frozen=True)
class ReportConfig:
    """The run's `report:` section: how its latency columns are taken (every model timed together, one
    thread, batch 1 and 64; transferset.runtime.timing)."""

    latency_rows: AtLeast(1) = 256  # the first N rows of the selection split are timed
    latency_rounds: AtLeast(1) = 5  # interleaved rounds; the table shows each model's median
    # without a search, RUN/chosen is the most accurate model on the selection split of those at least this many
    # times the teacher's speed at batch 1 on one thread (transferset/app/report/chosen.py)
    min_speedup: Positive = 10.0


@with_config(_STRICT)
@dataclass(frozen=True)
class RunConfig:
    """`transferset run --config YAML`: the whole chain, teacher → augment → score → students → report."""

    run_dir: str = "runs/run"  # every stage writes into a folder of it
    # the train file (TSV, CSV, JSONL, Parquet), hf:NAME[:CONFIG] (its train and validation splits), or a folder
    # with train.tsv and dev.tsv (None: ../shared/data/sst2, else the hub's GLUE SST-2)
    data: Optional[str] = None
    # labeled selection file: the teacher's best epoch and early stopping (None: the folder's dev.tsv, the hf
    # dataset's validation split; a train file needs it or `validation`, which carves the split from train)
    dev: Optional[str] = None
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
    # the most accurate student under a budget (transferset/app/stages/search.py); None: no search
    search: Optional[SearchConfig] = None
    # minutes the run may take on this machine (`run --budget-minutes`): when the plan's estimate is longer, the
    # transfer set's variants, the students' epochs, the search's last rung, the unlabeled rows and the teacher's
    # epochs are cut to fit, each step where the distilled student loses least per minute saved
    # (transferset/app/planning/time_budget.py), and re-fitted to the minutes left after each stage; a teacher cut to
    # one epoch trains at lr 1.5e-4 where its lr is the default 5e-5; None: no limit
    budget_minutes: Optional[Positive] = None

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
