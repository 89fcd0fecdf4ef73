"""`transferset predict`: label files with a student, any Hugging Face classifier, or an ONNX export.

Inputs below `--beam-above` rows run in this process (students/predict.py); larger ones, or any run
given --beam, --runner, --workers or another Beam option, run on Apache Beam (pipelines/predict.py).
Both write the same OUT (transferset/data/predictions.py).
"""
from __future__ import annotations

import argparse
import functools
import sys
import time
from typing import Optional, Sequence

from students.predict import load_predictor, predict_files
from transferset import fs
from transferset.app.cli import flags
from transferset.app.cli.flags import add_runner_arguments
from transferset.config import BeamConfig, PredictConfig
from transferset.contract import schema
from transferset.data import predictions
from transferset.models.loading import check_hub_model
from transferset.runtime.errors import ConfigError, UserError
from transferset.sources import HF_PREFIX, check_hf_names, check_readable, detect_format

EPILOG = """examples:
  transferset predict --model runs/sst2/students/bilstm --input reviews.tsv --output runs/preds
  transferset predict --model runs/sst2/teacher --input a.jsonl b.parquet --output gs://B/preds --format jsonl
  transferset predict --model runs/sst2/onnx/bilstm --input hf:glue:sst2:validation --output runs/preds_onnx
  transferset predict --model M --input big.parquet --output OUT --runner FnApiRunner --workers 2

OUT/data/part-*.parquet (zstd; .jsonl with --format jsonl): id (unique per input row), file and line
(where the row was read), source_id (the text's id), text (text_b with --text-b-column),
predicted_label, and prob_<label name> per class (float32; the label names in class order are also in
the Parquet metadata, transferset.label_names). OUT/rejects/*.jsonl: each row that could not be read,
with its reason. OUT/stats.json: input_rows = predicted + rejected, per input; then OUT/_COMPLETE."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("model, inputs and output")
    g.add_argument("--model", required=True,
                   help="`transferset train` output (or its model/), any Hugging Face sequence-classifier "
                        "directory (e.g. the teacher), or a `transferset export` directory (run by onnxruntime)")
    g.add_argument("--input", required=True, action="extend", nargs="+", metavar="PATH",
                   help=".tsv/.csv/.jsonl/.parquet file (local or a URL) or hf:NAME[:CONFIG]:SPLIT (several allowed)")
    g.add_argument("--output", required=True, metavar="OUT", help="output directory (local or a URL)")
    g.add_argument("--beam", action="store_true", help="run on Apache Beam whatever the size of the inputs")
    g.add_argument("--no-progress", dest="progress", action="store_false",
                   help="progress as a line every 30 s even on a terminal (in-process runs)")
    flags.add_arguments(parser, PredictConfig, title="settings")
    add_runner_arguments(parser)


def wants_beam(args: argparse.Namespace, extra: Sequence[str], rows: Optional[int], cfg: PredictConfig) -> bool:
    """Beam when asked (--beam, --runner, --workers, a Beam option) or when the inputs hold beam_above rows or more."""
    asked = args.beam or hasattr(args, "runner") or hasattr(args, "workers") or bool(extra)
    return asked or (rows is not None and rows >= cfg.beam_above)


def check_inputs(inputs: Sequence[str]) -> Optional[int]:
    """Refuse inputs that cannot be read at all, before anything is loaded; → their rows (None: unknown)."""
    total: Optional[int] = 0
    for path in inputs:
        detect_format(path)
        if not path.startswith(HF_PREFIX) and not fs.exists(path):
            raise UserError(f"--input {path}: no such file")
        check_readable(path, opener=fs.open)  # an hf: split that does not load too: before any output
        n = predictions.count_lines(path)
        total = None if n is None or total is None else total + n
    return total


def run(args: argparse.Namespace, extra: Sequence[str]) -> int:
    cfg = flags.from_args(PredictConfig, args)
    if extra and not (args.beam or hasattr(args, "runner") or hasattr(args, "workers")):
        # A typo must not silently turn an in-process run into a Beam one.
        raise ConfigError(f"unrecognized arguments: {' '.join(extra)} (Beam pipeline options need --beam or --runner)")
    started = time.time()
    # Every name that must load, checked before anything is written (a hub name offline: one line, exit 2).
    check_hub_model(args.model, what="--model")
    check_hf_names([("--input", p) for p in args.input])
    total = check_inputs(args.input)
    on_beam = wants_beam(args, extra, total, cfg)
    # Loaded here in both cases: a model that does not load stops the command before a pipeline starts,
    # and the Beam graph needs its label names for the output schema.
    predictor = load_predictor(args.model, cfg.max_length, cfg.threads, cfg.speed)
    # Each runner owns OUT while it writes (transferset.fs.output): one run at a time, nothing of another's deleted.
    if on_beam:
        from pipelines.predict import PredictJob, run_predict  # Beam only for inputs that need it

        job = PredictJob(model=args.model, label_names=tuple(predictor.label_names), inputs=tuple(args.input),
                         output=args.output, cfg=cfg, total=total,
                         loader=functools.partial(load_predictor, max_length=cfg.max_length, threads=cfg.threads,
                                                  speed=cfg.speed))
        del predictor  # the workers load their own
        stats = run_predict(job, beam_cfg=flags.from_args(BeamConfig, args), extra=extra, overwrite=args.overwrite)
    else:
        stats = predict_files(predictor, args.input, args.output, cfg, model=args.model, total=total,
                              overwrite=args.overwrite, progress=None if args.progress else False)
    elapsed = time.time() - started
    where = "Beam" if on_beam else "in-process"
    print(f"transferset predict: {stats['input_rows']:,} rows read, {stats['predicted']:,} predicted, "
          f"{stats['rejected']:,} rejected (reasons: {fs.join(args.output, schema.REJECTS_DIR)}/) → "
          f"{fs.join(args.output, schema.DATA_DIR)}/ ({cfg.format}), {elapsed:.1f} s, {where}",
          file=sys.stdout)
    return 0
