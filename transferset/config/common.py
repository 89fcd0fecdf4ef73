"""Value types and checks the settings of several sections share (transferset.config imports them back)."""
from __future__ import annotations

from typing import Annotated, Any, Optional

from pydantic import AfterValidator, BeforeValidator, ConfigDict

from transferset.contract import labels as label_rule
from transferset.runtime.errors import ConfigError
from transferset.runtime.typed import Probability

POOLINGS = ("cls", "mean")  # ScoreConfig.hidden
# auto: packed on CPU for the encoder families packed.py serves (measured, benchmarks/README.md), padded elsewhere; the
# packed path is not measured on a GPU yet, where many small attention calls may cost more than padding.
FORWARDS = ("auto", "packed", "padded")  # ScoreConfig.forward
SCORE_PRECISIONS = ("auto", "fp32", "bf16")  # ScoreConfig.precision: the teacher's weights when scoring
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
# A label set by the one label rule (transferset.contract.labels): what one command accepts, every command does.
LabelNames = Annotated[Names, AfterValidator(lambda names: label_rule.check_names(names, where=""))]
Ints = Annotated[tuple[int, ...], BeforeValidator(_split_commas)]
Speeds = Annotated[tuple[Probability, ...], BeforeValidator(_split_commas)]

_STRICT = ConfigDict(extra="forbid")

# Bounds are part of a setting's type (transferset.runtime.typed: AtLeast, Probability, Positive, NonNegative).


def check_forward_options(forward: str, forward_rows: Optional[int], forward_tokens: Optional[int]) -> None:
    """Refuse a --forward choice or forward cap that cannot work (None caps: the path's default)."""
    if any(v is not None and v < 1 for v in (forward_rows, forward_tokens)):
        raise ConfigError("--forward-rows and --forward-tokens must be at least 1")
    if forward not in FORWARDS:
        raise ConfigError(f"--forward {forward!r}: choose one of {list(FORWARDS)}")
