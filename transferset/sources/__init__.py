"""Readers: input files and Hugging Face datasets → Example records or Reject records.

Every input row becomes exactly one of the two; nothing is dropped silently. One module per format
(`delimited` for TSV/CSV, `jsonl`, `parquet`, `hf`) turns the input into (line, row dict) pairs or
rejects for what cannot even be parsed; `records` holds the records and the rules every row then goes
through (columns, text checks, Unicode), and `transferset.contract.labels` the label rule. Files are opened
through an `opener` callable so that Beam pipelines can pass `FileSystems.open` (gs://, s3://) while
the library itself stays Beam-free.
"""
from __future__ import annotations

import logging
from typing import Callable, Iterator, Optional, Sequence, Union

from transferset.contract import labels
from transferset.sources import delimited, hf, jsonl, parquet
from transferset.sources.hf import parse_hf_spec
from transferset.sources.records import (DEFAULT_LABEL_COLUMN, DEFAULT_MAX_CHARS, DEFAULT_TEXT_COLUMNS, HF_PREFIX,
                                         SAMPLE_RAW_CHARS, Example, Opener, Reject, SourceError, SourceSpec,
                                         detect_format, local_open, normalize_text, row_to_record, source_id_for,
                                         unicode_problem)

__all__ = [
    "DEFAULT_LABEL_COLUMN", "DEFAULT_MAX_CHARS", "DEFAULT_TEXT_COLUMNS", "HF_PREFIX", "RARE_LABEL_ROWS",
    "SAMPLE_RAW_CHARS", "Example", "Opener", "Reject", "SourceError", "SourceSpec", "check_hf_names", "check_readable",
    "detect_format", "infer_label_names", "label_type_problem", "normalize_text", "parse_hf_spec", "parse_label",
    "read_source", "read_texts", "row_to_record", "source_id_for", "summarize_rejects", "unicode_problem",
]

RARE_LABEL_ROWS = 5  # an inferred label with fewer rows than this is probably a typo, not a class

logger = logging.getLogger("transferset")

# format → rows(path, fmt, opener): (line, row dict) or (line, Reject) per input row
_READERS: dict[str, Callable[[str, str, Opener], Iterator[tuple[int, Union[dict, Reject]]]]] = {
    "tsv": delimited.rows, "csv": delimited.rows, "jsonl": jsonl.rows, "parquet": parquet.rows, "hf": hf.rows,
}

# The label rule (transferset.contract.labels), under the names this module has always exported.
label_type_problem = labels.problem
parse_label = labels.parse


def _iter_raw_rows(path: str, fmt: str, opener: Opener) -> Iterator[tuple[int, Union[dict, Reject]]]:
    return _READERS[fmt](path, fmt, opener)


def check_hf_names(settings: Sequence[tuple[str, Optional[str]]]) -> None:
    """Each (setting, path) whose path is an hf: spec checked by hf.check_name (a missing folder, a hub dataset
    out of reach): one ConfigError naming the setting, before any output is written."""
    for what, path in settings:
        if isinstance(path, str) and path.startswith(HF_PREFIX):
            hf.check_name(path, what)


def check_readable(path: str, opener: Opener = local_open) -> None:
    """Refuse an input that cannot be read at all (a broken header, not Parquet, an hf: split that does
    not load) before a pipeline starts.

    Row-level problems are rejects later; this catches what would stop the whole file inside a
    pipeline worker, where the message would drown in a traceback.
    """
    fmt = detect_format(path)
    if fmt == "hf":
        hf.load(path)  # cached by `datasets`: the reader's own load is then quick
        return
    if fmt == "jsonl":
        return  # every line stands alone: nothing can stop the whole file
    rows = _iter_raw_rows(path, fmt, opener)
    try:
        next(rows, None)
    finally:
        rows.close()


def read_source(spec: SourceSpec, opener: Opener = local_open) -> Iterator[Union[Example, Reject]]:
    """Read one input; yield one Example or Reject per row, at most `spec.limit` rows."""
    fmt = detect_format(spec.path)
    count = 0
    for line, row in _iter_raw_rows(spec.path, fmt, opener):
        if spec.limit is not None and count >= spec.limit:
            return
        count += 1
        yield row if isinstance(row, Reject) else row_to_record(spec, line, row)


