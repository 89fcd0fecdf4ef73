"""The run's `compress:` section and the settings of `transferset exits` and `transferset prune` it holds
(transferset.config imports them back)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Optional

from pydantic import model_validator, with_config

from transferset.config.common import _STRICT, Names, Speeds
from transferset.config.engine import (EXITS_OPTIM, PRUNE_OPTIM, EngineConfig, TrainerOptimConfig, engine_section,
                                       section_over)
from transferset.runtime.typed import AtLeast, NonNegative, Positive


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
    batch_size: AtLeast(1) = 64  # rows per step, and per forward of the frozen model
    seed: int = 0  # the branches' init and the rows' order
    max_rows: Optional[AtLeast(1)] = None  # use the set's first N rows only (None: all of them)
    # tokens per row, kept by the saved model (None: the model's own); for the teacher, the length the set was
    # scored at (its stats.json max_length) puts the branches' inputs and the cached logits on the same tokens
    max_length: Optional[AtLeast(1)] = None
    threads: Optional[AtLeast(1)] = None  # torch CPU threads (None: torch's setting)
    engine: EngineConfig = field(default_factory=EngineConfig)  # how the branches train (transferset/training)
    # AdamW: lr (1e-3), weight_decay (0.01), grad_clip (0: none)
    optim: TrainerOptimConfig = field(default_factory=lambda: TrainerOptimConfig(**EXITS_OPTIM))

    @model_validator(mode="before")
    @classmethod
    def _engine(cls, values: Any) -> Any:
        return section_over(engine_section(values, {}), "optim", EXITS_OPTIM)


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
    batch_size: AtLeast(1) = 32  # rows per recovery step and per importance batch
    seed: int = 0  # shuffling and dropout of the recovery
    shuffle_rows: AtLeast(1) = 16384  # rows held in memory for shuffling
    max_length: Optional[AtLeast(2)] = None  # tokens per row (None: the model's own)
    threads: Optional[AtLeast(1)] = None  # torch CPU threads (None: leave torch's setting alone)
    engine: EngineConfig = field(default_factory=EngineConfig)  # how the recovery trains (the ranking runs on the CPU)
    # the recovery's AdamW: lr (3e-5), weight_decay (0.01), grad_clip (1.0)
    optim: TrainerOptimConfig = field(default_factory=lambda: TrainerOptimConfig(**PRUNE_OPTIM))

    @model_validator(mode="before")
    @classmethod
    def _engine(cls, values: Any) -> Any:
        return section_over(engine_section(values, {}), "optim", PRUNE_OPTIM)


@with_config(_STRICT)
@dataclass(frozen=True)
class CompressConfig:
    """The run's `compress:` section: cheaper models made from the run's own, each scored on the
    test split and timed in the report beside the teacher and the students, so the report's table and
    accuracy/latency plot show what each way of saving time costs. Every part is off until set."""

    # ONNX int8 exports (`transferset export --quantize int8`, checked against PyTorch) of these models:
    # `teacher` and/or student names, e.g. [teacher, distilled]
    int8: Names = ()
    # every student and the teacher (not an ensemble) also exported as it ships: ONNX, int8 where the export's
    # check passes it, else float32. The report times each on ONNX Runtime beside its PyTorch form and against the
    # teacher's own export, and RUN/chosen may be one of them (false: only the int8 names above are exported)
    ship: bool = True
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
