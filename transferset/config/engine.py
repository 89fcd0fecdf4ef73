"""The engine section every trainer runs on (transferset/training): the teacher, each student, prune's recovery
and exits (`engine:` in YAML, `--engine-*` flags)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Optional, Sequence

from pydantic import with_config

from transferset.config.common import _STRICT
from transferset.typed import AtLeast, Probability

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
    # none | tensorboard | mlflow | wandb (its package installed; `pip install transferset[tracking]`: tensorboard
    # and mlflow, whose runs go to OUTPUT/logs/mlruns unless MLFLOW_TRACKING_URI names a server)
    tracker: Literal[TRACKERS] = "none"


# A trainer's engine section: what the YAML / flags give, over the trainer's own defaults (a partial section
# keeps the rest of them); the trainer's flat settings of before the section (`legacy`: device, bf16, report_to,
# warmup) still load into it. Prune's recovery and exits train at a constant rate unless the section says
# otherwise; the students as STUDENT_ENGINE says for their family.
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
# A student's default engine by family, from issue 44's schedule table (benchmarks/README.md, "Learning-rate
# schedule": the demo's scored set, 3 seeds each, SST-2 dev, a split no choice saw):
# - bilstm: the linear warm-up and decay, 1.4 points over the constant rate (81.8 ± 0.9 against 80.3 ± 0.7),
#   more than the seeds' spread;
# - transformer (the presets too): the constant rate, at which the 3-layer tinybert student was no worse
#   (the difference inside the seeds' spread), so the presets keep the rate every figure of theirs was
#   measured with; their papers' schedules: docs/scaling.md.
# The keys compare with the constant rate every student trained at before (app/keys.py, ENGINE_KEY_DEFAULT),
# so a BiLSTM student trained before retrains rather than being reused.
STUDENT_ENGINE: dict[str, dict] = {"bilstm": {"schedule": "linear", "warmup": 0.1}, "transformer": {}}


def flat_form(values: dict, default: dict, legacy: Sequence[str] = (), ignore: Sequence[str] = ()) -> dict:
    """An engine section (`values`, a dict) in the form records made before the section existed hold it (stage
    keys, a checkpoint's fingerprint): the `legacy` settings (device, bf16, report_to, warmup) under their old
    names at any value, and any other field, but `ignore`, only when it differs from the trainer's default
    engine `default` (then under `engine`). An engine at its defaults leaves every such record as it was."""
    old = {"device": ("device", values["device"]), "bf16": ("precision", values["precision"] == "bf16"),
           "report_to": ("tracker", values["tracker"]), "warmup": ("warmup", values["warmup"])}
    # fp16 is not told by the old bf16 flag: it goes under engine
    covered = {old[name][0] for name in legacy} - ({"precision"} if values["precision"] == "fp16" else set())
    changed = {k: v for k, v in values.items() if k not in covered and k not in ignore and v != default[k]}
    return {**{name: old[name][1] for name in legacy}, **({"engine": changed} if changed else {})}
