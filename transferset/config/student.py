"""A student's settings: `transferset train` (flags or --config YAML) and each entry of a run's `students:`.

One section per concern, each a dataclass whose fields are flags of their own names too (`--trim-vocab`,
`--lr 1e-3`, `--warmup 0.2`: transferset/app/cli/flags.py): the family and its `model:`, the phase plan and its
`losses:`, `vocab:` (tokens and the embedding table), `data:` (what it reads and how), `optim:`, `engine:` and
`report:` (the figures its metrics hold). The layers a student's settings come from (defaults, preset, file,
flags, key=value) are config/precedence.py's; earlier spellings (a flat `trim_vocab`, `lr`) are migrate's alone
(transferset/app/migrate/spellings.py).
"""
from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from typing import Annotated, Any, Literal, Mapping, Optional

import pydantic
from pydantic import AfterValidator, BeforeValidator, model_validator, with_config
from typing_extensions import TypedDict

from transferset.config.common import _STRICT
from transferset.config.engine import StudentEngineConfig
from transferset.config.precedence import DEFAULT_FAMILY, DEFAULT_LOSSES, loss_weight, student_values
from transferset.runtime.typed import AtLeast, NonNegative, Positive


def _layer_map(value: Any) -> Any:
    # YAML `layer_map: [2, 4, 6]` (or `6` for a 1-layer student) means the string "2,4,6" that flags take.
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return ",".join(str(v) for v in value) if isinstance(value, (list, tuple)) else value


class _ModelBounds(TypedDict, total=False):
    """The bounds of a student's `model:` settings checked when the settings load (each family checks the rest when
    it builds: students/families/), so that a bad one stops before any stage, naming the key and the bound."""

    __pydantic_config__ = pydantic.ConfigDict(extra="allow")  # every other key passes as it is
    n_layer: AtLeast(1)  # a transformer student's layers


_MODEL_BOUNDS = pydantic.TypeAdapter(_ModelBounds)


def _model_bounds(model: dict[str, Any]) -> dict[str, Any]:
    # a ValidationError here keeps its key's place: the refusal names students.NAME.model.n_layer
    return _MODEL_BOUNDS.validate_python(model)


ModelSettings = Annotated[dict[str, Any], AfterValidator(_model_bounds)]


LAYER_TEXTS_REST = "rest"  # a run config's students.NAME.layer_texts: the run makes the set (runner)


@with_config(_STRICT)
@dataclass(frozen=True)
class OptimConfig:
    """A student's optimizer, the `optim:` section (AdamW; a sparse word table's rows by lazy Adam): each field is a
    flag of its own name too (`--lr 1e-3`)."""

    lr: Optional[Positive] = None  # peak learning rate (None: the family's, students/: BiLSTM 2e-3, transformer 1e-4)
    embed_lr: Optional[Positive] = None  # the embedding table's learning rate when it learns (its own group; None: lr)
    weight_decay: NonNegative = 0.01  # AdamW's (none on a sparse table)
    grad_clip: NonNegative = 1.0  # max gradient norm (0: no clipping)
    # the trained weights' moving average, evaluated, kept and shipped in their place: its decay per step (0: none)
    ema: Annotated[float, pydantic.Field(ge=0, lt=1)] = 0.0


@with_config(_STRICT)
@dataclass(frozen=True)
class VocabConfig:
    """A student's tokens and embedding table, the `vocab:` section."""

    tokens: Literal["wordpiece", "words"] = "wordpiece"  # wordpiece (the teacher's) | words (vocabulary from the transfer set)
    min_count: AtLeast(1) = 1  # words: keep words seen at least this often
    max_vocab: AtLeast(2) = 50000  # words: vocabulary size cap
    # bilstm / static + wordpiece: embed only the WordPiece ids the transfer set uses. Off by default: with the
    # teacher's whole vocabulary, words the transfer set never shows keep their teacher-derived
    # (PCA) vectors instead of becoming [UNK] (+1.6 on SST-2 dev, benchmarks/README.md)
    trim_vocab: bool = False
    # teacher (PCA of the teacher's input embeddings: the BiLSTM's table, a narrower transformer's tables) | random;
    # bilstm + the teacher's vocabulary also: word2vec (skip-gram on the transfer set's texts, the `vectors` extra)
    # | model2vec (each token alone through the teacher's encoder, PCA, SIF weighting; students/data/vectors.py)
    # | contextual (each token's output state in the teacher's encoder averaged over the transfer set's texts, PCA;
    # kept in $TRANSFERSET_CACHE/vectors for the next student on the same teacher and texts)
    embed_init: Literal["teacher", "random", "word2vec", "model2vec", "contextual"] = "teacher"
    # keep the embedding table fixed in every phase ("static" embeddings): words the transfer set
    # never shows keep teacher-derived vectors in the same space as the rest, and an epoch is ~3x
    # faster with the whole vocabulary. None: frozen for a BiLSTM or static student whose embeddings are not
    # random
    freeze_embeddings: Optional[bool] = None


@with_config(_STRICT)
@dataclass(frozen=True)
class StudentDataConfig:
    """What a student reads and how, the `data:` section (the scored set and the dev file are paths: arguments)."""

    max_length: Optional[AtLeast(2)] = None  # tokens per row (None: the scored set's max_length, else 128)
    shuffle_rows: AtLeast(1) = 16384  # rows held in memory for shuffling
    dev_text_b_column: Optional[str] = None  # sentence pairs: the dev file's second text column
    allow_incomplete: bool = False  # train on a scored set whose run did not finish (no _COMPLETE marker)


