"""`transferset train`: a student from the cached teacher outputs (the teacher never runs)."""
from __future__ import annotations

import argparse
import json

from transferset.errors import UserError

EPILOG = """\
--config takes a YAML file of flat keys (any TrainConfig field: ce, mse, kd, repr, pkd, temperature,
tokens, embed_init, preset, teacher, tokenizer, max_length, ...) plus `model:` for the student's own
settings (e.g. model: {hidden: 150, n_layer: 3, init: first}). Flags given on the command line win.

example:
  transferset train --transfer runs/sst2/scored --dev ../shared/data/sst2/dev.tsv \\
      --output runs/sst2/bilstm --student bilstm --schedule progressive --epochs 3
"""

# CLI flags that override TrainConfig fields. Their argparse default is SUPPRESS: a flag not given
# leaves no attribute, so the YAML value (or the TrainConfig default) stands.
OVERRIDES = ("student", "schedule", "epochs", "lr", "batch_size", "patience", "seed", "threads", "max_length")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from students.schedules import SCHEDULES
    from students.trainer import FAMILIES

    parser.add_argument("--transfer", required=True, help="scored transfer set directory (output of `transferset score`)")
    parser.add_argument("--dev", required=True, help="labeled dev data (TSV/CSV/JSONL/Parquet or a scored set) for early stopping and metrics")
    parser.add_argument("--output", required=True, help="run directory: model/, metrics.json, curves.png")
    parser.add_argument("--student", choices=FAMILIES, default=argparse.SUPPRESS, help="student family (default bilstm)")
    parser.add_argument("--schedule", choices=SCHEDULES, default=argparse.SUPPRESS, help="training schedule (default joint)")
    parser.add_argument("--config", default=None, help="YAML file of training settings (see below)")
    parser.add_argument("--epochs", type=int, default=argparse.SUPPRESS, help="epochs per phase (default 5)")
    parser.add_argument("--lr", type=float, default=argparse.SUPPRESS, help="learning rate (default 2e-3 bilstm, 1e-4 transformer)")
    parser.add_argument("--batch-size", type=int, default=argparse.SUPPRESS, help="rows per step (default 64)")
    parser.add_argument("--patience", type=int, default=argparse.SUPPRESS, help="epochs without dev improvement before a phase stops (default 2)")
    parser.add_argument("--seed", type=int, default=argparse.SUPPRESS, help="random seed (default 0)")
    parser.add_argument("--threads", type=int, default=argparse.SUPPRESS, help="torch CPU threads")
    parser.add_argument("--max-length", type=int, default=argparse.SUPPRESS, help="tokens per row (default: the scored set's)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing OUTPUT/model")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def load_config(args: argparse.Namespace):
    from students.trainer import TrainConfig

    values: dict = {}
    if args.config:
        import yaml

        try:
            with open(args.config, encoding="utf-8") as fh:
                loaded = yaml.safe_load(fh) or {}
        except OSError as exc:
            raise UserError(f"--config {args.config}: {exc.strerror}") from exc
        except yaml.YAMLError as exc:
            raise UserError(f"--config {args.config}: not valid YAML: {exc}") from exc
        if not isinstance(loaded, dict):
            raise UserError(f"--config {args.config}: expected a mapping of settings, got {type(loaded).__name__}")
        values.update(loaded)
    for name in OVERRIDES:
        if hasattr(args, name):
            values[name] = getattr(args, name)
    try:
        return TrainConfig.from_dict(values, where=args.config or "settings")
    except TypeError as exc:
        raise UserError(f"--config {args.config}: {exc}") from exc


def run(args: argparse.Namespace, extra) -> int:
    from students.trainer import train

    cfg = load_config(args)
    metrics = train(cfg, args.transfer, args.dev, args.output, overwrite=args.overwrite,
                    progress=not args.no_progress)
    summary = {k: metrics[k] for k in ("student", "schedule", "dev_accuracy", "dev_majority_baseline",
                                        "teacher_agreement", "parameters", "latency_ms_per_example")}
    summary["output"] = args.output
    print(json.dumps(summary, indent=2))
    return 0
