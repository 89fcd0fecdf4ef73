"""`transferset exits`: FastBERT's early exits of a frozen model (students/compress/exits_train.py)."""
from __future__ import annotations

import argparse
import json

from students.compress.exits_train import train_exits
from transferset.app.cli import flags
from transferset.config import ExitsConfig
from transferset.fs.output import OVERWRITE_HELP
from transferset.models.loading import check_hub_model

EPILOG = """\
A small classifier ("branch") after every encoder layer but the last, each trained by KL to the model's
final distribution over the rows of a scored transfer set (labels are not needed); the model and its
classifier stay frozen. The teacher learns from the set's cached teacher_logits (no second scoring); a
transformer student from its own classifier. Then a row leaves at the first layer whose branch's
normalised entropy (entropy / log C) is below --speed:

  transferset exits --model runs/sst2/teacher --scored runs/sst2/scored --output runs/sst2/teacher-exits
  transferset evaluate --model runs/sst2/teacher-exits --data dev.tsv --speed 0.3
  transferset predict --model runs/sst2/teacher-exits --input a.tsv --output preds --speed 0.3

--speed 0 (the default) runs every layer: the model without exits. OUT/model is the model unchanged plus
exits.json and exits.safetensors; it loads as the model did (the exits are PyTorch only: `transferset
export` refuses it, since a row's depth is decided while it runs). OUT/metrics.json: each branch's agreement
with the targets on the training rows. BERT-like models (the MiniLM teacher and students copied from it).
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="the teacher (`transferset teacher` output) or a transformer "
                        "student (`transferset train` output, or its model/)")
    parser.add_argument("--scored", required=True, help="a scored transfer set (`transferset score` output); for the "
                        "teacher, the set it scored")
    parser.add_argument("--output", required=True, metavar="OUT", help="output directory: model/, metrics.json")
    parser.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    parser.add_argument("--no-progress", action="store_true", help="progress as a line every 30 s, never a bar")
    flags.add_arguments(parser, ExitsConfig, title="settings")


def run(args: argparse.Namespace, extra) -> int:
    cfg = flags.from_args(ExitsConfig, args)
    check_hub_model(args.model, what="--model")  # a hub name offline: one line, exit 2, nothing written
    metrics = train_exits(args.model, args.scored, args.output, cfg, overwrite=args.overwrite,
                          progress=False if args.no_progress else None)
    if "rank" in metrics:  # under torchrun / accelerate launch, only rank 0 writes and reports
        return 0
    summary = {k: metrics[k] for k in ("targets", "rows", "layers", "branch_agreement", "elapsed_s")}
    summary["output"] = args.output
    print(json.dumps(summary, indent=2))
    return 0
