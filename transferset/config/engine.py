"""The sections every trainer runs on (transferset/training): the engine of the teacher, each student, prune's
recovery and exits (`engine:` in YAML, `--engine-*` flags), and the optimizer of the teacher, prune and exits
(`optim:`, as a student's: config.OptimConfig)."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal, Optional

from pydantic import with_config

from transferset.config.common import _STRICT
from transferset.runtime.typed import AtLeast, NonNegative, Positive, Probability

DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("fp32", "bf16", "fp16", "auto")
LR_SCHEDULES = ("constant", "linear", "cosine")
TRACKERS = ("none", "tensorboard", "mlflow", "wandb")


@with_config(_STRICT)
@dataclass(frozen=True)
class EngineConfig:
    """How a trainer runs: the `engine:` section of the teacher, each student, prune and exits (flags alike)."""

    device: Literal[DEVICES] = "auto"  # cpu | cuda | auto (cuda when torch sees one)
    # fp32 | bf16 (autocast: GPUs, CPUs with AMX / AVX512-BF16) | fp16 (autocast and a gradient scaler: CUDA only) |
    # auto (bf16 where the device has bfloat16 arithmetic, else fp32: the teacher's default)
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
    # none | tensorboard | mlflow | wandb (its package installed; `pip install transferset[tracking]`: tensorboard
    # and mlflow, whose runs go to OUTPUT/logs/mlruns unless MLFLOW_TRACKING_URI names a server)
    tracker: Literal[TRACKERS] = "none"


# A trainer's engine section: what the YAML / flags give, over the trainer's own defaults (a partial section
# keeps the rest of them): the teacher's and compress's. Prune's recovery and exits train at a constant rate
# unless the section says otherwise. A student's engine is a StudentEngineConfig: what it does not give is its
# family's.
def engine_section(values: Any, defaults: dict) -> Any:
    return section_over(values, "engine", defaults)


def section_over(values: Any, name: str, defaults: dict) -> Any:
    """A config's mapping with its section `name` given over `defaults` (a partial section keeps the rest)."""
    if not isinstance(values, dict):
        return values
    values = dict(values)
    given = values.get(name)
    given = dict(given) if isinstance(given, dict) else ({} if given is None else given)
    if not isinstance(given, dict):
        return values
    values[name] = {**defaults, **given}
    return values


@with_config(_STRICT)
@dataclass(frozen=True)
class TrainerOptimConfig:
    """The optimizer (AdamW) of the teacher, prune's recovery and exits' branches, the `optim:` section a student
    has too (OptimConfig, which adds what only a student has): each field is a flag of its own name (`--lr 1e-3`);
    what a section leaves out is its trainer's default (TEACHER_OPTIM: these fields' own; PRUNE_OPTIM, EXITS_OPTIM)."""

    lr: Positive = 5e-5  # peak learning rate
    weight_decay: NonNegative = 0.01  # AdamW's (the teacher's: none on biases and LayerNorm weights)
    grad_clip: NonNegative = 1.0  # max gradient norm (0: no clipping)


# Each trainer's optimizer: the teacher fine-tunes as BERT was (5e-5); prune's recovery at a smaller rate; exits'
# branches, small and trained from scratch, at 1e-3 without clipping.
TEACHER_OPTIM = asdict(TrainerOptimConfig())
PRUNE_OPTIM = {"lr": 3e-5, "weight_decay": 0.01, "grad_clip": 1.0}
EXITS_OPTIM = {"lr": 1e-3, "weight_decay": 0.01, "grad_clip": 0.0}


# The teacher fine-tunes as BERT was: linear warm-up over 10 % of the steps, then linear decay; at bf16 where the
# device has bfloat16 arithmetic (on a 2-core AVX512-BF16 CPU 1.46x the rows/s of fp32 at the same selection
# accuracy over 3 seeds: benchmarks/teacher_precision.py, docs/results.md).
TEACHER_ENGINE = {"schedule": "linear", "warmup": 0.1, "precision": "auto"}


# A student's engine (`StudentConfig.engine`): what is not given is its family's (`Family.engine`, declared by the
# family's module: students/families/), settled where the student is set up (students.families.settled).
@with_config(_STRICT)
@dataclass(frozen=True)
class StudentEngineConfig(EngineConfig):
    """A student's `engine:` section: EngineConfig's, with the learning-rate curve its family's unless given."""

    # learning rate per optimizer step of a phase: constant | linear (warm-up, then linear decay to 0) | cosine
    # (warm-up, then cosine decay to 0); None: the family's (BiLSTM and static: linear; transformer: constant)
    schedule: Optional[Literal[LR_SCHEDULES]] = None
    # fraction of a phase's optimizer steps with a linear warm-up from 0; None: the family's (BiLSTM and static:
    # 0.1; transformer: 0)
    warmup: Optional[Probability] = None
