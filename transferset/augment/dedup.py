"""Deduplication and the evaluation-leak guard, as pure functions the pipeline calls."""
from __future__ import annotations

import hashlib
import pickle
from typing import Iterable, Optional, Sequence

from transferset import schema
from transferset.augment.compose import Row
from transferset.sources import normalize_text


def dedup_key(text: str, text_b: Optional[str] = None) -> str:
    key = normalize_text(text)
    return key if text_b is None else key + "\x1f" + normalize_text(text_b)


def dedup_digest(text: str, text_b: Optional[str] = None) -> bytes:
    """16 bytes standing for dedup_key: what the pipeline groups on (a collision needs ~2**64 distinct texts)."""
    return hashlib.blake2b(dedup_key(text, text_b).encode("utf-8"), digest_size=16).digest()


# A row crosses the dedup grouping as one bytes object: a local runner holds every grouped value
# in memory, decoded, and a Row decodes to ~900 bytes of Python objects where its packed form
# takes ~170 (benchmarks/scale.py).
def pack(row: Row) -> bytes:
    return pickle.dumps((row.id, row.source_id, row.text, row.text_b, row.ops, row.label, row.variant),
                        protocol=pickle.HIGHEST_PROTOCOL)


def unpack(data: bytes) -> Row:
    return Row(*pickle.loads(data))  # only bytes `pack` made in the same pipeline


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
