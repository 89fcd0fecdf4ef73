"""Readers: input files and Hugging Face datasets → Example records or Reject records.

Every input row becomes exactly one of the two; nothing is dropped silently.

One concern, so one module despite its length (~590 lines): four formats read line by line, each
with the same reject rules (columns, labels, text checks, Unicode), which must stay side by side.
Files are opened through an `opener` callable so that Beam pipelines can pass
`FileSystems.open` (gs://, s3://) while the library itself stays Beam-free.
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import logging
import numbers
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Sequence, Union

import pyarrow as pa
import pyarrow.parquet as pq

from transferset import schema
from transferset.errors import UserError

Opener = Callable[[str], Any]  # path -> binary file object

DEFAULT_TEXT_COLUMNS = ("sentence", "text")
# The readers' defaults, written here once; transferset.config takes them from here (the augment package,
# which config derives its settings from, reads through this module, so it cannot read config).
DEFAULT_LABEL_COLUMN = "label"
DEFAULT_MAX_CHARS = 5000  # longer rows are rejected (augment, predict)
HF_PREFIX = "hf:"
RARE_LABEL_ROWS = 5
SAMPLE_RAW_CHARS = 300  # characters of a raw row shown in summaries (stats.json first_rejects)  # an inferred label with fewer rows than this is probably a typo, not a class

logger = logging.getLogger("transferset")


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


def source_id_for(text: str, text_b: Optional[str]) -> str:
    """Content-derived id: the same sentence gets the same id in any file, order or run."""
    payload = text if text_b is None else text + "\x1f" + text_b
    return hashlib.sha1(payload.encode("utf-8")).hexdigest()[:16]


def normalize_text(text: str) -> str:
    """Key used for deduplication and for the evaluation-leak guard."""
    return " ".join(text.lower().split())


def _has_surrogates(s: str) -> bool:
    # Bytes that are not UTF-8 survive decoding with surrogateescape as lone surrogates.
    return any("\udc80" <= ch <= "\udcff" for ch in s)


# Surrogates that surrogateescape did not make (a JSON "\ud83d" escape, a Parquet string...): no UTF-8 for them.
_OTHER_SURROGATES = re.compile("[\ud800-\udc7f\udd00-\udfff]")


def _raw_repr(s: str) -> str:
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
    if from_bytes and _has_surrogates(value):
        return "bytes that are not valid UTF-8"
    return f"{name} is not valid Unicode (lone surrogate at char {index + 1})"


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


def parse_hf_spec(path: str) -> tuple[str, Optional[str], str]:
    """hf:NAME[:CONFIG]:SPLIT → (name, config, split). NAME may be a local directory."""
    body = path[len(HF_PREFIX):]
    parts = body.rsplit(":", 2)
    if len(parts) == 2:
        return parts[0], None, parts[1]
    if len(parts) == 3 and parts[0]:
        return parts[0], parts[1] or None, parts[2]
    raise SourceError(f"{path}: expected hf:NAME[:CONFIG]:SPLIT, e.g. hf:glue:sst2:validation")


def _local_open(path: str):
    return open(path, "rb")


# A quoted field that runs on over more physical lines than this is taken for an unbalanced quote
# without looking further ahead (the look-ahead is buffered, and real multi-line fields are short).
MAX_RECORD_LINES = 100

_MULTILINE = "unbalanced quote or embedded newline spanning lines"


class _Feed:
    """An iterator over given lines that counts how many lines csv.reader asked for."""

    def __init__(self, lines: Sequence[str]):
        self._lines = list(lines)
        self.pulled = 0

    def __iter__(self):
        return self

    def __next__(self) -> str:
        self.pulled += 1
        if self.pulled <= len(self._lines):
            return self._lines[self.pulled - 1]
        raise StopIteration


def _parse_record(lines: Sequence[str], dialect: dict) -> tuple[list[str], Optional[int]]:
    """(fields, physical lines used) of the record starting at lines[0]; None when it does not end in `lines`."""
    feed = _Feed(lines)
    values = next(csv.reader(feed, **dialect), [])
    return values, (feed.pulled if feed.pulled <= len(lines) else None)


class _PeekableLines:
    def __init__(self, it: Iterator[str]):
        self._it = it
        self._ahead: list[str] = []

    def __iter__(self):
        return self

    def __next__(self) -> str:
        return self._ahead.pop(0) if self._ahead else next(self._it)

    def peek(self, n: int) -> list[str]:
        while len(self._ahead) < n:
            try:
                self._ahead.append(next(self._it))
            except StopIteration:
                break
        return self._ahead[:n]


def _iter_delimited(path: str, fmt: str, fh) -> Iterator[tuple[int, Union[dict, Reject]]]:
    """Rows of a TSV/CSV, one per physical line: a record never swallows the lines after it.

    csv.reader alone joins lines while a quote is open, so one stray quote folds the rest of the
    file into a single bad row. Here each line is parsed on its own, and a line whose quoted field
    does not close on it is rejected (see MAX_RECORD_LINES for how far we look to name the span).
    """
    # utf-8-sig: a byte order mark would otherwise stick to the first column name. newline="\n": a
    # line ends at \n (\r\n included), as `wc -l` counts; a stray \r inside a line does not split it.
    text = io.TextIOWrapper(fh, encoding="utf-8-sig", errors="surrogateescape", newline="\n")
    # GLUE TSVs contain bare quotes inside sentences: no quoting at all.
    dialect = {"delimiter": "\t", "quoting": csv.QUOTE_NONE} if fmt == "tsv" else {}
    lines = _PeekableLines(iter(text))
    try:
        header_line = next(lines)
    except StopIteration:
        return
    try:
        header, used = _parse_record([header_line], dialect)
    except csv.Error as exc:
        hint = " (lines that end in a bare \\r, as on classic Mac OS: convert them to \\n)" \
            if "\r" in header_line.rstrip("\r\n") else ""
        raise SourceError(f"{path}, line 1: malformed {fmt.upper()} header: {exc}{hint}") from None
    if used is None:
        raise SourceError(f"{path}, line 1: the header has an unbalanced quote; fix the column names")
    width = len(header)
    line = 1
    for raw_line in lines:
        line += 1
        raw = _raw_repr(raw_line.rstrip("\r\n"))
        if not raw_line.strip("\r\n"):
            yield line, Reject(path, line, raw, "blank line")
            continue
        try:
            values, used = _parse_record([raw_line], dialect)
        except csv.Error as exc:
            reason = (f"a carriage return (\\r) inside the line: not a {fmt.upper()} row" if "new-line" in str(exc)
                      else f"malformed {fmt.upper()} row: {exc}")
            yield line, Reject(path, line, raw, reason)
            continue
        if used is None:
            # The quoted field runs on. Where would csv.reader have ended this record?
            ahead = lines.peek(MAX_RECORD_LINES)
            try:
                joined, span = _parse_record([raw_line] + ahead, dialect)
            except csv.Error:
                joined, span = [], None
            if span is not None:
                last = str(line + span - 1)
            elif len(ahead) < MAX_RECORD_LINES:
                last = f"{line + len(ahead)} (the end of the file)"
            else:
                last = f"{line + MAX_RECORD_LINES} and beyond"
            if span is not None and len(joined) == width:
                # A well-formed record with a newline inside a quoted field: rare in classification
                # data and not one row per line, so every line of it is rejected, each counted.
                reason = (f"{_MULTILINE} {line}-{last}; a row must fit on one line: remove the newline "
                          "from the quoted field, or fix the quote")
                yield line, Reject(path, line, raw, reason)
                for _ in range(span - 1):
                    line += 1
                    yield line, Reject(path, line, _raw_repr(next(lines).rstrip("\r\n")), reason)
            else:
                reason = (f"{_MULTILINE} {line}-{last}: the quote opened on line {line} does not close "
                          f"on that line, so the line is rejected and reading resumes at line {line + 1}; "
                          'close the quote, or double it ("") inside a quoted field')
                yield line, Reject(path, line, raw, reason)
            continue
        if len(values) != width:
            yield line, Reject(path, line, raw, f"expected {width} fields as in the header, found {len(values)}")
            continue
        yield line, dict(zip(header, values))


def _iter_raw_rows(path: str, fmt: str, opener: Opener) -> Iterator[tuple[int, Union[dict, Reject]]]:
    """Yield (line number, row dict) or (line, Reject) for rows that cannot even be parsed."""
    if fmt in ("tsv", "csv"):
        with opener(path) as fh:
            yield from _iter_delimited(path, fmt, fh)
    elif fmt == "jsonl":
        with opener(path) as fh:
            for line_no, raw_bytes in enumerate(fh, start=1):
                if line_no == 1 and raw_bytes.startswith(b"\xef\xbb\xbf"):
                    raw_bytes = raw_bytes[3:]  # a byte order mark is not part of the JSON
                raw = raw_bytes.decode("utf-8", "surrogateescape").rstrip("\r\n")
                if not raw.strip():
                    yield line_no, Reject(path, line_no, raw, "blank line")
                    continue
                if _has_surrogates(raw):
                    yield line_no, Reject(path, line_no, _raw_repr(raw), "bytes that are not valid UTF-8")
                    continue
                try:
                    obj = json.loads(raw)
                except ValueError as exc:
                    yield line_no, Reject(path, line_no, raw, f"invalid JSON: {exc}")
                    continue
                except RecursionError:
                    yield line_no, Reject(path, line_no, raw, "invalid JSON: nested too deeply")
                    continue
                if not isinstance(obj, dict):
                    yield line_no, Reject(path, line_no, raw, "a JSON line must be an object")
                    continue
                yield line_no, obj
    elif fmt == "parquet":

        with opener(path) as fh:
            pf = _parquet_file(path, fh)
            row = 0
            batches = pf.iter_batches(batch_size=4096)
            while True:
                try:
                    batch = next(batches)
                except StopIteration:
                    break
                except (OSError, ValueError, pa.ArrowException) as exc:  # a damaged page
                    raise SourceError(f"{path}: cannot read as Parquet after row {row}: {exc}; "
                                      "the file is damaged: write it again") from None
                for rec in _batch_rows(path, batch, row):
                    row += 1
                    yield row, rec
    elif fmt == "hf":
        import datasets  # seconds to import; only hf: inputs need it

        name, config, split = parse_hf_spec(path)
        ds = datasets.load_dataset(name, config, split=split)
        for i, rec in enumerate(ds, start=1):
            yield i, rec
    else:  # pragma: no cover - detect_format guards this
        raise SourceError(f"{path}: unsupported format {fmt}")


def _parquet_file(path: str, fh):

    try:
        return pq.ParquetFile(fh)
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise SourceError(f"{path}: not a readable Parquet file ({str(exc)[:200]})") from None


def _batch_rows(path: str, batch, start: int) -> list[Union[dict, Reject]]:
    """The rows of one Parquet batch as dicts; a row whose strings are not UTF-8 becomes a Reject."""
    try:
        return batch.to_pylist()
    except UnicodeDecodeError:
        pass

    out: list[Union[dict, Reject]] = []
    for i in range(batch.num_rows):
        try:
            out.append(batch.slice(i, 1).to_pylist()[0])
        except UnicodeDecodeError:
            raw = {}
            for name, column in zip(batch.schema.names, batch.columns):
                value = column.slice(i, 1)
                if pa.types.is_string(value.type) or pa.types.is_large_string(value.type):
                    as_bytes = value.view(pa.binary() if pa.types.is_string(value.type) else pa.large_binary())
                    b = as_bytes[0].as_py()
                    raw[name] = None if b is None else b.decode("utf-8", "surrogateescape")
                else:
                    try:
                        raw[name] = value[0].as_py()
                    except UnicodeDecodeError:  # strings nested in a list or struct
                        raw[name] = "<not UTF-8>"
            text = _raw_repr(json.dumps(raw, ensure_ascii=False, default=str))
            out.append(Reject(path, start + i + 1, text, "bytes that are not valid UTF-8"))
    return out


def check_readable(path: str, opener: Opener = _local_open) -> None:
    """Refuse an input that cannot be read at all (a broken header, not Parquet) before a pipeline starts.

    Row-level problems are rejects later; this catches what would stop the whole file inside a
    pipeline worker, where the message would drown in a traceback.
    """
    fmt = detect_format(path)
    if fmt in ("tsv", "csv", "parquet"):
        rows = _iter_raw_rows(path, fmt, opener)
        try:
            next(rows, None)
        finally:
            rows.close()


def _resolve_text_column(spec: SourceSpec, row: dict) -> Optional[str]:
    if spec.text_column:
        return spec.text_column
    for name in DEFAULT_TEXT_COLUMNS:
        if name in row:
            return name
    return None


def label_type_problem(value: Any) -> Optional[str]:
    """Why a raw label value cannot be a label at all, or None for a name (str) or an integer."""
    if isinstance(value, bool):  # checked before Integral: True is an int in Python
        kind = "boolean"
    elif value is None or isinstance(value, (str, numbers.Integral)):
        return None
    elif isinstance(value, numbers.Real):
        # Floats are refused even when integral (1.0): a float label column means scores, averaged or
        # NaN-padded labels; accepting 1.0 but not 0.9 would hide that behind a few rejects.
        kind = "float"
    else:
        kind = type(value).__name__  # list, dict, ...
    return f"label {value!r} is a {kind}; labels must be names or integer class indices"


def parse_label(value: Any, label_names: Sequence[str]) -> Optional[int]:
    """Map a raw label (a name, or an integer index into label_names) to its index, else None."""
    if value is None or label_type_problem(value) is not None:
        return None
    names = [str(n) for n in label_names]
    s = str(value).strip()
    if s in names:
        return names.index(s)
    if not _is_int(s):
        return None
    index = int(s)
    if all(_is_int(n) for n in names):
        # Integer names are the labels themselves ("01" is "1"), not indices into the set.
        return next((k for k, n in enumerate(names) if int(n) == index), None)
    return index if 0 <= index < len(names) else None


def _is_int(s: str) -> bool:
    try:
        int(s)
        return True
    except ValueError:
        return False


def row_to_record(spec: SourceSpec, line: int, row: dict) -> Union[Example, Reject]:
    """Apply the accept/reject rules to one parsed row."""
    try:
        raw = _raw_repr(json.dumps(row, ensure_ascii=False, default=str))
    except (ValueError, RecursionError):  # nesting too deep for JSON, circular values
        raw = _raw_repr(repr(row)[:10_000])
    text_col = _resolve_text_column(spec, row)
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
        names = spec.label_names
        problem = label_type_problem(row[spec.label_column])
        if problem is not None:
            return Reject(spec.path, line, raw, problem)
        label = parse_label(row[spec.label_column], names)
        if label is None:
            return Reject(spec.path, line, raw,
                          f"label {row[spec.label_column]!r} outside the label set {list(names)}")
    text = text.strip()
    text_b = text_b.strip() if text_b is not None else None
    return Example(source_id_for(text, text_b), text, text_b, label, spec.path, line)


def read_source(spec: SourceSpec, opener: Opener = _local_open) -> Iterator[Union[Example, Reject]]:
    """Read one input; yield one Example or Reject per row, at most `spec.limit` rows."""
    fmt = detect_format(spec.path)
    count = 0
    for line, row in _iter_raw_rows(spec.path, fmt, opener):
        if spec.limit is not None and count >= spec.limit:
            return
        count += 1
        yield row if isinstance(row, Reject) else row_to_record(spec, line, row)


def infer_label_names(path: str, label_column: str = DEFAULT_LABEL_COLUMN, opener: Opener = _local_open,
                      limit: Optional[int] = None) -> tuple[str, ...]:
    """The label set of a labeled file: its distinct label values, integers sorted numerically.

    Values that cannot be labels (floats, booleans, lists, objects) are left out; they are rejected
    when the rows are read. Logs the set with the rows per label, and warns about rare labels.
    """
    fmt = detect_format(path)
    lines_of: dict[str, list[int]] = {}  # label -> line numbers of its rows
    ignored: list[tuple[int, Any]] = []
    count = 0
    for line, row in _iter_raw_rows(path, fmt, opener):
        if limit is not None and count >= limit:
            break
        count += 1
        if isinstance(row, Reject) or label_column not in row or row[label_column] is None:
            continue
        raw_value = row[label_column]
        if label_type_problem(raw_value) is not None:
            ignored.append((line, raw_value))
            continue
        value = str(raw_value).strip()
        if value and unicode_problem(value) is None:
            lines_of.setdefault(value, []).append(line)
    if ignored:
        shown = ", ".join(f"line {ln}: {v!r}" for ln, v in ignored[:RARE_LABEL_ROWS])
        logger.warning("%s: ignored %d label value(s) that are neither names nor integers (%s); "
                       "those rows will be rejected", path, len(ignored), shown)
    if not lines_of:
        raise SourceError(f"{path}: no label values found in column {label_column!r}; "
                          "pass --label-column, or --labels NAME,NAME,...")
    if all(_is_int(v) and int(v) >= 0 for v in lines_of):
        # Integer labels are class indices: a sample that lacks class 0 still has it.
        by_int = {int(v): ls for v, ls in lines_of.items()}
        names = tuple(str(i) for i in range(max(by_int) + 1))
        lines_of = {n: by_int.get(int(n), []) for n in names}
    else:
        names = tuple(sorted(lines_of))
    logger.info("%s: label set inferred from column %r: %s", path, label_column,
                ", ".join(f"{n!r}: {len(lines_of[n])} row{'' if len(lines_of[n]) == 1 else 's'}" for n in names))
    rare = [n for n in names if len(lines_of[n]) < RARE_LABEL_ROWS]
    if rare:
        parts = []
        for n in rare:
            ls = lines_of[n][:RARE_LABEL_ROWS]
            where = f" ({'line' if len(ls) == 1 else 'lines'} {', '.join(map(str, ls))})" if ls else ""
            parts.append(f"label {n!r} has only {len(lines_of[n])} row{'' if len(lines_of[n]) == 1 else 's'}{where}")
        common = [n for n in names if n not in rare]
        example = f" (e.g. --labels {','.join(common)})" if common else ""
        logger.warning("%s: %s; if %s not a class, pass the real label set with --labels%s, "
                       "and rows with other labels are rejected", path, "; ".join(parts),
                       "that is" if len(rare) == 1 else "these are", example)
    return names


def summarize_rejects(path: str, rejects: Sequence[Reject], *, shown: int = 5) -> str:
    """One message for an input none of whose rows could be used: how many, why, and what to check."""
    if not rejects:
        return f"{path}: no rows"
    n = len(rejects)
    out = [f"{path}: every row was rejected ({n} row{'' if n == 1 else 's'}). First problems:"]
    out += [f"  line {r.line}: {r.reason}" for r in rejects[:shown]]
    if n > shown:
        out.append(f"  ... and {n - shown} more")
    out.append("Check that --text-column, --text-b-column and --label-column name columns of this file "
               "and that --labels lists its label values.")
    return "\n".join(out)


def read_texts(path: str, text_column: Optional[str] = None, opener: Opener = _local_open) -> Iterator[str]:
    """The texts of a file, for the evaluation-leak guard (labels not needed, bad rows skipped)."""
    spec = SourceSpec(path=path, text_column=text_column, label_column=None)
    for rec in read_source(spec, opener):
        if isinstance(rec, Example):
            yield rec.text
