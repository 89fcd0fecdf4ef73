"""`transferset predict` on Apache Beam: large inputs, any runner (the app runs small ones in-process).

    inputs ─ReadInputs─┬─▶ KeyById ─▶ Predict (RunInference, keyed) ─▶ ToRows ─▶ WriteParquet | WriteJsonl
                       └─▶ rejects ─▶ OUT/rejects/*.jsonl
                                     counts ─▶ Finalize (stats.json, _COMPLETE)

The same shape as `score`: a ModelHandler whose model object has one `predict(texts, texts_b)`
method, wrapped in KeyedModelHandler so ids travel with rows. The model is loaded by a `loader`
the caller injects (transferset.app.cli.predict passes students.predict.load_predictor): pipelines
never import the students. Rows and schema come from transferset.data.predictions, as in-process.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Optional, Sequence

import apache_beam as beam
from apache_beam.ml.inference.base import KeyedModelHandler, ModelHandler, RunInference

from pipelines import runtime as opts
from transferset.config import BeamConfig
from transferset.config import PredictConfig
from transferset.contract import schema
from transferset.data import predictions
from transferset.runtime.errors import UserError
from transferset.runtime.progress import Progress
from transferset.sources import Reject

METRICS_NAMESPACE = "transferset_predict"
ROWS_PREDICTED = "rows_predicted"  # rows_read and rows_rejected are counted by runtime.read_rows


@dataclass(frozen=True)
class PredictJob:
    """Everything `build` needs: the model (and how a worker loads it), inputs, output and settings."""

    model: str
    loader: Callable[[str], Any]  # model path → an object with predict(texts, texts_b, batch_size) and label_names
    label_names: tuple[str, ...]
    inputs: tuple[str, ...]
    output: str
    cfg: PredictConfig = PredictConfig()
    total: Optional[int] = None  # rows in the inputs (predictions.count_lines), for progress and the check


def counter(name: str):
    return beam.metrics.Metrics.counter(METRICS_NAMESPACE, name)


def _read(spec):
    return opts.read_rows(spec, METRICS_NAMESPACE)


class PredictModelHandler(ModelHandler):
    """Input rows (predictions.input_row) → output rows with predicted_label and prob_<name> (predictions.rows_of)."""

    def __init__(self, model: str, loader: Callable[[str], Any], *, label_names: Sequence[str], pairs: bool,
                 batch_size: int, large_model: bool = False):
        super().__init__(min_batch_size=max(1, min(32, batch_size)), max_batch_size=batch_size,
                         large_model=large_model)
        self.model, self.loader = model, loader
        self.label_names, self.pairs, self.batch_size = list(label_names), pairs, batch_size

    def load_model(self):
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # one bar per worker is noise in pipeline logs
        model = self.loader(self.model)
        if list(model.label_names) != self.label_names:
            raise UserError(f"{self.model}: the worker loaded labels {model.label_names}, the launcher "
                            f"{self.label_names}: the model changed during the run")
        return model

    def run_inference(self, batch: Sequence[dict], model, inference_args=None) -> list[dict]:
        texts = [row[schema.TEXT] for row in batch]
        texts_b = [row.get(schema.TEXT_B) for row in batch] if self.pairs else None
        out = model.predict(texts, texts_b, batch_size=self.batch_size)
        return predictions.rows_of(batch, out.labels, out.probabilities, self.label_names, self.pairs)

    def get_num_bytes(self, batch: Sequence[dict]) -> int:
        return sum(len(r[schema.TEXT]) + len(r.get(schema.TEXT_B) or "") for r in batch)

    def get_metrics_namespace(self) -> str:
        return METRICS_NAMESPACE


class ToRows(beam.DoFn):
    """(id, row) → the output row (which holds its id); counts rows and reports progress against `total`."""

    def __init__(self, total: Optional[int]):
        self.total = total

    def setup(self):
        self.progress = Progress("rows predicted", total=self.total)
        self.predicted = counter(ROWS_PREDICTED)

    def process(self, element):
        _, row = element
        self.predicted.inc()
        self.progress.update()
        yield row


def build(pipeline: beam.Pipeline, job: PredictJob) -> dict:
    cfg = job.cfg
    pairs = cfg.text_b_column is not None
    label_names = list(job.label_names)
    read = (pipeline
            | "ListInputs" >> beam.Create([predictions.source_spec(p, cfg) for p in job.inputs])
            | "ReadInputs" >> beam.FlatMap(_read).with_outputs("rejects", main="examples"))
    examples, rejects = read.examples, read.rejects
    handler = KeyedModelHandler(PredictModelHandler(job.model, job.loader, label_names=label_names, pairs=pairs,
                                                    batch_size=cfg.batch_size))
    rows = (examples
            | "SpreadExamples" >> beam.Reshuffle()
            | "KeyById" >> beam.Map(predictions.keyed_input_row)
            | "Predict" >> RunInference(handler)
            | "ToRows" >> beam.ParDo(ToRows(job.total)))
    data = opts.join(job.output, schema.DATA_DIR, predictions.DATA_PREFIX)
    if cfg.format == "parquet":
        written = rows | "WriteParquet" >> beam.io.WriteToParquet(
            data, predictions.output_schema(label_names, pairs, job.model), codec="zstd", file_name_suffix=".parquet")
    else:
        written = (rows
                   | "RowsToJson" >> beam.Map(predictions.json_line)
                   | "WriteJsonl" >> beam.io.WriteToText(data, file_name_suffix=".jsonl"))
    rejects_written = rejects | "WriteRejects" >> opts.WriteRejects(job.output)
    per_file = opts.rows_by_file(examples, rejects, "predicted")
    samples = opts.first_rejects_by_file(rejects)
    n_predicted = opts.count(rows, "CountPredicted")
    n_rejected = opts.count(rejects, "CountRejected")
    counts = {
        "input_rows": opts.total((n_predicted, n_rejected) | "InputRows" >> beam.Flatten(), "SumInput"),
        "predicted": n_predicted,
        "rejected": n_rejected,
        "inputs": per_file,
        "first_rejects": samples,
    }

    def check(stats):
        problems = predictions.reconcile(stats)
        for path, c in sorted(stats["inputs"].items()):
            if c["predicted"] == 0 and c["rejected"] > 0:
                first = [Reject(path, r[schema.REJECT_LINE], "", r[schema.REJECT_REASON])
                         for r in stats["first_rejects"].get(path, [])]
                problems.append(predictions.every_row_rejected(path, c["rejected"], first))
        stats["problems"] = problems
        return not problems

    static = {"model": job.model, "input_lines": job.total, "format": cfg.format, "label_names": label_names,
              "pairs": pairs, "runner": "beam"}
    finished = pipeline | "Finalize" >> opts.Finalize(job.output, counts, wait_on=[written, rejects_written],
                                                      static=static, check=check)
    return {"rows": rows, "rejects": rejects, "stats": finished}


def run_predict(job: PredictJob, *, beam_cfg: BeamConfig = BeamConfig(), extra: Sequence[str] = (),
                overwrite: bool = False) -> dict:
    """Run `job` on Beam; → the stats. Raises UserError when the stats show a problem.

    The run owns `job.output` while it writes (transferset.fs.output), which may not contain an input or the model.
    """
    out = opts.output(job.output, "predict", inputs=[*job.inputs, job.model], overwrite=overwrite)
    with out.open():
        out.prepare()
        with beam.Pipeline(options=opts.pipeline_options(beam_cfg, extra)) as pipeline:
            build(pipeline, replace(job, output=out.path))
        out.record()
    return opts.finished_stats(out.path)
