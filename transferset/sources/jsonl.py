"""JSON Lines: one JSON object per line."""
from __future__ import annotations

import json
from collections import Counter
from typing import Iterator, Union

from transferset.sources.records import Opener, Reject, Row, has_surrogates, raw_repr


def _loads(raw: str) -> tuple[object, tuple[str, ...]]:
    """(the JSON value, the keys its top-level object holds more than once): json.loads keeps the last value
    of a repeated key, silently."""
    twice: list[tuple[str, ...]] = []

    def pairs_hook(pairs: list) -> dict:
        obj = dict(pairs)
        counts = Counter(k for k, _ in pairs) if len(obj) < len(pairs) else {}
        twice.append(tuple(sorted(k for k, n in counts.items() if n > 1)))  # the top-level object comes last
        return obj

    value = json.loads(raw, object_pairs_hook=pairs_hook)
    return value, (twice[-1] if isinstance(value, dict) else ())


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
                obj, twice = _loads(raw)
            except ValueError as exc:
                yield line_no, Reject(path, line_no, raw, f"invalid JSON: {exc}")
                continue
            except RecursionError:
                yield line_no, Reject(path, line_no, raw, "invalid JSON: nested too deeply")
                continue
            if not isinstance(obj, dict):
                yield line_no, Reject(path, line_no, raw, "a JSON line must be an object")
                continue
            if twice:
                yield line_no, Reject(path, line_no, raw, f"the key{'s' if len(twice) > 1 else ''} "
                                      f"{', '.join(map(repr, twice))} appear{'' if len(twice) > 1 else 's'} "
                                      "more than once in the object: which value is meant is unclear")
                continue
            yield line_no, Row(obj, raw)
