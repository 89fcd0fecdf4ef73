"""Deduplication and the evaluation-leak guard, as pure functions the pipeline calls."""
from __future__ import annotations

import hashlib
import pickle
import uuid
from typing import Container, Iterable, Iterator, Optional, Sequence

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from transferset import fs
from transferset.augment.compose import Row
from transferset.contract import schema
from transferset.sources import normalize_text


def dedup_key(text: str, text_b: Optional[str] = None) -> str:
    key = normalize_text(text)
    return key if text_b is None else key + "\x1f" + normalize_text(text_b)


def dedup_digest(text: str, text_b: Optional[str] = None) -> bytes:
    """16 bytes standing for dedup_key: what the pipeline groups on (a collision needs ~2**64 distinct texts)."""
    return hashlib.blake2b(dedup_key(text, text_b).encode("utf-8"), digest_size=16).digest()


# A row crosses the dedup grouping as one bytes object: a local runner holds every grouped value
# in memory, decoded, and a Row decodes to ~900 bytes of Python objects where its packed form
# takes ~170 (benchmarks/scale.py). `copies` is how many rows of its example it stands for (collapse).
def pack(row: Row, copies: int = 1) -> bytes:
    return pickle.dumps((row.id, row.source_id, row.text, row.text_b, row.ops, row.label, row.variant, copies),
                        protocol=pickle.HIGHEST_PROTOCOL)


def unpack(data: bytes) -> tuple[Row, int]:
    """(row, copies) from bytes `pack` made in the same pipeline."""
    *fields, copies = pickle.loads(data)
    return Row(*fields), copies


def resolve(rows: Iterable[Row], excluded: bool) -> tuple[Optional[Row], int, int]:
    """All rows sharing one normalized text → (kept row or None, duplicates dropped, excluded dropped).

    An original wins over a variant; ties break on id, so the choice never depends on
    the order rows arrive in (runner, worker count, retries).
    """
    rows = list(rows)
    if not rows:
        return None, 0, 0
    if excluded:
        return None, 0, len(rows)
    winner = min(rows, key=lambda r: (not r.is_original, r.id))
    return winner, len(rows) - 1, 0


def collapse(rows: Iterable[Row]) -> list[tuple[bytes, Row, int]]:
    """The rows of one example → one (digest, winner, copies) per normalized text, in first-seen order.

    About 30 % of tang rows repeat another row of their own example (short sentences give the same
    n-gram or the same masked copy again: 31k of 105k on 5,000 SST-2 rows); collapsing them before the
    grouping saves the grouping that work and memory. The winner is `resolve`'s, whose rule (minimum
    of a total order) gives the same winner whether applied once or in two rounds, and `copies` keeps
    the counts: resolve_packed counts every copy as a duplicate or as excluded, as `resolve` would have.
    """
    groups: dict[bytes, list[Row]] = {}
    for row in rows:
        groups.setdefault(dedup_digest(row.text, row.text_b), []).append(row)
    return [(digest, resolve(same, False)[0], len(same)) for digest, same in groups.items()]


def resolve_packed(values: Iterable[bytes], excluded: bool) -> tuple[Optional[Row], int, int]:
    """`resolve` over packed (row, copies) values of one normalized text: every copy is accounted for."""
    rows, copies = [], 0
    for value in values:
        row, n = unpack(value)
        rows.append(row)
        copies += n
    if not rows:
        return None, 0, 0
    if excluded:
        return None, 0, copies
    return resolve(rows, False)[0], copies - 1, 0


# --- the dedup through files: memory flat in the rows -------------------------------------------------
# A local Beam runner holds everything that crosses a grouping in memory, twice when the group is read
# (~0.8 KB per row: benchmarks/README.md, scale). So the rows cross no grouping: each worker writes them,
# packed, to files of one bucket each (the first bytes of the text digest pick the bucket), and each bucket
# is then deduplicated alone, from its files. Memory: one bucket's rows plus the writers' buffers.
SPILL_DIR = "_dedup"  # under the output folder; removed once the transfer set is written
SPILL_BUCKETS = 64  # 10 M rows: ~160k rows a bucket
SPILL_FLUSH_ROWS = 2048  # a bucket's buffered rows are written at this count (at most 64 × 2048 rows held)
_SPILL_SCHEMA = pa.schema([("digest", pa.binary(16)), ("value", pa.binary())])


def bucket_of(digest: bytes, buckets: int = SPILL_BUCKETS) -> int:
    return int.from_bytes(digest[:4], "little") % buckets


