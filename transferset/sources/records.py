"""What every reader shares: the Example and Reject records, the input spec, and the rules that turn
one parsed row (a dict of column → value) into exactly one of the two."""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

from transferset.contract import labels, schema
from transferset.runtime.errors import ConfigError, UserError

Opener = Callable[[str], Any]  # path -> binary file object

DEFAULT_TEXT_COLUMNS = ("sentence", "text")
# The readers' defaults, written here once; transferset.config takes them from here (the augment package,
# which config derives its settings from, reads through this module, so it cannot read config).
DEFAULT_LABEL_COLUMN = "label"
DEFAULT_MAX_CHARS = 5000  # longer rows are rejected (augment, predict)
HF_PREFIX = "hf:"
SAMPLE_RAW_CHARS = 300  # characters of a raw row shown in summaries (stats.json first_rejects)


@dataclass(frozen=True)
class Example:
    source_id: str
    text: str
    text_b: Optional[str]
    label: Optional[int]
    file: str
    line: int


@dataclass(frozen=True)
class Reject:
    file: str
    line: int
    raw: str
    reason: str

    def to_dict(self) -> dict:
        return {
            schema.REJECT_FILE: self.file,
            schema.REJECT_LINE: self.line,
            schema.REJECT_RAW: self.raw,
            schema.REJECT_REASON: self.reason,
        }

    def to_sample(self, max_chars: Optional[int] = None) -> dict:
        """The record for a summary (stats.json): the raw row cut to `max_chars` characters, plus its length.

        The rejects files keep the whole row; a summary stays small however long a bad line is.
        """
        limit = SAMPLE_RAW_CHARS if max_chars is None else max_chars
        out = self.to_dict()
        if len(self.raw) > limit:
            out[schema.REJECT_RAW] = self.raw[:limit] + "…"
        out[schema.REJECT_RAW_CHARS] = len(self.raw)
        return out


@dataclass(frozen=True)
class SourceSpec:
    """How to read one input: where it is and which columns hold what."""

    path: str
    text_column: Optional[str] = None  # None: `sentence`, else `text`
    label_column: Optional[str] = DEFAULT_LABEL_COLUMN  # None for unlabeled text
    text_b_column: Optional[str] = None
    max_chars: int = DEFAULT_MAX_CHARS
    limit: Optional[int] = None
    label_names: Optional[tuple[str, ...]] = None  # the label set; required when label_column is set


class SourceError(UserError, ValueError):
    """An input cannot be read at all (unknown format, unreadable file, no usable row)."""


class DuplicateColumnsError(SourceError, ConfigError):
    """A file names a column twice: refused when it is opened, as a usage error (exit 2)."""


def refuse_duplicate_columns(path: str, names: list[str], where: str) -> None:
    """A SourceError naming the columns that appear twice: a row would keep only one of the two values, and
    which one is the text (or the label) must not be a silent choice."""
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise DuplicateColumnsError(f"{path}, {where} names {'the column' if len(twice) == 1 else 'columns'} "
                          f"{', '.join(map(repr, twice))} more than once ({', '.join(names)}); rename or drop "
                          "the copies so that each column name is unique")


def local_open(path: str):
    return open(path, "rb")


def detect_format(path: str) -> str:
    if path.startswith(HF_PREFIX):
        return "hf"
    name = path.lower()
    for suffix, fmt in ((".tsv", "tsv"), (".csv", "csv"), (".jsonl", "jsonl"), (".json", "jsonl"),
                        (".ndjson", "jsonl"), (".parquet", "parquet")):
        if name.endswith(suffix):
            return fmt
    raise SourceError(
        f"{path}: unknown input format; use a .tsv, .csv, .jsonl or .parquet file, "
        "or a Hugging Face dataset as hf:NAME[:CONFIG]:SPLIT"
    )


def source_id_for(text: str, text_b: Optional[str]) -> str:
    """Content-derived id: the same sentence gets the same id in any file, order or run."""
    payload = text if text_b is None else text + "\x1f" + text_b
    return hashlib.sha1(payload.encode("utf-8")).hexdigest()[:16]


def normalize_text(text: str) -> str:
    """Key used for deduplication and for the evaluation-leak guard."""
    return " ".join(text.lower().split())


def has_surrogates(s: str) -> bool:
    # Bytes that are not UTF-8 survive decoding with surrogateescape as lone surrogates.
    return any("\udc80" <= ch <= "\udcff" for ch in s)


