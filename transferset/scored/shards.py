"""The scored output's shard protocol, row routing and stats checks (no Beam: pipelines/score.py wraps them).

Scored rows are committed in shards as they are produced: each shard is written under a
temporary name, then renamed, so a killed run leaves only whole shards behind and a resumed
run scores only the ids not in them. A shard is committed every `shard_rows` rows or once
its oldest row has waited `shard_seconds`, whichever comes first, so a kill loses at most
that much work.
"""
from __future__ import annotations

import hashlib
import json
import logging
import time
import uuid
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from transferset import fs
from transferset.contract import ids, schema
from transferset.sources import Reject

LOG = logging.getLogger("transferset.score")

SHARD_PREFIX = "part"  # committed shards: part-<run>-<hash of ids>.parquet
TMP_PREFIX = fs.TMP_PREFIX  # shards being written (fs.open_atomic); deleted by the clean-up and by --resume
PARQUET_SUFFIX = ".parquet"


# --- reading the input and the shards already written ---------------------------------------------
# Input rows per read unit, the work the runner spreads over its workers: about 1/UNITS of the
# input (so a small input still feeds every local worker), between MIN_UNIT_ROWS and UNIT_ROWS.
UNIT_ROWS, MIN_UNIT_ROWS, UNITS = 50_000, 1_000, 16


