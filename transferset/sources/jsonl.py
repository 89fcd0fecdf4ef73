"""JSON Lines: one JSON object per line."""
from __future__ import annotations

import json
from typing import Iterator, Union

from transferset.sources.records import Opener, Reject, Row, has_surrogates, raw_repr


def rows(path: str, fmt: str, opener: Opener) -> Iterator[tuple[int, Union[dict, Reject]]]:
    """(line number, object) or (line, Reject) for each line."""
    with opener(path) as fh:
        for line_no, raw_bytes in enumerate(fh, start=1):
            if line_no == 1 and raw_bytes.startswith(b"\xef\xbb\xbf"):
                raw_bytes = raw_bytes[3:]  # a byte order mark is not part of the JSON
            raw = raw_bytes.decode("utf-8", "surrogateescape").rstrip("\r\n")
            if not raw.strip():
                yield line_no, Reject(path, line_no, raw, "blank line")
                continue
            if has_surrogates(raw):
                yield line_no, Reject(path, line_no, raw_repr(raw), "bytes that are not valid UTF-8")
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
            yield line_no, Row(obj, raw)
