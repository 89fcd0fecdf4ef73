"""`transferset inspect OUT`: a JSON summary of a transfer set (augmented or scored)."""
from __future__ import annotations

import argparse
import json
from collections import Counter
from typing import Any, Sequence

from transferset import fs
from transferset.contract import schema
from transferset.data import transfer


def summarize(directory: str) -> dict[str, Any]:
    files = transfer.data_files(directory)
    meta = transfer.read_metadata(directory)
    arrow_schema = transfer.read_schema(files[0])
    op_counts: Counter = Counter()  # per combination of ops, in order
    single: Counter = Counter()  # rows each op took part in
    examples: dict[str, dict] = {}
    labels: Counter = Counter()
    rows = 0
    for batch in transfer.iter_batches(directory, columns=[schema.ID, schema.TEXT, schema.OPS, schema.LABEL]):
        for rec in batch.to_pylist():
            rows += 1
            key = "+".join(rec[schema.OPS]) or "original"
            op_counts[key] += 1
            single.update(rec[schema.OPS])
            labels["null" if rec[schema.LABEL] is None else rec[schema.LABEL]] += 1
            if key not in examples:
                examples[key] = {schema.ID: rec[schema.ID], schema.TEXT: rec[schema.TEXT]}
    out: dict[str, Any] = {
        "directory": directory,
        "complete": fs.exists(transfer.complete_marker(directory)),
        "files": len(files),
        "rows": rows,
        "columns": {f.name: str(f.type) for f in arrow_schema},
        "metadata": meta,
        "counts_per_op": dict(sorted(single.items())),
        "counts_per_combination": dict(sorted(op_counts.items())),
        "gold_labels": {str(k): v for k, v in sorted(labels.items(), key=lambda kv: str(kv[0]))},
        "example_per_op": dict(sorted(examples.items())),
    }
    stats_path = fs.join(directory, schema.STATS_FILE)
    if fs.exists(stats_path):
        out["stats"] = fs.read_json(stats_path)
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", metavar="OUT", help="output directory of `transferset augment` or `score`")


def run(args, extra: Sequence[str]) -> int:
    print(json.dumps(summarize(args.directory), indent=2, ensure_ascii=False))
    return 0
