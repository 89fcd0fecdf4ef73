"""The label rule, in one place for every reader and command.

A label is a **name** (a string that is not a number, at most MAX_NAME_CHARS characters) or a
**class index**: a non-negative integer below MAX_CLASSES, written as ASCII digits or stored as an
integer. Anything else (floats, `1.0`, `-1`, `1e3`, `nan`, booleans, lists, an index of 20,000,000) is
a reject with its reason, never a class: a float-like or negative value that became a class would
shift every index after it (SST-2's `1` became class 2 next to a `1.0`), and an inferred set of
integers is `0..max`, which a huge max would turn into millions of classes.

Label sets obey the same rule (`check_names`), so a set one command accepts every other accepts too:
the teacher, augment (whose metadata records at most schema.MAX_LABELS names), splits, evaluate.
"""
from __future__ import annotations

import functools
import numbers
import re
from collections import Counter
from typing import Any, Optional, Sequence

from transferset.contract import schema
from transferset.runtime.errors import ConfigError

MAX_CLASSES = schema.MAX_LABELS  # labels in a set, so class indices are 0..MAX_CLASSES-1
MAX_NAME_CHARS = schema.MAX_LABEL_CHARS  # characters of one label name
_INDEX = re.compile(r"[0-9]+\Z")  # ASCII digits only: int() would also take "١" or "1_0"
_HINT = "labels must be names or integer class indices"


def _index(s: str) -> Optional[int]:
    """The class index written in `s` (already stripped), or None when `s` is not ASCII digits.

    Leading zeros are dropped before int(): a 5,000-digit string would make int() raise.
    """
    if not _INDEX.match(s):
        return None
    digits = s.lstrip("0") or "0"
    return int(digits) if len(digits) <= len(str(MAX_CLASSES)) else MAX_CLASSES


def index_of(value: str) -> Optional[int]:
    """The class index a label written as digits stands for (capped at MAX_CLASSES), else None."""
    return _index(value.strip())


def _is_number(s: str) -> bool:
    try:
        float(s)  # "-1", "1.0", "1e3", "nan", "inf", "+2", "1_0"
        return True
    except ValueError:
        return False


def problem(value: Any) -> Optional[str]:
    """Why a raw label value cannot be a label, or None for a valid name or class index."""
    shown = schema.cut(value)
    if value is None:
        return "the label is missing (null)"
    if isinstance(value, bool):  # checked before Integral: True is an int in Python
        return f"label {shown} is a boolean; {_HINT}"
    if isinstance(value, numbers.Integral):
        if value < 0:
            return f"label {shown} is a negative integer; {_HINT} (0 and up)"
        if value >= MAX_CLASSES:
            return f"label {shown} is not a class index: at most {MAX_CLASSES} classes (0..{MAX_CLASSES - 1})"
        return None
    if isinstance(value, numbers.Real):
        # Floats are refused even when integral (1.0): a float label column means scores, averaged or
        # NaN-padded labels; accepting 1.0 but not 0.9 would hide that behind a few rejects.
        return f"label {shown} is a float; {_HINT}"
    if not isinstance(value, str):
        return f"label {shown} is a {type(value).__name__}; {_HINT}"
    s = value.strip()
    if not s:
        return "the label is empty"
    index = _index(s)
    if index is not None:
        if index >= MAX_CLASSES:
            return f"label {shown} is not a class index: at most {MAX_CLASSES} classes (0..{MAX_CLASSES - 1})"
        return None
    if _is_number(s):
        kind = "negative number" if s.startswith("-") and s[1:2].isdigit() else "number that is not a class index"
        return f"label {shown} is a {kind}; {_HINT} (0..{MAX_CLASSES - 1})"
    if len(s) > MAX_NAME_CHARS:
        return f"label name of {len(s):,} characters, longer than {MAX_NAME_CHARS}"
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return f"label {shown} is not valid Unicode"
    return None


def key(value: Any) -> str:
    """The class a valid label value stands for: `1`, "1", " 01 " are all "1"."""
    s = str(value).strip()
    index = _index(s)
    return s if index is None else str(index)


@functools.lru_cache(maxsize=64)
def _lookup(names: tuple[Any, ...]) -> dict[str, int]:
    """key → class index for one label set: names map to their position; a set of integers maps each
    integer to its position ("0","1","5": 5 → 2), any other set also takes indices (1 → "pos")."""
    names = tuple(str(n) for n in names)
    table: dict[str, int] = {}
    for k, n in enumerate(names):
        table.setdefault(n.strip(), k)
    if names and all(_index(n.strip()) is not None for n in names):
        # Integer names are the labels themselves ("01" is "1"), not indices into the set.
        return {key(n): k for k, n in reversed(list(enumerate(names)))} | table
    for k in range(len(names)):
        table.setdefault(str(k), k)
    return table


def resolve(value: Any, names: Sequence[str]) -> tuple[Optional[int], Optional[str]]:
    """(class index, None) for a label of the set `names`, else (None, why it is rejected)."""
    why = problem(value)
    if why is not None:
        return None, why
    # Cached per label set: a row costs one dict lookup (and hashing the tuple), not one pass over the names.
    index = _lookup(names if isinstance(names, tuple) else tuple(names)).get(key(value))
    if index is None:
        return None, f"label {schema.cut(value)} outside the label set {schema.cut(list(names), 300)}"
    return index, None


def parse(value: Any, names: Sequence[str]) -> Optional[int]:
    """The class index of `value` in `names`, or None when it is not a label of that set."""
    return resolve(value, names)[0]


def check_names(names: Sequence[Any], *, where: str = "--labels") -> tuple[str, ...]:
    """`names` as a label set, or a ConfigError saying which name breaks the rule.

    A set holds 1..MAX_CLASSES distinct names, each a valid label (so `1.0` or `-1` cannot be named:
    a row holding them is a reject, whatever the set).
    """
    out = tuple(str(n).strip() for n in names)
    where = f"{where}: " if where else ""
    if not out:
        raise ConfigError(f"{where}an empty label set; name the classes, e.g. --labels neg,pos")
    if len(out) > MAX_CLASSES:
        raise ConfigError(f"{where}{len(out):,} labels, more than the {MAX_CLASSES} a transfer set may hold "
                          "(transferset.contract.schema.MAX_LABELS); is this a classification label column?")
    for n in out:
        why = problem(n)
        if why is not None:
            raise ConfigError(f"{where}{why}")
    seen = Counter(key(n) for n in out)
    repeated = sorted(n for n in out if seen[key(n)] > 1)
    if repeated:
        raise ConfigError(f"{where}label {repeated[0]!r} is named twice ({schema.cut(list(out), 300)})")
    return out
