"""TSV and CSV: one row per physical line, a header naming the columns."""
from __future__ import annotations

import csv
import io
from typing import Generator, Iterator, Sequence, Union

from transferset.sources.records import Opener, Reject, Row, SourceError, raw_repr, refuse_duplicate_columns

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


def _parse_record(lines: Sequence[str], dialect: dict) -> tuple[list[str], "int | None"]:
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


def _dialect(fmt: str) -> dict:
    # GLUE TSVs contain bare quotes inside sentences: no quoting at all.
    return {"delimiter": "\t", "quoting": csv.QUOTE_NONE} if fmt == "tsv" else {}


def rows(path: str, fmt: str, opener: Opener) -> Iterator[tuple[int, Union[dict, Reject]]]:
    """(line number, row dict) or (line, Reject) for each line of a TSV/CSV after its header."""
    with opener(path) as fh:
        yield from _iter_delimited(path, fmt, fh)


def _iter_delimited(path: str, fmt: str, fh) -> Iterator[tuple[int, Union[dict, Reject]]]:
    """Rows of a TSV/CSV, one per physical line: a record never swallows the lines after it.

    csv.reader alone joins lines while a quote is open, so one stray quote folds the rest of the
    file into a single bad row. Here each line is parsed on its own, and a line whose quoted field
    does not close on it is rejected (see MAX_RECORD_LINES for how far we look to name the span).
    """
    # utf-8-sig: a byte order mark would otherwise stick to the first column name. newline="\n": a
    # line ends at \n (\r\n included), as `wc -l` counts; a stray \r inside a line does not split it.
    text = io.TextIOWrapper(fh, encoding="utf-8-sig", errors="surrogateescape", newline="\n")
    dialect = _dialect(fmt)
    lines = _PeekableLines(iter(text))
    try:
        header_line = next(lines)
    except StopIteration:
        return
    names = _header(path, fmt, header_line, dialect)
    width = len(names)
    line = 1
    for raw_line in lines:
        line += 1
        raw = raw_repr(raw_line.rstrip("\r\n"))
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
            line = yield from _unclosed_quote(path, line, raw_line, lines, dialect, width)
            continue
        if len(values) != width:
            yield line, Reject(path, line, raw, f"expected {width} fields as in the header, found {len(values)}")
            continue
        yield line, Row(zip(names, values), raw)


def _header(path: str, fmt: str, header_line: str, dialect: dict) -> list[str]:
    """The column names of line 1; a header that does not parse stops the file (SourceError)."""
    try:
        names, used = _parse_record([header_line], dialect)
    except csv.Error as exc:
        hint = " (lines that end in a bare \\r, as on classic Mac OS: convert them to \\n)" \
            if "\r" in header_line.rstrip("\r\n") else ""
        raise SourceError(f"{path}, line 1: malformed {fmt.upper()} header: {exc}{hint}") from None
    if used is None:
        raise SourceError(f"{path}, line 1: the header has an unbalanced quote; fix the column names")
    refuse_duplicate_columns(path, names, "line 1: the header")
    return names


def header(path: str, fmt: str, opener: Opener) -> list[str]:
    """The column names of a TSV/CSV (its line 1; [] for an empty file), without reading its rows."""
    with opener(path) as fh:
        text = io.TextIOWrapper(fh, encoding="utf-8-sig", errors="surrogateescape", newline="\n")
        first = text.readline()
        return _header(path, fmt, first, _dialect(fmt)) if first else []


def _unclosed_quote(path: str, line: int, raw_line: str, lines: _PeekableLines, dialect: dict, width: int
                    ) -> Generator[tuple[int, Reject], None, int]:
    """Rejects for a line whose quoted field runs on past its end; returns the last line number used.

    Where would csv.reader have ended this record? A well-formed multi-line record's lines are all
    rejected (each counted); otherwise only this line is, and reading resumes at the next one.
    """
    raw = raw_repr(raw_line.rstrip("\r\n"))
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
            yield line, Reject(path, line, raw_repr(next(lines).rstrip("\r\n")), reason)
    else:
        reason = (f"{_MULTILINE} {line}-{last}: the quote opened on line {line} does not close "
                  f"on that line, so the line is rejected and reading resumes at line {line + 1}; "
                  'close the quote, or double it ("") inside a quoted field')
        yield line, Reject(path, line, raw, reason)
    return line