def input_units(files: Sequence[str], file_rows: Sequence[int], unit_rows: Optional[int] = None
                ) -> list[tuple[int, str, int, int]]:
    """(file index, path, first row, end row) ranges of at most `unit_rows` rows covering every file."""
    unit_rows = unit_rows or min(UNIT_ROWS, max(MIN_UNIT_ROWS, -(-sum(file_rows) // UNITS)))
    return [(i, path, start, min(start + unit_rows, n))
            for i, (path, n) in enumerate(zip(files, file_rows)) for start in range(0, n, unit_rows)]


def _row_range(path: str, start: int, stop: Optional[int], columns: Sequence[str]) -> Iterator[tuple[int, dict]]:
    """(1-based row number, row) for rows start..stop-1 of one shard, reading only the row groups they are in."""
    with fs.open_input(path) as fh:
        pf = pq.ParquetFile(fh)
        offset = 0
        for g in range(pf.num_row_groups):
            size = pf.metadata.row_group(g).num_rows
            lo, hi = max(start - offset, 0), size if stop is None else min(stop - offset, size)
            if lo < hi:
                table = pf.read_row_group(g, columns=list(columns)).slice(lo, hi - lo)
                n = offset + lo
                for batch in table.to_batches(max_chunksize=4096):
                    for row in batch.to_pylist():
                        n += 1
                        yield n, row
            offset += size
            if stop is not None and offset >= stop:
                break


def read_input_rows(path: str, start: int = 0, stop: Optional[int] = None, file_index: int = 0
                    ) -> Iterator[tuple[str, tuple[dict, str, int, tuple[int, int]]]]:
    """(id, (row, file, row number, position)) for rows start..stop-1 of one input shard.

    position = (file_index, row number): with the files sorted, it orders rows as (path, row) does.
    """
    for n, row in _row_range(path, start, stop, schema.TRANSFER_COLUMNS):
        yield row[schema.ID], (row, path, n, (file_index, n))


def read_input_ids(path: str, start: int = 0, stop: Optional[int] = None, file_index: int = 0
                   ) -> Iterator[tuple[str, tuple[int, int]]]:
    """(id, position) of the scorable rows (row_problem is None) of rows start..stop-1 of one input shard."""
    for n, row in _row_range(path, start, stop, (schema.ID, schema.TEXT, schema.TEXT_B)):
        key = row[schema.ID]
        if row_problem(key, row) is None:
            yield key, (file_index, n)


# --- which ids need a look-up -----------------------------------------------------------------------
# Finding the ids repeated in the input (or already in the output) is done in two passes so that no
# runner holds one entry per row: first every scorable id's 64-bit hash (8 bytes a row, in numpy arrays
# combined into one sorted array of the hashes seen twice or already in the output: `suspect_hashes`,
# transferset.contract.ids), then an exact count of only the ids with such a hash.
def read_input_hashes(path: str, start: int = 0, stop: Optional[int] = None, file_index: int = 0) -> np.ndarray:
    """The id hashes of the scorable rows of rows start..stop-1 of one input shard (uint64, 8 bytes a row)."""
    return ids.id_hashes(key for key, _ in read_input_ids(path, start, stop, file_index))


def read_existing_hashes(path: str) -> np.ndarray:
    """The id hashes of one shard already in the output (--resume)."""
    return ids.id_hashes(read_ids(path))


def suspect_hashes(input_hashes: Sequence[np.ndarray], existing_hashes: Sequence[np.ndarray] = ()) -> np.ndarray:
    """Sorted unique hashes that two scorable input rows share, or that an id already in the output has:
    every id that needs a look-up (needs_lookup) has one of them."""
    return ids.repeated_hashes(input_hashes, existing_hashes)


def has_hash(sorted_hashes: np.ndarray, key: str) -> bool:
    return bool(ids.in_sorted(sorted_hashes, np.array([ids.id_hash(key)], dtype=np.uint64))[0])


def read_suspect_ids(path: str, start: int, stop: Optional[int], file_index: int, suspects: np.ndarray
                     ) -> Iterator[tuple[str, tuple[int, int]]]:
    """read_input_ids, only for the ids whose hash is in `suspects` (nothing is read when it is empty)."""
    if not len(suspects):
        return
    for key, position in read_input_ids(path, start, stop, file_index):
        if has_hash(suspects, key):
            yield key, position


def read_ids(path: str) -> Iterator[str]:
    with fs.open_input(path) as fh:
        pf = pq.ParquetFile(fh)
        for batch in pf.iter_batches(batch_size=65536, columns=[schema.ID]):
            yield from batch.column(0).to_pylist()


def committed_shards(data_dir: str) -> list[str]:
    """The whole shards under data_dir (temporary files of an interrupted write left out)."""
    return [p for p in fs.listdir(data_dir)
            if p.endswith(PARQUET_SUFFIX) and not fs.basename(p).startswith(TMP_PREFIX)]


def leftover_tmp_files(data_dir: str) -> list[str]:
    return [p for p in fs.listdir(data_dir) if fs.basename(p).startswith(TMP_PREFIX)]


# --- routing --------------------------------------------------------------------------------------
SCORE, REJECT, DONE, STALE, DUPLICATED = "score", "reject", "done", "stale", "duplicated"
ROUTES = (SCORE, REJECT, DONE, STALE, DUPLICATED)


def reject_record(row: dict, path: str, n: int, reason: str) -> dict:
    raw = json.dumps({k: row.get(k) for k in schema.TRANSFER_COLUMNS}, ensure_ascii=False)
    return Reject(path, n, raw, reason).to_dict()


def row_problem(key: Optional[str], row: dict) -> Optional[str]:
    """Why a row cannot be scored, whatever other rows hold ("missing id", "empty text"), or None."""
    if key is None or not str(key).strip():
        return "missing id"
    text_b = row.get(schema.TEXT_B)
    if not (row.get(schema.TEXT) or "").strip() or (text_b is not None and not text_b.strip()):
        return "empty text"
    return None


# Per id, over the input's scorable rows and the output's shards (--resume):
# (scorable input rows, position of the first of them or None, times the id is in the output).
IdCount = tuple[int, Optional[tuple[int, int]], int]
NO_ROWS: IdCount = (0, None, 0)


def count_id(acc: IdCount, position: Optional[tuple[int, int]]) -> IdCount:
    """Add one input row at `position`, or (None) one time the id is in the output already."""
    rows, first, existing = acc
    if position is None:
        return rows, first, existing + 1
    return rows + 1, position if first is None else min(first, position), existing


def merge_counts(counts: Iterable[IdCount]) -> IdCount:
    rows, firsts, existing = 0, [], 0
    for r, f, e in counts:
        rows, existing = rows + r, existing + e
        if f is not None:
            firsts.append(f)
    return rows, min(firsts) if firsts else None, existing


def needs_lookup(count: IdCount) -> bool:
    """Whether the rows of this id need their count to be routed: a repeated id or one already scored.

    Only these ids travel to the routing step (a side input), so a clean fresh run carries none.
    """
    rows, _, existing = count
    return rows > 1 or existing > 0


def id_routes(key: str, count: IdCount) -> list[tuple[str, Any]]:
    """Routes decided per id: DUPLICATED (in more than one shard of the output), STALE (in the output
    but not scorable from the input)."""
    rows, _, existing = count
    out: list[tuple[str, Any]] = []
    if existing > 1:
        out.append((DUPLICATED, key))
    if rows == 0 and existing:
        out.append((STALE, key))
    return out


def route_row(key: Optional[str], row: dict, path: str, n: int, position: tuple[int, int],
              count: Optional[IdCount], files: Sequence[str]) -> tuple[str, Any]:
    """The route of one input row: SCORE (key, row), REJECT (a reject record), or DONE (key).

    `count` is the id's IdCount when needs_lookup, else None; `files` the input's sorted paths.
    The first scorable row by (file, row number) wins, so the result does not depend on arrival order.
    """
    problem = row_problem(key, row)
    if problem is not None:
        return REJECT, reject_record(row, path, n, problem)
    if count is not None:
        _, first, existing = count
        if position != first:
            kept_file, kept_row = first
            return REJECT, reject_record(row, path, n, f"duplicate id {key} (kept {files[kept_file]} row {kept_row})")
        if existing:
            return DONE, key
    return SCORE, (key, row)


def route(key: Optional[str], input_rows: Iterable[tuple[dict, str, int]],
          existing_ids: Iterable[Any]) -> list[tuple[str, Any]]:
    """Every route of one id at once: the composition the pipeline runs in two steps (count the ids,
    then route each row), for callers and tests that hold all of an id's rows.

    `input_rows` are the (row, file, row number) of the input with this id, `existing_ids`
    one entry per time the id is already in the output (--resume). Routes:
      SCORE (the row to score), REJECT (a reject record: missing id, empty text, duplicate id),
      DONE (id already scored), STALE (id in the output but not scorable from the input),
      DUPLICATED (id in more than one shard of the output).
    """
    input_rows = list(input_rows)
    files = sorted({path for _, path, _ in input_rows})
    positioned = [(row, path, n, (files.index(path), n)) for row, path, n in input_rows]
    count = NO_ROWS
    for row, _, _, position in positioned:
        if row_problem(key, row) is None:
            count = count_id(count, position)
    for _ in existing_ids:
        count = count_id(count, None)
    per_id = id_routes(key, count)
    lookup = count if needs_lookup(count) else None
    routed = [route_row(key, row, path, n, position, lookup, files)
              for row, path, n, position in sorted(positioned, key=lambda r: r[3])]
    return ([r for r in per_id if r[0] == DUPLICATED] + sorted(routed, key=lambda r: r[0] != REJECT)
            + [r for r in per_id if r[0] == STALE])


# --- writing --------------------------------------------------------------------------------------
def rows_to_table(rows: Sequence[dict], out_schema: pa.Schema) -> pa.Table:
    """Scored row dicts -> an Arrow table of `out_schema` (vector columns built from stacked numpy)."""
    arrays = []
    for f in out_schema:
        values = [r[f.name] for r in rows]
        if pa.types.is_fixed_size_list(f.type):
            size = f.type.list_size
            dtype = f.type.value_type.to_pandas_dtype()
            flat = np.stack(values).astype(dtype) if values else np.empty((0, size), dtype=dtype)
            if flat.shape[1:] != (size,):
                raise ValueError(f"column {f.name}: vectors of shape {flat.shape[1:]}, the schema says ({size},)")
            arrays.append(pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1)), size))
        else:
            arrays.append(pa.array(values, type=f.type))
    return pa.Table.from_arrays(arrays, schema=out_schema)


