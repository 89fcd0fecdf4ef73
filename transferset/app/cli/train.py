"""`transferset train`: a student from the cached teacher outputs (the teacher never runs)."""
from __future__ import annotations

import argparse
import dataclasses
import json

from students.data.teacher_files import check_dir_setting, refuse_student_folder
from students.trainer import train
from transferset import fs
from transferset.app.cli import flags
from transferset.config import StudentConfig
from transferset.fs.output import OVERWRITE_HELP
from transferset.models.loading import check_hub_model
from transferset.runtime import typed
from transferset.sources import check_hf_names

EPILOG = """\
--config takes a YAML mapping of StudentConfig settings (transferset/config/; the same keys as an
entry of a run config's `students:` section), e.g. `preset: tinybert`, `losses:` for the losses it trains on
(e.g. losses: {kd: {weight: 1.0, temperature: 2.0}}; unset: ce and mse at 1.0) and `model:` for the
student's own settings (e.g. model: {shape: tang}, a BiLSTM's named shape; model: {hidden: 150, n_layer: 3}).
Each setting takes its value in one order (docs/configuration.md): default (the family's) < preset
< --config < flags < key=value.

example:
  transferset train --transfer runs/sst2/scored --dev ../shared/data/sst2/dev.tsv \\
      --output runs/sst2/bilstm --student bilstm --phases progressive --epochs 3
  transferset train --transfer runs/sst2/scored --dev ../shared/data/sst2/dev.tsv \\
      --output runs/sst2/tiny --config student.yaml optim.lr=5e-4 model.n_layer=2 losses.kd=2
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--transfer", required=True, help="scored transfer set directory (output of `transferset score`)")
    parser.add_argument("--dev", required=True, help="labeled dev data (TSV/CSV/JSONL/Parquet or a scored set) for early stopping and metrics")
    parser.add_argument("--output", required=True, help="run directory: model/, metrics.json, curves.png")
    parser.add_argument("--config", default=None, metavar="YAML", help="YAML file of student settings (see below)")
    parser.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    parser.add_argument("--no-progress", action="store_true", help="no progress bar: a line every 30 s instead")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="settings over --config and the flags, e.g. optim.lr=5e-4 engine.warmup=0.2 "
                             "model.hidden=150")
    flags.add_arguments(parser, StudentConfig, title="settings (StudentConfig; also keys of --config)")


def load_config(args: argparse.Namespace) -> StudentConfig:
    base = typed.read_yaml(args.config, "--config") if args.config else None
    cfg = flags.from_args(StudentConfig, args, base=base, where=args.config or "command line",
                          overrides=getattr(args, "overrides", ()))
    # Paths a --config YAML sets are normalised as the command line's are (file:// URLs, unknown schemes).
    cfg = dataclasses.replace(cfg, **{k: fs.normalize(getattr(cfg, k), k)
                                      for k in ("teacher", "tokenizer") if getattr(cfg, k)})
    for key in ("teacher", "tokenizer"):
        if getattr(cfg, key) and fs.is_remote(getattr(cfg, key)):  # a URL that cannot be a folder: a usage error
            check_dir_setting(getattr(cfg, key), f"--{key}" if hasattr(args, key) else f"{args.config}: {key}")
        refuse_student_folder(getattr(cfg, key), key)  # before the output folder is made
    return cfg


def run(args: argparse.Namespace, extra) -> int:
    cfg = load_config(args)
    # Every name that must load, checked before anything is written (a hub name offline: one line, exit 2).
    check_hf_names([("--dev", args.dev)])
    if isinstance(cfg.model.get("pretrained"), str):
        check_hub_model(cfg.model["pretrained"], what="model.pretrained")
    # train() owns --output (a remote one is trained into a local folder, then uploaded whole).
    metrics = train(cfg, args.transfer, args.dev, args.output, overwrite=args.overwrite,
                    progress=not args.no_progress)
    if "rank" in metrics:  # under torchrun / accelerate launch, only rank 0 writes and reports
        return 0
    summary = {k: metrics[k] for k in ("student", "dev_accuracy", "dev_majority_baseline",
                                        "teacher_agreement", "parameters", "latency_ms_per_example",
                                        "latency_conditions")}
    summary["phases"] = cfg.phases  # the phase plan (metrics.json: config.phases; its `phases`: each phase run)
    summary["output"] = args.output
    print(json.dumps(summary, indent=2))
    return 0
