"""What `transferset predict` writes, and the settings it takes: the library side of predicting.

OUT (a directory, local or a URL, laid out as augment's and score's outputs are):

    OUT/data/part-*.parquet    zstd; or part-*.jsonl with --format jsonl
    OUT/rejects/rejects-*.jsonl  every input row that could not be read, with its reason
    OUT/stats.json             input_rows = predicted + rejected, per input file; then OUT/_COMPLETE

One row per accepted input row, columns:

    id               this input row's id (`row_id`): a hash of file, line and text, so it is unique per
                     input row (the same sentence on two lines or in two inputs gets two ids) and the
                     same in every rerun on the same inputs, in-process or on Beam
    file, line       where the row was read: the input as given, and its line there (a TSV/CSV's header
                     is line 1; a Parquet file's or hf: dataset's row number from 1), as in the rejects
    source_id        the text's content id (sources.source_id_for): the id the same text gets everywhere
                     in transferset (an original's source_id in a transfer set), shared by repeats
    text, text_b     the text as read (text_b only when --text-b-column is given)
    predicted_label  the name of the most probable class
    prob_<name>      float32 probability of each class, one column per label name, in class order

The label names, in class order, are also in the Parquet metadata (transferset.label_names), so a
reader never has to parse column names. Both the in-process path (students/predict.py) and the Beam
pipeline (pipelines/predict.py) build rows with `rows_of` and the schema with `output_schema`.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, Callable, Optional, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from transferset import fs
from transferset.config import PredictConfig
from transferset.contract import schema
from transferset.runtime.errors import UserError
from transferset.sources import Example, SourceSpec, detect_format

DATA_PREFIX = "part"


def source_spec(path: str, cfg: PredictConfig) -> SourceSpec:
    """How to read one input for predicting: texts only, no labels."""
    return SourceSpec(path=path, text_column=cfg.text_column, label_column=None, text_b_column=cfg.text_b_column,
                      max_chars=cfg.max_chars)


def output_schema(label_names: Sequence[str], pairs: bool, model: str = "") -> pa.Schema:
    fields = [pa.field(schema.ID, pa.string(), nullable=False),
              pa.field(schema.INPUT_FILE, pa.string(), nullable=False),
              pa.field(schema.INPUT_LINE, pa.int64(), nullable=False),
              pa.field(schema.SOURCE_ID, pa.string(), nullable=False),
              pa.field(schema.TEXT, pa.string(), nullable=False)]
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


def row_id(file: str, line: int, text: str, text_b: Optional[str]) -> str:
    """The id of one input row: where it was read and what it holds. The text is in it so that an input
    edited between two runs does not give a changed row the id of the row that was on its line before."""
    payload = json.dumps([file, int(line), text, text_b])  # ASCII: \u escapes, lone surrogates included
    return hashlib.sha1(payload.encode("ascii")).hexdigest()[:16]


def input_row(example: Example) -> dict:
    """What travels from the reader to the model and on into the output row (on Beam: the value of a
    keyed element whose key is the id)."""
    return {schema.ID: row_id(example.file, example.line, example.text, example.text_b),
            schema.INPUT_FILE: example.file, schema.INPUT_LINE: int(example.line),
            schema.SOURCE_ID: example.source_id, schema.TEXT: example.text, schema.TEXT_B: example.text_b}


def keyed_input_row(example: Example) -> tuple[str, dict]:
    """(id, input_row): the keyed element Beam's RunInference carries."""
    row = input_row(example)
    return row[schema.ID], row


def rows_of(examples: Sequence[Any], labels: Sequence[str], probabilities, label_names: Sequence[str],
            pairs: bool) -> list[dict]:
    """Output rows, in output_schema's column order, for `examples` (Examples or their `input_row`s) and
    their predictions."""
    out = []
    columns = [schema.prob_column(n) for n in label_names]
    for i, ex in enumerate(examples):
        src = input_row(ex) if isinstance(ex, Example) else ex
        row = {k: src[k] for k in (schema.ID, schema.INPUT_FILE, schema.INPUT_LINE, schema.SOURCE_ID, schema.TEXT)}
        if pairs:
            row[schema.TEXT_B] = src.get(schema.TEXT_B)
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
