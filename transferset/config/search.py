"""The run's `search:` section: the most accurate student under a budget, among candidates that all train from the
run's one scored set (transferset/app/stages/search.py; transferset.config imports it back)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal, Optional

from pydantic import AfterValidator, with_config

from transferset.config.common import _STRICT, Ints, Speeds
from transferset.config.precedence import over
from transferset.runtime.typed import AtLeast, Positive, Probability

# The smallest budget the timing can tell apart: CPU ms per example at batch 1, tokenization included, is the median
# of rounds of calls, each a few hundredths of a millisecond at the fastest (the static student).
RESOLUTION_MS = 0.02


def _resolvable(budget_ms: float) -> float:
    # the field's own check (not the section's), so that a refusal names the setting, or the flag that set it
    if budget_ms < RESOLUTION_MS:
        raise ValueError(f"below what the timing can tell apart ({RESOLUTION_MS:g} ms per example); give at least "
                         f"{RESOLUTION_MS:g}")
    return budget_ms


# Settings every candidate starts from (a candidate's own settings go over them): the demo's distillation,
# KL on the teacher's logits at T = 2 (configs/demo.yaml's `distilled`).
DEFAULT_BASE: dict[str, Any] = {"phases": "joint", "losses": {"kd": {"weight": 1.0, "temperature": 2.0}},
                                "patience": 2}

# The families that exist, in the shapes worth trying on a CPU: BiLSTM widths and depths, the static student (on
# contextual vectors: +2.3 to +3.4 on SST-2 over the teacher's input rows, docs/results.md) and transformer
# students cut from the teacher (every other layer; 2 and 4 layers).
DEFAULT_SPACE: dict[str, dict[str, Any]] = {
    "bilstm-150": {"student": "bilstm", "model": {"shape": "tang"}},
    "bilstm-300": {"student": "bilstm", "model": {"hidden": 300}},
    "bilstm-2x150": {"student": "bilstm", "model": {"shape": "tang", "layers": 2}},
    "static": {"student": "static", "vocab": {"embed_init": "contextual"}},
    "transformer-2": {"student": "transformer", "optim": {"lr": 1.0e-4}, "model": {"n_layer": 2, "init": "skip"}},
    "transformer-4": {"student": "transformer", "optim": {"lr": 1.0e-4}, "model": {"n_layer": 4, "init": "skip"}},
}


@with_config(_STRICT)
@dataclass(frozen=True)
class SearchConfig:
    """A budget (one or more: a candidate meets each), the candidates, and how they are trained and dropped."""

    # CPU ms per example at batch 1 on one thread, tokenization included: the report's latency
    budget_ms: Optional[Annotated[Positive, AfterValidator(_resolvable)]] = None
    budget_mb: Optional[Positive] = None  # the saved model's size on disk (its model/ folder), in MB
    budget_speedup: Optional[Positive] = None  # at least this many times the teacher's speed at batch 1
    # the candidates: name → a student's settings, as under `students:` (None: DEFAULT_SPACE)
    space: Optional[dict[str, dict[str, Any]]] = None
    # what every candidate shares, under its own settings (None: DEFAULT_BASE)
    base: Optional[dict[str, Any]] = None
    # successive halving on the selection split, the epochs of each rung: every candidate in budget trains rungs[0]
    # epochs, the best `keep` of them rungs[1] epochs (afresh: each rung's model is a normal student), and so on
    rungs: Ints = (1, 4)
    keep: Probability = 0.5  # the fraction of a rung's candidates that go on to the next (at least one)
    # what each candidate is timed on, and so shipped as when chosen: onnx, its ONNX export on ONNX Runtime (the
    # path a student ships on: `transferset export`), or pytorch, the saved student as the report times students
    runtime: Literal["onnx", "pytorch"] = "onnx"
    # also try each candidate as its int8 ONNX export (dynamic quantization, as `transferset export --quantize
    # int8`): timed and sized as that export, trained as its candidate (one training for both), its selection
    # accuracy measured on the export, and shipped as it when chosen
    int8: bool = True
    # also try each transformer candidate (BERT-like, 2 layers or more) with FastBERT's early exits (`transferset
    # exits`: a branch after each layer but the last, trained on the candidate's own outputs), a variant NAME+exits@S
    # per speed S here (the normalised entropy below which a row leaves; empty: none). Exits do not export, so the
    # variant is timed in PyTorch: before training at its lower bound (every row leaving at the first branch), after
    # each rung at S (over budget then, it stops); trained as its candidate, its exits beside it, shipped at S
    exit_speeds: Speeds = (0.5,)
    timing_rows: AtLeast(1) = 64  # selection rows each candidate is timed on
    timing_rounds: AtLeast(1) = 5  # interleaved rounds of the timing (the median is kept)

    def __post_init__(self):
        budgets = {k: v for k, v in (("budget_ms", self.budget_ms), ("budget_mb", self.budget_mb),
                                     ("budget_speedup", self.budget_speedup)) if v is not None}
        if not budgets:
            raise ValueError("search: no budget: set budget_ms, budget_mb or budget_speedup (e.g. run --budget-ms 1)")
        if not self.candidates():
            raise ValueError("search.space is empty: name at least one candidate, or leave space out for the default "
                             f"({', '.join(DEFAULT_SPACE)})")
        if not self.rungs or any(e < 1 for e in self.rungs) or list(self.rungs) != sorted(set(self.rungs)):
            raise ValueError(f"search.rungs={list(self.rungs)}: epochs per rung, at least 1, each rung more than "
                             "the one before")
        if 0 in self.exit_speeds:
            raise ValueError(f"search.exit_speeds={list(self.exit_speeds)}: speed 0 runs every layer (the candidate "
                             "itself); give speeds above 0, or [] for no early-exit variants")
        if not 0 < self.keep < 1:
            raise ValueError(f"search.keep={self.keep}: the fraction kept after each rung, between 0 and 1")

    def candidates(self) -> dict[str, dict[str, Any]]:
        """Each candidate's settings: the base under its own, merged as a student's layers are (precedence.over: a
        section merges key by key, so a candidate's `losses: {mse: 1.0}` adds to the base's kd, and its `model:` to
        a base's)."""
        base = DEFAULT_BASE if self.base is None else self.base
        return {name: over(base, own) for name, own in (DEFAULT_SPACE if self.space is None else self.space).items()}