def shard_name(prefix: str, rows: Sequence[dict]) -> str:
    # The name hashes the shard's ids, so a retried bundle that rewrites the same rows replaces
    # its earlier file instead of adding a copy.
    digest = hashlib.sha1("\n".join(r[schema.ID] for r in rows).encode("utf-8")).hexdigest()[:16]
    return f"{prefix}-{digest}{PARQUET_SUFFIX}"


def write_shard(data_dir: str, prefix: str, rows: Sequence[dict], out_schema: pa.Schema) -> tuple[str, int]:
    """Write rows as one zstd shard, atomically (a temporary name, then a rename); return (path, rows)."""
    table = rows_to_table(rows, out_schema)
    final = fs.join(data_dir, shard_name(prefix, rows))
    with fs.open_atomic(final) as fh:
        pq.write_table(table, fh, compression="zstd")
    return final, table.num_rows


def run_prefix(clock: Callable[[], float] = time.time) -> str:
    """A distinct shard prefix per run: shards of an earlier (interrupted) run are never overwritten."""
    return f"{SHARD_PREFIX}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime(clock()))}-{uuid.uuid4().hex[:6]}"


class ShardBuffer:
    """When to commit a shard: at `shard_rows` rows, or once the oldest buffered row is `shard_seconds` old.

    The age rule bounds what a kill loses when scoring is slow (a 10,000-row shard of a large
    teacher on CPU can take an hour). `clock` is injectable so the rule is tested without waiting.
    """

    def __init__(self, shard_rows: int, shard_seconds: float, clock: Callable[[], float] = time.monotonic):
        self.shard_rows, self.shard_seconds, self.clock = shard_rows, shard_seconds, clock
        self.rows: list[dict] = []
        self.since = 0.0

    def add(self, row: dict) -> Optional[list[dict]]:
        """Buffer one row; return the rows to commit now, or None."""
        if not self.rows:
            self.since = self.clock()
        self.rows.append(row)
        if len(self.rows) >= self.shard_rows or self.clock() - self.since >= self.shard_seconds:
            return self.take()
        return None

    def take(self) -> list[dict]:
        rows, self.rows = self.rows, []
        return rows

    def __len__(self) -> int:
        return len(self.rows)


