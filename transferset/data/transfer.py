"""Reading a (scored) transfer set back: files, metadata checks, streaming batches.

A transfer set directory holds zstd Parquet shards under `data/`. Shards may be empty
(Beam's fixed sharding can write empty files); readers accept them. Every path may be a
local path or any URL fsspec knows (gs://, memory://...): files are reached through
transferset.fs.
"""
from __future__ import annotations

import random
from typing import Any, Iterator, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from transferset import fs
from transferset.contract import schema
from transferset.runtime.errors import UserError


def data_files(directory: str) -> list[str]:
    """The Parquet shards of a transfer set (a directory holding data/, or data/ itself)."""
    base = fs.join(directory, schema.DATA_DIR)
    if not fs.isdir(base):
        base = directory
    files = fs.glob(base, "*.parquet")
    if not files:
        raise UserError(f"{directory}: no Parquet files under {base}; is this the output of "
                        "`transferset augment` or `transferset score`?")
    return files


def read_metadata(directory: str, *, scored: bool = False) -> dict[str, Any]:
    """Check every shard against the contract; return the (shared) decoded metadata.

    Each shard's metadata is validated (schema.decode_metadata: types, sizes, nesting): a damaged or
    crafted footer is a SchemaError naming the file and the key.
    """
    meta: Optional[dict[str, Any]] = None
    first = None
    for path in data_files(directory):
        m = schema.check_schema(read_schema(path), where=path, scored=scored)
        if meta is None:
            meta, first = m, path
        elif m.get(schema.META_LABEL_NAMES) != meta.get(schema.META_LABEL_NAMES):
            raise UserError(f"{path}: label names {schema.cut(m.get(schema.META_LABEL_NAMES), 300)} differ from "
                            f"{first}'s {schema.cut(meta.get(schema.META_LABEL_NAMES), 300)}; the shards come from "
                            "different runs")
    assert meta is not None
    return meta


def read_schema(path: str) -> pa.Schema:
    with fs.open_input(path) as fh:
        return pq.read_schema(fh)


def shard_rows(path: str) -> int:
    """Rows in one shard, from its Parquet footer (nothing else is read)."""
    with fs.open_input(path) as fh:
        return pq.ParquetFile(fh).metadata.num_rows


def complete_marker(directory: str) -> str:
    """Where the completion marker of a transfer set lies (beside data/, also when given data/ itself)."""
    if not fs.isdir(fs.join(directory, schema.DATA_DIR)) and fs.basename(directory) == schema.DATA_DIR:
        return fs.join(fs.dirname(directory), schema.COMPLETE_MARKER)
    return fs.join(directory, schema.COMPLETE_MARKER)


def require_complete(directory: str, *, allow_incomplete: bool = False, flag: str = "--allow-incomplete") -> bool:
    """Refuse a transfer set whose writer did not finish (no completion marker) unless allowed.

    Returns whether the set is complete, so a caller that allowed an incomplete one can say so.
    """
    marker = complete_marker(directory)
    if fs.exists(marker):
        return True
    if not allow_incomplete:
        raise UserError(f"{directory} is incomplete: no {marker}, so the run that wrote it did not finish "
                        "(killed or failed). Rerun that stage (augment: rerun it with --overwrite; score: "
                        f"rerun it with --resume), or pass {flag} to use the rows it holds anyway")
    return False


def label_names(directory: str, *, scored: bool = False) -> list[str]:
    return list(read_metadata(directory, scored=scored).get(schema.META_LABEL_NAMES) or [])


def iter_batches(directory: str, columns: Optional[Sequence[str]] = None,
                 batch_size: int = 1024, rng: Optional[random.Random] = None, *,
                 num_classes: Optional[int] = None) -> Iterator[pa.RecordBatch]:
    """Stream record batches over all shards: memory stays flat however large the set is.

    With `rng`, shards are visited in an order drawn from it (a shuffle at shard granularity
    that costs no memory; the trainer shuffles rows within a bounded buffer on top). With
    `num_classes`, the values of each batch are checked (`check_values`) before it is yielded.
    """
    files = data_files(directory)
    if rng is not None:
        rng.shuffle(files)
    for path in files:
        with fs.open_input(path) as fh:
            pf = pq.ParquetFile(fh)
            if pf.metadata.num_rows == 0:
                continue
            row = 0
            for batch in pf.iter_batches(batch_size=batch_size, columns=list(columns) if columns else None):
                if num_classes is not None:
                    check_values(batch, num_classes, path=path, first_row=row)
                row += batch.num_rows
                yield batch


# --- values on read: a scored set is trained on, so what it holds is checked, not trusted ---------------

