"""`transferset prune`: the command line of students/compress/prune.py."""
from __future__ import annotations

import argparse
import json

from students.compress.prune import prune
from transferset.app.cli import flags
from transferset.config import PruneConfig
from transferset.fs.output import OVERWRITE_HELP
from transferset.models.loading import check_hub_model
from transferset.sources import check_hf_names

EPILOG = """\
Ranks the model's attention heads by importance on the selection split (Michel et al. 2019: the
gradient of the cross-entropy with respect to each head's gate, summed over the rows in absolute
value), removes the least important (--heads: a count or a fraction; every layer keeps one head),
then recovers by distillation from the scored set's teacher_logits, keeping the epoch that is best on
the selection split (the pruned model before recovery competes). --heads 0 removes none: the recovery
alone runs, the model distilled on its own cached logits over the transfer set (a born-again teacher).

OUT is the pruned model in the input's form (a Hugging Face directory for the teacher, a student
directory for a student) and prune.json (heads removed, importances, selection accuracies). score,
evaluate, predict and export take it; outside transferset, `import transferset.models.pruning;
transferset.models.pruning.register()` before AutoModelForSequenceClassification.from_pretrained(OUT).

examples:
  transferset prune --model runs/sst2/teacher --selection ../shared/data/sst2/dev.tsv \\
      --transfer runs/sst2/scored --output runs/sst2/teacher-pruned --heads 0.25 --epochs 2
  transferset prune --model runs/sst2/students/tinybert3 --selection runs/sst2/dev/scored \\
      --transfer runs/sst2/scored --output runs/sst2/tinybert3-pruned --heads 6
  transferset prune --model runs/sst2/teacher --selection runs/sst2/dev/scored \\
      --transfer runs/sst2/scored --output runs/sst2/teacher-born-again --heads 0 --max-steps 200
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="a BERT classifier: the teacher's directory, or a transformer "
                        "student (`transferset train` output or its model/)")
    parser.add_argument("--selection", required=True, help="the selection split (labeled TSV/CSV/JSONL/Parquet or a "
                        "scored set): heads are ranked on it and the recovery's best epoch is chosen on it")
    parser.add_argument("--transfer", default=None, help="scored transfer set whose teacher_logits the pruned "
                        "model is distilled towards (needed unless --epochs 0)")
    parser.add_argument("--output", required=True, metavar="OUT", help="the pruned model's directory")
    parser.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    parser.add_argument("--no-progress", action="store_true", help="no progress bar: a line every 30 s instead")
    flags.add_arguments(parser, PruneConfig, title="settings (PruneConfig)")


def run(args: argparse.Namespace, extra) -> int:
    cfg = flags.from_args(PruneConfig, args)
    # Every name that must load, checked before anything is written (a hub name offline: one line, exit 2).
    check_hub_model(args.model, what="--model")
    check_hf_names([("--selection", args.selection)])
    record = prune(cfg, args.model, args.selection, args.output, transfer_dir=args.transfer,
                   overwrite=args.overwrite, progress=not args.no_progress)
    if "rank" in record:  # under torchrun / accelerate launch, only rank 0 writes and reports
        return 0
    summary = {k: record[k] for k in ("removed", "heads", "parameters", "selection")}
    summary["output"] = args.output
    print(json.dumps(summary, indent=2))
    return 0