def clean_up_shards(committed: Sequence[str], data_dir: str, prefix: str, out_schema: pa.Schema) -> int:
    """Delete shards of this run that no committed bundle produced (failed attempts); return the shard count.

    When nothing at all was written (every row rejected), an empty shard keeps the schema and
    metadata readable.
    """
    keep = set(committed)
    files = fs.listdir(data_dir)
    stray = [p for p in files if (fs.basename(p).startswith(prefix) and p not in keep)
             or fs.basename(p).startswith(TMP_PREFIX)]
    if stray:
        LOG.warning("deleting %d shard(s) left by failed bundle attempts", len(stray))
        fs.delete(stray)
    shards = [p for p in files if p.endswith(PARQUET_SUFFIX) and p not in stray]
    if not shards:
        write_shard(data_dir, f"{prefix}-empty", [], out_schema)
        return 1
    return len(shards)


# --- the run's stats --------------------------------------------------------------------------------
def check_stats(stats: dict) -> None:
    """Refuse to mark an output complete when its counts do not reconcile (the plan's checks should
    have stopped such a run before it started: this is the last line of defence)."""
    if stats["existing_ids_not_in_input"]:
        raise ValueError(f"{stats['existing_ids_not_in_input']} id(s) in the output are not in the input: "
                         "this output was resumed with a different input; rerun with --overwrite")
    if stats["existing_ids_written_twice"]:
        raise ValueError(f"{stats['existing_ids_written_twice']} id(s) appear in more than one shard of the output; "
                         "rerun with --overwrite")
    if stats["input_rows"] != stats["scored"] + stats["rejected"]:
        raise ValueError(f"stats do not reconcile: input_rows {stats['input_rows']} != scored {stats['scored']} "
                         f"+ rejected {stats['rejected']}")
