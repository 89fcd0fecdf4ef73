"""What `transferset predict` writes, and the settings it takes: the library side of predicting.

OUT (a directory, local or a URL, laid out as augment's and score's outputs are):

    OUT/data/part-*.parquet    zstd; or part-*.jsonl with --format jsonl
    OUT/rejects/rejects-*.jsonl  every input row that could not be read, with its reason
    OUT/stats.json             input_rows = predicted + rejected, per input file; then OUT/_COMPLETE

One row per accepted input row, columns:

    id               the row's content id (sources.source_id_for(text, text_b)): the id the row's text
                     gets everywhere in transferset (an original's source_id in a transfer set)
    text, text_b     the text as read (text_b only when --text-b-column is given)
    predicted_label  the name of the most probable class
    prob_<name>      float32 probability of each class, one column per label name, in class order

The label names, in class order, are also in the Parquet metadata (transferset.label_names), so a
reader never has to parse column names. Both the in-process path (transferset.app.predict) and the
Beam pipeline (pipelines/predict.py) build rows with `rows_of` and the schema with `output_schema`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from transferset import fs, schema
from transferset.errors import UserError
from transferset.config import PredictConfig
from transferset.sources import Example, SourceSpec, detect_format

DATA_PREFIX = "part"


def source_spec(path: str, cfg: PredictConfig) -> SourceSpec:
    """How to read one input for predicting: texts only, no labels."""
    return SourceSpec(path=path, text_column=cfg.text_column, label_column=None, text_b_column=cfg.text_b_column,
                      max_chars=cfg.max_chars)


def output_schema(label_names: Sequence[str], pairs: bool, model: str = "") -> pa.Schema:
    fields = [pa.field(schema.ID, pa.string(), nullable=False), pa.field(schema.TEXT, pa.string(), nullable=False)]
    if pairs:
        fields.append(pa.field(schema.TEXT_B, pa.string()))
    fields.append(pa.field(schema.PREDICTED_LABEL, pa.string(), nullable=False))
    fields += [pa.field(schema.prob_column(n), pa.float32(), nullable=False) for n in label_names]
    return pa.schema(fields, metadata=schema.encode_metadata({schema.META_LABEL_NAMES: list(label_names),
                                                              schema.META_MODEL: model}))


def check_label_names(label_names: Sequence[str]) -> None:
    """One prob_ column per name: names must be distinct strings."""
    if len(set(map(str, label_names))) != len(label_names):
        raise UserError(f"the model's label names {list(label_names)} repeat a name: one prob_<name> column "
                          "each cannot be written; fix id2label in its config.json")


def rows_of(examples: Sequence[Any], labels: Sequence[str], probabilities, label_names: Sequence[str],
            pairs: bool) -> list[dict]:
    """Output rows for `examples` and their predictions: an Example gives its id; a dict ({text, text_b},
    on Beam, where the id travels as the key) gives none."""
    out = []
    columns = [schema.prob_column(n) for n in label_names]
    for i, ex in enumerate(examples):
        if isinstance(ex, Example):
            row = {schema.ID: ex.source_id, schema.TEXT: ex.text}
            text_b = ex.text_b
        else:
            row = {schema.TEXT: ex[schema.TEXT]}
            text_b = ex.get(schema.TEXT_B)
        if pairs:
            row[schema.TEXT_B] = text_b
        row[schema.PREDICTED_LABEL] = labels[i]
        row.update(zip(columns, (float(p) for p in probabilities[i])))
        out.append(row)
    return out


def json_line(row: dict) -> str:
    return json.dumps(row, ensure_ascii=False)


def count_lines(path: str, opener: Callable[[str], Any] = fs.open) -> Optional[int]:
    """Rows the readers will yield for `path` (each is kept or rejected): its lines (less the header of a
    TSV/CSV), a Parquet file's rows from its footer; None for hf: datasets and unreadable files."""
    fmt = detect_format(path)
    if fmt == "hf":
        return None
    try:
        if fmt == "parquet":
            with opener(path) as fh:
                return int(pq.ParquetFile(fh).metadata.num_rows)
        n, last = 0, b"\n"
        with opener(path) as fh:
            while True:
                chunk = fh.read(1 << 20)
                if not chunk:
                    break
                n += chunk.count(b"\n")
                last = chunk[-1:]
        n += last != b"\n"  # a last line without a newline is a line too
    except (OSError, ValueError, pa.ArrowException):
        return None  # the reader says what is wrong with it
    return max(0, n - 1) if fmt in ("tsv", "csv") else n


def reconcile(stats: dict) -> list[str]:
    """Problems with the counts: every line read is either predicted or rejected."""
    problems = []
    if stats["input_rows"] != stats["predicted"] + stats["rejected"]:
        problems.append(f"input_rows {stats['input_rows']} != predicted {stats['predicted']} + rejected "
                        f"{stats['rejected']}")
    expected = stats.get("input_lines")
    if expected is not None and expected != stats["input_rows"]:
        problems.append(f"the inputs have {expected} rows (lines) but {stats['input_rows']} were read")
    return problems


def every_row_rejected(path: str, n: int, samples: Sequence[Any]) -> str:
    """The message for an input none of whose `n` rows could be read; `samples`: its first Rejects."""
    lines = [f"{path}: every row was rejected ({n} row{'' if n == 1 else 's'}). First problems:"]
    lines += [f"  line {r.line}: {r.reason}" for r in samples]
    lines.append("Check that --text-column (and --text-b-column) name columns of this file.")
    return "\n".join(lines)


def data_path(out: str, fmt: str, shard: int = 0, shards: int = 1) -> str:
    return fs.join(out, schema.DATA_DIR, f"{DATA_PREFIX}-{shard:05d}-of-{shards:05d}.{fmt}")
