"""Parquet: rows in record batches; a row whose strings are not UTF-8 is a reject, a damaged file one error."""
from __future__ import annotations

import json
from typing import Iterator, Union

import pyarrow as pa
import pyarrow.parquet as pq

from transferset.sources.records import Opener, Reject, SourceError, raw_repr, refuse_duplicate_columns


def rows(path: str, fmt: str, opener: Opener) -> Iterator[tuple[int, Union[dict, Reject]]]:
    """(row number from 1, row dict) or (row, Reject) for each row."""
    with opener(path) as fh:
        pf = _parquet_file(path, fh)
        refuse_duplicate_columns(path, list(pf.schema_arrow.names), "its schema")
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
            text = raw_repr(json.dumps(raw, ensure_ascii=False, default=str))
            out.append(Reject(path, start + i + 1, text, "bytes that are not valid UTF-8"))
    return out