def infer_label_names(path: str, label_column: str = DEFAULT_LABEL_COLUMN, opener: Opener = local_open,
                      limit: Optional[int] = None) -> tuple[str, ...]:
    """The label set of a labeled file: its distinct labels (transferset.contract.labels), integers sorted numerically.

    Values that are not labels (floats, `1.0`, `-1`, booleans, lists, indices of MAX_CLASSES and up)
    are left out and logged; they are rejected when the rows are read. Integer labels are class indices:
    the set is 0..max (a sample that lacks class 0 still has it), max below MAX_CLASSES. More distinct
    labels than MAX_CLASSES is a SourceError. Logs the set with the rows per label, and warns about
    rare labels.
    """
    rows_of, lines_of, count = _count_labels(path, label_column, opener, limit)
    if not count:
        raise SourceError(f"{path} has no data rows (a header at most): give a file with labeled rows")
    if not rows_of:
        raise SourceError(f"{path}: no label values found in column {label_column!r}; "
                          "pass --label-column, or --labels NAME,NAME,...")
    indices = [labels.index_of(v) for v in rows_of]
    if all(i is not None for i in indices):
        # Integer labels are class indices: a sample that lacks class 0 still has it.
        names = tuple(str(i) for i in range(max(indices) + 1))
    else:
        names = tuple(sorted(rows_of))
    counts = {n: rows_of.get(n, 0) for n in names}
    logger.info("%s: label set inferred from column %r: %s", path, label_column,
                ", ".join(f"{n!r}: {counts[n]} row{'' if counts[n] == 1 else 's'}" for n in names))
    _warn_rare_labels(path, names, counts, lines_of)
    return names


def label_counts(path: str, label_column: str = DEFAULT_LABEL_COLUMN, opener: Opener = local_open,
                 limit: Optional[int] = None) -> dict[str, int]:
    """Rows per label (transferset.contract.labels.key) of a labeled file's first `limit` rows: the classes it holds;
    values that are not labels are left out and logged."""
    return _count_labels(path, label_column, opener, limit)[0]


def _count_labels(path: str, label_column: str, opener: Opener, limit: Optional[int]
                  ) -> tuple[dict[str, int], dict[str, list[int]], int]:
    """(rows per label, the first line numbers of each label, rows read) over the first `limit` rows; values
    that are not labels are left out and logged."""
    rows_of: dict[str, int] = {}  # label -> rows
    lines_of: dict[str, list[int]] = {}  # label -> its first line numbers, for the warning about rare labels
    ignored: list[tuple[int, str]] = []
    n_ignored = 0
    count = 0
    for line, row in _iter_raw_rows(path, detect_format(path), opener):
        if limit is not None and count >= limit:
            break
        count += 1
        if isinstance(row, Reject) or label_column not in row or row[label_column] is None:
            continue
        raw_value = row[label_column]
        why = labels.problem(raw_value)
        if why is not None:
            n_ignored += 1
            if len(ignored) < RARE_LABEL_ROWS:
                ignored.append((line, why))
            continue
        value = labels.key(raw_value)
        if value not in rows_of and len(rows_of) >= labels.MAX_CLASSES:
            raise SourceError(f"{path}, line {line}: more than {labels.MAX_CLASSES} distinct values in label "
                              f"column {label_column!r} (a classification label set holds at most "
                              f"{labels.MAX_CLASSES}); check --label-column, or pass --labels NAME,NAME,...")
        rows_of[value] = rows_of.get(value, 0) + 1
        if len(lines_of.setdefault(value, [])) < RARE_LABEL_ROWS:
            lines_of[value].append(line)
    if ignored:
        shown = "; ".join(f"line {ln}: {why}" for ln, why in ignored)
        logger.warning("%s: ignored %d label value(s) that are neither names nor class indices (%s); "
                       "those rows will be rejected", path, n_ignored, shown)
    return rows_of, lines_of, count


def _warn_rare_labels(path: str, names: Sequence[str], counts: dict[str, int], lines_of: dict[str, list[int]]) -> None:
    """A label with fewer than RARE_LABEL_ROWS rows is probably a typo: say where it is and how to pass the set."""
    rare = [n for n in names if counts[n] < RARE_LABEL_ROWS]
    if not rare:
        return
    parts = []
    for n in rare:
        ls = lines_of.get(n, [])
        where = f" ({'line' if len(ls) == 1 else 'lines'} {', '.join(map(str, ls))})" if ls else ""
        parts.append(f"label {n!r} has only {counts[n]} row{'' if counts[n] == 1 else 's'}{where}")
    common = [n for n in names if n not in rare]
    example = f" (e.g. --labels {','.join(common)})" if common else ""
    logger.warning("%s: %s; if %s not a class, pass the real label set with --labels%s, "
                   "and rows with other labels are rejected", path, "; ".join(parts),
                   "that is" if len(rare) == 1 else "these are", example)


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


def read_texts(path: str, text_column: Optional[str] = None, opener: Opener = local_open) -> Iterator[str]:
    """The texts of a file, for the evaluation-leak guard (labels not needed, bad rows skipped)."""
    spec = SourceSpec(path=path, text_column=text_column, label_column=None)
    for rec in read_source(spec, opener):
        if isinstance(rec, Example):
            yield rec.text