class SpillWriter:
    """(digest, packed row) pairs → Arrow files under `directory`, each holding rows of one bucket.

    add() and close() return the (bucket, path) of each file they wrote; only files returned are
    read back, so a file of a failed attempt (a retried bundle) is never counted.
    """

    def __init__(self, directory: str, buckets: int = SPILL_BUCKETS, flush_rows: int = SPILL_FLUSH_ROWS):
        self.directory, self.flush_rows = directory, flush_rows
        self.buffers: list[list[tuple[bytes, bytes]]] = [[] for _ in range(buckets)]
        self.prefix = uuid.uuid4().hex[:12]
        self.files = 0
        fs.makedirs(directory)

    def add(self, digest: bytes, value: bytes) -> Optional[tuple[int, str]]:
        b = bucket_of(digest, len(self.buffers))
        self.buffers[b].append((digest, value))
        return self._write(b) if len(self.buffers[b]) >= self.flush_rows else None

    def close(self) -> list[tuple[int, str]]:
        return [self._write(b) for b, buf in enumerate(self.buffers) if buf]

    def _write(self, b: int) -> tuple[int, str]:
        rows, self.buffers[b] = self.buffers[b], []
        table = pa.table([pa.array([d for d, _ in rows], pa.binary(16)), pa.array([v for _, v in rows], pa.binary())],
                         schema=_SPILL_SCHEMA)
        self.files += 1
        path = fs.join(self.directory, f"b{b:03d}-{self.prefix}-{self.files:06d}.arrow")
        with fs.open(path, "wb") as fh, ipc.new_file(fh, _SPILL_SCHEMA) as writer:
            writer.write_table(table)
        return b, path


def read_spilled(path: str) -> Iterator[tuple[bytes, bytes]]:
    with fs.open_input(path) as fh:
        table = ipc.open_file(fh).read_all()
    yield from zip(table.column("digest").to_pylist(), table.column("value").to_pylist())


def dedup_spilled(paths: Iterable[str], excluded: Container[bytes]) -> Iterator[tuple[Optional[Row], int, int]]:
    """The files of one bucket → resolve_packed per normalized text: (kept row or None, duplicates, excluded)."""
    groups: dict[bytes, list[bytes]] = {}
    for path in sorted(paths):
        for digest, value in read_spilled(path):
            groups.setdefault(digest, []).append(value)
    for digest, values in groups.items():
        yield resolve_packed(values, digest in excluded)


OUTPUT_ROW_GROUP = 16_384  # rows per Parquet row group of the transfer set (score reads it in units)


def bucket_file(bucket: int, buckets: int = SPILL_BUCKETS) -> str:
    return f"part-{bucket:05d}-of-{buckets:05d}.parquet"


def write_rows(data_dir: str, name: str, rows: Sequence[Row], out_schema: pa.Schema) -> tuple[str, int]:
    """Rows (sorted by id, so a bucket's file is the same on any runner) → one zstd Parquet file, written
    under a temporary name and renamed: a retried bucket replaces its file whole. Returns (path, rows)."""
    table = pa.Table.from_pylist([to_record(r) for r in sorted(rows, key=lambda r: r.id)], schema=out_schema)
    path = fs.join(data_dir, name)
    fs.makedirs(data_dir)
    with fs.open_atomic(path) as fh:
        pq.write_table(table, fh, compression="zstd", row_group_size=OUTPUT_ROW_GROUP)
    return path, table.num_rows


def to_record(row: Row) -> dict:
    return {
        schema.ID: row.id,
        schema.SOURCE_ID: row.source_id,
        schema.TEXT: row.text,
        schema.TEXT_B: row.text_b,
        schema.OPS: list(row.ops),
        schema.LABEL: row.label,
    }


STAT_KEYS = ("input_rows", "accepted_rows", "rejected_rows", "originals", "variants_generated",
             "duplicates_dropped", "excluded_dropped", "output_rows")


def reconcile(stats: dict) -> list[str]:
    """Problems with the counts (empty when every row is accounted for)."""
    problems = []
    if stats["input_rows"] != stats["accepted_rows"] + stats["rejected_rows"]:
        problems.append(f"input_rows {stats['input_rows']} != accepted {stats['accepted_rows']} + "
                        f"rejected {stats['rejected_rows']}")
    if stats["originals"] != stats["accepted_rows"]:
        problems.append(f"originals {stats['originals']} != accepted rows {stats['accepted_rows']}")
    expect = stats["originals"] + stats["variants_generated"] - stats["duplicates_dropped"] - stats["excluded_dropped"]
    if expect != stats["output_rows"]:
        problems.append(f"originals + variants_generated - duplicates_dropped - excluded_dropped = {expect} "
                        f"!= output_rows {stats['output_rows']}")
    return problems


def bad_inputs(per_file: dict[str, dict], samples: dict[str, Sequence[dict]]) -> list[str]:
    """Messages for inputs where every row was rejected."""
    out = []
    for path, c in sorted(per_file.items()):
        if c.get("accepted", 0) == 0 and c.get("rejected", 0) > 0:
            lines = [f"{path}: every row was rejected ({c['rejected']} rows). First problems:"]
            for r in samples.get(path, [])[:3]:
                lines.append(f"  line {r[schema.REJECT_LINE]}: {r[schema.REJECT_REASON]}")
            out.append("\n".join(lines))
    return out