@with_config(_STRICT)
@dataclass(frozen=True)
class StudentReportConfig:
    """The figures a student's metrics hold besides its accuracy, the `report:` section."""

    latency_examples: AtLeast(1) = 256  # dev rows timed for the latency figures
    agreement_rows: AtLeast(1) = 5000  # transfer rows used for teacher agreement when dev has no teacher columns


@with_config(_STRICT)
@dataclass(frozen=True)
class StudentConfig:
    """`transferset train` (flags or --config YAML) and each entry of the run's `students:` section."""

    student: str = DEFAULT_FAMILY  # student family: bilstm | transformer | static (mean+max pooled vectors, an MLP)
    # the phase plan: which losses and parameter groups train, phase by phase (students/phases.py): joint |
    # progressive | distill-then-finetune | two-step | pkt (the learning rate's curve is `engine: {schedule: ...}`)
    phases: str = "joint"
    epochs: AtLeast(1) = 5  # at most this many epochs per phase (progressive: per unfreezing step)
    # two-step / pkt: epochs of each layer-loss phase (TinyBERT: 20 intermediate, 3 prediction); unset: epochs
    layer_epochs: Optional[AtLeast(1)] = None
    # a transfer set (`transferset augment`'s output; scored or not) that the phases training on layer losses
    # alone read instead of the scored set (two-step's intermediate step, pkt's layer stages): more unlabeled
    # text for them, as TinyBERT's general distillation; they need only text (the teacher runs alongside).
    # In a run config, `rest` (LAYER_TEXTS_REST): the train file's rows that no pool, validation or test
    # sentence holds, as they are (the run's layer_texts stage)
    layer_texts: Optional[str] = None
    batch_size: AtLeast(1) = 64  # rows per step
    patience: AtLeast(1) = 2  # epochs without a better dev accuracy before a phase stops
    seed: int = 0  # initialisation, shuffling and dropout all derive from it
    threads: Optional[AtLeast(1)] = None  # torch CPU threads (None: leave torch's setting alone)
    # the losses it trains on, each with its weight, {NAME: weight} or {NAME: {weight: W, SETTING: value}}: ce
    # (cross-entropy on gold labels), mse (on logits, Tang et al. 2019), kd (KL at `temperature`, Hinton et al.
    # 2015: {kd: {weight: 1.0, temperature: 2.0}}), repr (XtremeDistil's representation MSE), pkd (BERT-PKD), the
    # layer losses with the teacher run alongside (emb_mse, hidden_mse, att_mse: TinyBERT; att_kl: MobileBERT,
    # MiniLM; value_kl: MiniLM; cos: DistilBERT) and any loss a package registers (docs/architecture.md). Layers
    # merge loss by loss (a preset's, the file's, key=value `losses.kd=2`); unset: ce and mse at 1.0
    losses: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_LOSSES))
    # student layer -> teacher layer for the layer losses: uniform | first | last | last-K | 2,4,6 | 3:6,4:12
    layer_map: Annotated[str, BeforeValidator(_layer_map)] = "uniform"
    teacher: Optional[str] = None  # teacher directory (None: the set's teacher_id metadata when a directory)
    tokenizer: Optional[str] = None  # tokenizer directory (None: the set's tokenizer metadata, else the teacher's)
    # a transformer preset, a published recipe's settings (under the file's, the flags' and key=value's:
    # config/precedence.py): tinybert | mobilebert | minilm | distilbert | pkd
    preset: Optional[str] = None
    # the student model's own settings, e.g. {hidden: 150}; a BiLSTM's named shape: {shape: tang | xtremedistil}
    model: ModelSettings = field(default_factory=dict)
    resume: bool = False  # go on from OUTPUT/checkpoint/ of a killed run with the same settings
    checkpoint_steps: Optional[AtLeast(1)] = None  # also write the checkpoint every N optimizer steps (None: per epoch)
    optim: OptimConfig = field(default_factory=OptimConfig)  # lr, embed_lr, weight_decay, grad_clip
    # device, precision, processes (`torchrun --nproc_per_node N -m transferset.app.cli train ...`: DDP, gloo on
    # CPU), grad_accum, schedule, warmup, tracker (transferset/training). The schedule and warm-up left unset are the
    # family's: a BiLSTM or static student warms up over 10 % of each phase's steps, then decays linearly; a
    # transformer keeps a constant rate (students/families/)
    engine: StudentEngineConfig = field(default_factory=StudentEngineConfig)
    # tokens (wordpiece | words), min_count, max_vocab, trim_vocab, embed_init, freeze_embeddings
    vocab: VocabConfig = field(default_factory=VocabConfig)
    # max_length, shuffle_rows, dev_text_b_column, allow_incomplete
    data: StudentDataConfig = field(default_factory=StudentDataConfig)
    report: StudentReportConfig = field(default_factory=StudentReportConfig)  # latency_examples, agreement_rows

    def __post_init__(self):
        # a section given as a mapping in Python (`StudentConfig(vocab={"trim_vocab": True})`) is that section's
        # settings over its defaults, as in a YAML file (the layers and their checks are typed.load's)
        for name, section in _SECTIONS.items():
            value = getattr(self, name)
            if isinstance(value, Mapping):
                object.__setattr__(self, name, section(**value))

    @model_validator(mode="before")
    @classmethod
    def _layers(cls, values: Any) -> Any:
        # the preset and the family's defaults under what was given, however the config is made (precedence.py)
        return student_values(values)

    def weight(self, loss: str) -> float:
        """The weight `losses:` gives a loss (0.0 when it names none; its settings and checks: students.losses)."""
        return loss_weight(self.losses.get(loss, 0.0))


# StudentConfig's sections, each its settings class (the class of the field's default)
_SECTIONS = {f.name: type(f.default_factory()) for f in fields(StudentConfig)
             if f.default_factory is not MISSING and is_dataclass(f.default_factory())}
