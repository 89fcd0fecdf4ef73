"""`transferset evaluate`: the command line of students/evaluate.py."""
from __future__ import annotations

import argparse
import json

from students.evaluate import LENGTH_EDGES, check_edges, evaluate
from transferset.app.cli.flags import finite_float
from transferset.config import check_combine
from transferset.models.loading import check_hub_model
from transferset.runtime.errors import ConfigError
from transferset.sources import DEFAULT_LABEL_COLUMN, check_hf_names

EPILOG = """\
DATA is a labeled file (TSV/CSV/JSONL/Parquet) or a transferset Parquet set; when it holds teacher
columns (a scored set), the student's agreement with the teacher's labels is printed too.
Several --model: a teacher ensemble, its logits combined by --combine as `transferset score` does; its
accuracy is printed first, then each member's.
--by-length prints the figures per band of input length in words (default bands 0-9, 10-19, 20-29, 30+):
evaluate a student and its teacher on the same file to see where the student falls behind.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, action="append", metavar="MODEL",
                        help="output directory of `transferset train` (or its model/), or any Hugging Face "
                        "sequence-classifier directory (e.g. of `transferset teacher`); repeated: a teacher ensemble")
    parser.add_argument("--data", required=True, help="labeled data or a scored transfer set")
    parser.add_argument("--text-column", default=None, help="text column of a labeled file (default sentence, else text)")
    parser.add_argument("--label-column", default=DEFAULT_LABEL_COLUMN, help="label column of a labeled file")
    parser.add_argument("--text-b-column", default=None, help="second text column of a labeled file (sentence pairs)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--max-length", type=int, default=None,
                        help="tokens per row (default: a student's training max_length; for another Hugging Face "
                        "model its tokenizer's model_max_length, at most its position embeddings)")
    parser.add_argument("--combine", default="mean", type=_combine,
                        help="several --model: mean (their mean logits) | probs (their mean probabilities) | K "
                        "(model K alone, 0 = the first); as score's --combine")
    parser.add_argument("--speed", type=finite_float, default=None,
                        help="a model with early exits (`transferset exits`): a row leaves at the first layer whose "
                        "branch's normalised entropy is below this, from 0 (every layer) to 1; the mean layers "
                        "used are printed too")
    parser.add_argument("--by-length", nargs="?", const=LENGTH_EDGES, default=None, type=_edges,
                        metavar="EDGES", help="also the figures per band of input length in words; EDGES: the "
                        "bands' lower edges after 0, comma-separated (default when given alone: "
                        f"{','.join(map(str, LENGTH_EDGES))})")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def _combine(value: str) -> str:
    try:
        check_combine(value)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def _edges(value: str) -> tuple[int, ...]:
    # (argparse passes a string; `--by-length` alone takes const, LENGTH_EDGES, as it is)
    parts = [v.strip() for v in str(value).split(",")]
    try:
        if "" in parts and len(parts) > 1:  # `5,,10` is a typo, not the bands 5,10
            raise ValueError("an empty edge (two commas in a row, or one at an end); give whole numbers of words "
                             f"in increasing order, e.g. {','.join(map(str, LENGTH_EDGES))}")
        return check_edges([int(v) if v.isdigit() else -1 for v in parts])  # -1: refused, with the reason
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--by-length {value!r}: {exc}") from None


def run(args: argparse.Namespace, extra) -> int:
    # Every name that must load, checked before anything is written (a hub name offline: one line, exit 2).
    for m in args.model:
        check_hub_model(m, what="--model")
    check_hf_names([("--data", args.data)])
    model = args.model[0] if len(args.model) == 1 else args.model
    result = evaluate(model, args.data, text_column=args.text_column, label_column=args.label_column,
                      text_b_column=args.text_b_column, batch_size=args.batch_size, max_length=args.max_length,
                      combine=args.combine, speed=args.speed, by_length=args.by_length)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    what = f"ensemble of {len(args.model)} ({result['combine']}) " if "members" in result else ""
    print(f"{what}accuracy {result['accuracy']:.4f} ({result['labeled_rows']} labeled rows of {result['rows']})")
    if "mean_layers" in result:
        print(f"speed {result['speed']:g}: {result['mean_layers']:.2f} layers per row on average")
    if "teacher_agreement" in result:
        print(f"teacher agreement {result['teacher_agreement']:.4f} ({result['rows']} rows)")
    for k, m in enumerate(result.get("members", [])):
        print(f"  member {k}: accuracy {m['accuracy']:.4f}  {m['model']}")
    for band in result.get("by_length", []):
        acc = "-" if band["accuracy"] is None else f"{band['accuracy']:.4f}"
        agree = band.get("teacher_agreement")
        print(f"  {band['words']:>7} words: {band['rows']:>7} rows, accuracy {acc}"
              + ("" if "teacher_agreement" not in band else
                 f", teacher agreement {'-' if agree is None else f'{agree:.4f}'}"))
    return 0