# Surrogates that surrogateescape did not make (a JSON "\ud83d" escape, a Parquet string...): no UTF-8 for them.
_OTHER_SURROGATES = re.compile("[\ud800-\udc7f\udd00-\udfff]")


class Row(dict):
    """A parsed row (column → value) of a line-based input (TSV, CSV, JSONL) that keeps that line as it was
    written (made valid UTF-8 by raw_repr), so that a reject's `raw` is the row the user wrote, not a rebuild."""

    __slots__ = ("raw",)

    def __init__(self, values: Any = (), raw: str = ""):
        super().__init__(values)
        self.raw = raw


def raw_repr(s: str) -> str:
    """`s` as valid UTF-8 text for a reject record: undecodable bytes as \\xNN, lone surrogates as \\uNNNN."""
    s = _OTHER_SURROGATES.sub(lambda m: f"\\u{ord(m.group()):04x}", s)
    return s.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def unicode_problem(s: str) -> Optional[int]:
    """The index of the first character of `s` that UTF-8 cannot encode (a lone surrogate), or None."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def _text_problem(name: str, value: str, from_bytes: bool) -> Optional[str]:
    """Why `value` cannot be stored as text (Parquet strings are UTF-8), or None."""
    index = unicode_problem(value)
    if index is None:
        return None
    if from_bytes and has_surrogates(value):
        return "bytes that are not valid UTF-8"
    return f"{name} is not valid Unicode (lone surrogate at char {index + 1})"


def text_column_of(text_column: Optional[str], row: dict) -> Optional[str]:
    """The text column of `row`: the one given, else the first of DEFAULT_TEXT_COLUMNS it holds (None: neither)."""
    if text_column:
        return text_column
    for name in DEFAULT_TEXT_COLUMNS:
        if name in row:
            return name
    return None


def row_to_record(spec: SourceSpec, line: int, row: dict) -> Union[Example, Reject]:
    """Apply the accept/reject rules to one parsed row."""
    if isinstance(row, Row):  # the line as written
        raw = row.raw
    else:  # a Parquet or hf: row has no line of text: its values as JSON
        try:
            raw = raw_repr(json.dumps(row, ensure_ascii=False, default=str))
        except (ValueError, RecursionError):  # nesting too deep for JSON, circular values
            raw = raw_repr(repr(row)[:10_000])
    text_col = text_column_of(spec.text_column, row)
    if text_col is None or text_col not in row:
        wanted = text_col or " or ".join(DEFAULT_TEXT_COLUMNS)
        return Reject(spec.path, line, raw, f"missing text column {wanted!r} (use --text-column)")
    text = row[text_col]
    if text is not None and not isinstance(text, str):
        # JSONL numbers, objects and lists are not sentences: stringifying them would train on "12345".
        return Reject(spec.path, line, raw, f"text must be a string, found {type(text).__name__}")
    text_b = None
    if spec.text_b_column:
        if spec.text_b_column not in row:
            return Reject(spec.path, line, raw, f"missing text_b column {spec.text_b_column!r}")
        text_b = row[spec.text_b_column]
        if text_b is not None and not isinstance(text_b, str):
            return Reject(spec.path, line, raw, f"text_b must be a string, found {type(text_b).__name__}")
    text = "" if text is None else text
    # Text becomes Parquet strings (UTF-8) and ids (hashes of its UTF-8): a lone surrogate cannot go on.
    from_bytes = detect_format(spec.path) in ("tsv", "csv")
    for name, value in (("text", text), ("text_b", text_b or "")):
        problem = _text_problem(name, value, from_bytes)
        if problem is not None:
            return Reject(spec.path, line, raw, problem)
    if not text.strip() or (spec.text_b_column and not (text_b or "").strip()):
        return Reject(spec.path, line, raw, "empty text")
    length = len(text) + len(text_b or "")
    if length > spec.max_chars:
        return Reject(spec.path, line, raw, f"text longer than --max-chars ({length} > {spec.max_chars})")
    label = None
    if spec.label_column is not None:
        if spec.label_column not in row:
            return Reject(spec.path, line, raw, f"missing label column {spec.label_column!r} (use --label-column)")
        if spec.label_names is None:
            raise SourceError(f"{spec.path}: SourceSpec.label_names is needed to read labels "
                              "(pass --labels, or label_column=None for unlabeled text)")
        label, why = labels.resolve(row[spec.label_column], spec.label_names)
        if why is not None:
            return Reject(spec.path, line, raw, why)
    text = text.strip()
    text_b = text_b.strip() if text_b is not None else None
    return Example(source_id_for(text, text_b), text, text_b, label, spec.path, line)