def value_columns(names: Sequence[str]) -> list[str]:
    """The columns of `names` whose values `check_values` checks: labels, logits (an ensemble's members'
    too), hidden states."""
    checked = (schema.LABEL, schema.TEACHER_LABEL, schema.TEACHER_LOGITS, schema.TEACHER_HIDDEN)
    members = set(schema.member_columns(names))  # an ensemble's members: trained on too (and combined)
    return [n for n in names if n in checked or n in members or n.startswith(schema.TEACHER_HIDDEN_LAYER_PREFIX)]


def _first(mask: pa.Array) -> int:
    """Index of the first true value of a boolean array (nulls count as false)."""
    return int(np.flatnonzero(mask.fill_null(False).to_numpy(zero_copy_only=False))[0])


def _value_problem(batch: pa.RecordBatch, num_classes: int) -> Optional[tuple[int, str]]:
    """(row of the batch, what is wrong) for the first row of the first bad column, or None.

    Vectorised: one pass of Arrow compute per column, so checking costs a fraction of reading.
    """
    for name in value_columns(batch.schema.names):
        col = batch.column(name)
        kind = col.type
        if name in (schema.LABEL, schema.TEACHER_LABEL):
            if not pa.types.is_integer(kind):
                return 0, f"column {name} has type {kind}, not an integer class index"
            if name == schema.TEACHER_LABEL and col.null_count:
                return _first(col.is_null()), f"{name} is null"
            bad = pc.or_(pc.less(col, 0), pc.greater_equal(col, num_classes))
            if pc.any(bad).as_py():
                i = _first(bad)
                return i, (f"{name} {col[i].as_py()} is not a class of the set's {num_classes} labels "
                           f"(0..{num_classes - 1})")
            continue
        if not (pa.types.is_fixed_size_list(kind) and pa.types.is_floating(kind.value_type)):
            return 0, f"column {name} has type {kind}, not a fixed-size list of floats"
        if col.null_count:
            return _first(col.is_null()), f"{name} is null"
        values = col.flatten()  # honours the batch's offset; no nulls in the lists themselves either
        finite = pc.is_finite(values)
        if values.null_count or not pc.all(finite).as_py():
            at = _first(pc.invert(finite.fill_null(False)))
            return at // kind.list_size, f"{name} holds {values[at].as_py()} (position {at % kind.list_size})"
    return None


def check_values(batch: pa.RecordBatch, num_classes: int, *, path: str, first_row: int = 0) -> None:
    """Refuse a batch of `path` (rows from `first_row`) holding a label outside 0..num_classes-1 or a
    non-finite teacher value: a NaN logit trains a NaN student, a label 7 of 2 classes breaks training
    or evaluation. The message names the file, the row and its id."""
    found = _value_problem(batch, num_classes)
    if found is None:
        return
    i, what = found
    row = first_row + i
    if schema.ID in batch.schema.names:
        row_id = batch.column(schema.ID)[i].as_py()
    else:  # read again only now, for the message
        with fs.open_input(path) as fh:
            row_id = pq.ParquetFile(fh).read(columns=[schema.ID]).column(0)[row].as_py()
    raise UserError(f"{path}, row {row + 1} (id {schema.cut(row_id)}): {what}; a scored set must hold finite "
                    "teacher values and labels of its label set: rebuild it (`transferset augment`, then "
                    "`transferset score` with a teacher whose outputs are finite) instead of training on it")


def num_rows(directory: str) -> int:
    return sum(shard_rows(p) for p in data_files(directory))


def read_file(path: str, columns: Optional[Sequence[str]] = None) -> pa.Table:
    """One Parquet file, read synchronously on this thread (see fs.open_input)."""
    with fs.open_input(path) as fh:
        return pq.ParquetFile(fh).read(columns=list(columns) if columns else None)


def read_table(directory: str, columns: Optional[Sequence[str]] = None) -> pa.Table:
    tables = [read_file(p, columns) for p in data_files(directory)]
    return pa.concat_tables([t for t in tables if t.num_rows] or tables[:1])


def fixed_list_to_numpy(column, dtype=np.float32) -> np.ndarray:
    """A fixed_size_list column (teacher_logits, teacher_hidden...) as an (N, width) array."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    width = column.type.list_size
    # flatten() honours the array's offset, so slices of a batch convert correctly.
    return column.flatten().to_numpy(zero_copy_only=False).astype(dtype, copy=False).reshape(len(column), width)


def to_dataset(directory: str, columns: Optional[Sequence[str]] = None):
    """The transfer set as a Hugging Face `datasets.Dataset` (memory-mapped Arrow, not loaded in RAM)."""
    import datasets  # seconds to import; only this reader needs it

    # `datasets` fails on the empty shards Beam can write, so they are left out.
    files = [p for p in data_files(directory) if shard_rows(p)]
    if not files:
        raise UserError(f"{directory}: every Parquet shard is empty")
    return datasets.Dataset.from_parquet(files, columns=list(columns) if columns else None)
