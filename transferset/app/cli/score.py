"""`transferset score`: the command line of the score pipeline (pipelines/score.py)."""
from __future__ import annotations

import argparse
import json
import time
from typing import Sequence

from pipelines.runtime import check_beam
from pipelines.score import run_score
from transferset.app.cli import flags
from transferset.app.cli.flags import add_runner_arguments
from transferset.config import BeamConfig, ScoreConfig
from transferset.models.loading import check_hub_model

EPILOG = (
    "Example:\n"
    "  transferset score --input runs/transfer --teacher runs/teacher --output runs/scored \\\n"
    "      --runner FnApiRunner --direct_num_workers 2\n\n"
    "Writes zstd Parquet under OUT/data/ (the input columns plus teacher_label, teacher_logits and\n"
    "teacher_hidden), rejects under OUT/rejects/, then OUT/stats.json and OUT/_COMPLETE.\n"
    "After an interrupted run, rerun the same command with --resume: only ids not yet written are scored.\n\n"
    "A teacher ensemble: give --teacher several times (--teacher A --teacher B ...). Each teacher\n"
    "scores every row once; teacher_logits_0, teacher_logits_1... keep each one's logits, teacher_logits their\n"
    "combination (--combine mean | probs | K) and the metadata names each teacher."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", required=True,
                        help="transfer set directory or URL (the output of `transferset augment`)")
    parser.add_argument("--teacher", required=True, action="append", metavar="TEACHER",
                        help="fine-tuned teacher directory (`transferset teacher` output or any save_pretrained dir); "
                             "a gs:// (any fsspec) URL is copied once to a local cache (TRANSFERSET_CACHE). "
                             "Repeated (--teacher A --teacher B ...): an ensemble, combined by --combine")
    parser.add_argument("--output", required=True, help="output directory for the scored transfer set")
    parser.add_argument("--resume", action="store_true", help="keep OUT/data and score only the ids not in it")
    flags.add_arguments(parser, ScoreConfig, title="settings (the run config's score: section)")
    add_runner_arguments(parser)


def run(args: argparse.Namespace, extra: Sequence[str]) -> int:
    cfg = flags.from_args(ScoreConfig, args)
    beam_cfg = flags.from_args(BeamConfig, args)
    check_beam(beam_cfg, extra, where="--")
    for t in args.teacher:  # a hub name offline: one line, before the output folder is made
        check_hub_model(t, what="--teacher")
    started = time.time()
    teacher = args.teacher[0] if len(args.teacher) == 1 else args.teacher
    stats = run_score(cfg, input=args.input, teacher=teacher, output=args.output,
                      beam_cfg=beam_cfg, extra=extra, resume=args.resume, overwrite=args.overwrite)
    summary = {k: stats.get(k) for k in ("input_rows", "scored", "scored_this_run", "already_scored", "rejected")}
    summary["output"] = args.output
    summary["elapsed_s"] = round(time.time() - started, 1)
    print(json.dumps(summary, indent=2))
    return 0
