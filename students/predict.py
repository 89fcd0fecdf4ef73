"""Predicting files in this process (`transferset predict` below its Beam threshold).

Reads every input with transferset.sources (every format; each row kept or rejected with a reason),
predicts in chunks with any loaded classifier (Student, OnnxStudent), and writes OUT as
transferset.data.predictions describes it: the same layout and rows as pipelines/predict.py writes on Beam.
"""
from __future__ import annotations

import time
from typing import Optional, Sequence

import pyarrow as pa
import pyarrow.parquet as pq
from students.student import Predictor, Student
from transferset import fs
from transferset.config import PredictConfig
from transferset.contract import schema
from transferset.data import predictions
from transferset.fs.output import Output
from transferset.fs.remote import local_teacher
from transferset.runtime.errors import UserError
from transferset.runtime.progress import Progress
from transferset.runtime.threads import set_torch_threads
from transferset.sources import Example, Reject, read_source

CHUNK_ROWS = 4096  # rows read, predicted and written at a time (one Parquet row group)
SHOWN_REJECTS = 5  # per input, for the message when every row of an input is rejected


def load_predictor(model: str, max_length: Optional[int] = None, threads: Optional[int] = None,
                   speed: Optional[float] = None) -> Predictor:
    """A student, any Hugging Face classifier or an ONNX export, from a local directory or a URL (copied
    once into the local cache). `threads` pins torch's (and so onnxruntime's) CPU threads; `speed` is the
    early exits' threshold of every prediction (a model with exits; refused above 0 for any other).

    Module-level so Beam workers load the model by reference (pipelines/predict.py gets it injected)."""
    set_torch_threads(threads)
    predictor = Student.from_pretrained(local_teacher(model) if fs.is_remote(model) else model, max_length=max_length)
    predictor.check_speed(speed)  # refused here, before any output or pipeline
    if speed is not None:  # None: the speed the folder records (a search's chosen student with exits), else 0
        predictor.speed = speed
    return predictor


class _Writer:
    """The one data file of an in-process run: Parquet (a row group per chunk) or JSON lines."""

    def __init__(self, path: str, fmt: str, out_schema: pa.Schema):
        self.fh = fs.open(path, "wb")
        self.fmt, self.schema = fmt, out_schema
        self.parquet = pq.ParquetWriter(self.fh, out_schema, compression="zstd") if fmt == "parquet" else None

    def write(self, rows: list[dict]) -> None:
        if self.parquet is not None:
            self.parquet.write_table(pa.Table.from_pylist(rows, schema=self.schema))
        else:
            self.fh.write("".join(predictions.json_line(r) + "\n" for r in rows).encode("utf-8"))

    def close(self) -> None:
        if self.parquet is not None:
            self.parquet.close()
        self.fh.close()


def predict_files(predictor: Predictor, inputs: Sequence[str], output: str, cfg: PredictConfig = PredictConfig(), *,
                  model: str = "", total: Optional[int] = None, overwrite: bool = False,
                  progress: Optional[bool] = None) -> dict:
    """Predict every row of `inputs` into `output`; → the stats (also OUT/stats.json).

    `total`: the rows the inputs hold (predictions.count_lines), for the progress ETA and the check
    that every row was read. `progress`: a bar (True), lines every 30 s (False), a bar on a terminal (None).
    Raises UserError when an input had rows but every one was rejected (OUT/_COMPLETE is then not written).
    """
    out = Output(output, "predict", inputs=[*inputs, model], overwrite=overwrite)
    with out.open():
        return _predict_files(predictor, inputs, out, cfg, model=model, total=total, progress=progress)


def _predict_files(predictor: Predictor, inputs: Sequence[str], out: Output, cfg: PredictConfig, *, model: str,
                   total: Optional[int], progress: Optional[bool]) -> dict:
    started = time.time()
    label_names = list(predictor.label_names)
    predictions.check_label_names(label_names)
    pairs = cfg.text_b_column is not None
    out_schema = predictions.output_schema(label_names, pairs, model)
    out.prepare()
    output = out.path
    fs.makedirs(out.join(schema.DATA_DIR))
    writer = _Writer(predictions.data_path(output, cfg.format), cfg.format, out_schema)
    bar = Progress("rows predicted", total=total, bar=progress)
    per_file: dict[str, dict] = {}
    first_rejects: dict[str, list[Reject]] = {}
    chunk: list[Example] = []

    def flush() -> None:
        if chunk:
            pred = predictor.predict([e.text for e in chunk], [e.text_b for e in chunk] if pairs else None,
                                     batch_size=cfg.batch_size)
            writer.write(predictions.rows_of(chunk, pred.labels, pred.probabilities, label_names, pairs))
            bar.update(len(chunk))
            chunk.clear()

    try:
        with out.rejects("rejects-00000-of-00001.jsonl") as write_reject:
            for path in inputs:
                counts = per_file.setdefault(path, {"predicted": 0, "rejected": 0})
                for rec in read_source(predictions.source_spec(path, cfg), opener=fs.open):
                    if isinstance(rec, Reject):
                        counts["rejected"] += 1
                        write_reject(rec)
                        if len(first_rejects.setdefault(path, [])) < SHOWN_REJECTS:
                            first_rejects[path].append(rec)
                        bar.update()
                        continue
                    counts["predicted"] += 1
                    chunk.append(rec)
                    if len(chunk) >= CHUNK_ROWS:
                        flush()
            flush()
    finally:
        writer.close()
        bar.close()
    predicted = sum(c["predicted"] for c in per_file.values())
    rejected = sum(c["rejected"] for c in per_file.values())
    elapsed = time.time() - started
    stats = {"model": model, "inputs": per_file, "input_rows": predicted + rejected, "input_lines": total,
             "predicted": predicted, "rejected": rejected, "format": cfg.format, "label_names": label_names,
             "pairs": pairs, "runner": "in-process", "elapsed_s": round(elapsed, 2),
             "rows_per_s": round((predicted + rejected) / max(elapsed, 1e-9), 1)}
    problems = predictions.reconcile(stats)
    problems += [predictions.every_row_rejected(path, c["rejected"], first_rejects[path])
                 for path, c in per_file.items() if c["predicted"] == 0 and c["rejected"] > 0]
    stats["problems"] = problems
    out.finish(stats, complete=not problems)
    if problems:
        raise UserError("\n".join(problems) + f"\n(rejected rows with reasons: {fs.join(output, schema.REJECTS_DIR)}/)")
    return stats
