"""`transferset augment`: the command line of the augment pipeline (pipelines/augment.py)."""
from __future__ import annotations

import argparse
import json
from typing import Sequence

from pipelines.augment import run_augment
from pipelines.runtime import beam_schemes, check_beam
from transferset.app.cli import flags
from transferset.app.cli.flags import add_runner_arguments
from transferset.augment import check_ops, needs
from transferset.augment.dedup import STAT_KEYS
from transferset.config import AugmentConfig, BeamConfig
from transferset.models.loading import check_model
from transferset.sources import check_hf_names

EPILOG = """examples:
  transferset augment --input ../shared/data/sst2/train.tsv --exclude ../shared/data/sst2/dev.tsv \\
      --output runs/sst2_transfer --limit 2000
  transferset augment --input train.csv --text-column review --recipe tinybert --mlm-model bert-base-uncased \\
      --output out/ --runner FnApiRunner --direct_num_workers 2"""

URL_SCHEMES = beam_schemes  # the CLI accepts URLs that Beam's filesystems open, besides fsspec's


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("inputs and output")
    # nargs="+": `--input A B` reads both files (stats.json counts each file's rows under "inputs")
    g.add_argument("--input", action="extend", nargs="+", required=True, metavar="PATH",
                   help="labeled input: .tsv/.csv/.jsonl/.parquet or hf:NAME[:CONFIG]:SPLIT (several, or repeated)")
    g.add_argument("--unlabeled", action="extend", nargs="+", default=[], metavar="PATH",
                   help="in-domain text without labels, augmented too (several, or repeated)")
    g.add_argument("--exclude", action="extend", nargs="+", default=[], metavar="PATH",
                   help="evaluation data (dev/test): rows whose text equals one of its sentences are dropped")
    g.add_argument("--output", required=True, metavar="OUT", help="output directory (local or gs://...)")
    flags.add_arguments(parser, AugmentConfig, title="settings (the run config's augment: section)")
    add_runner_arguments(parser)


def run(args, extra: Sequence[str]) -> int:
    cfg = flags.from_args(AugmentConfig, args)
    beam_cfg = flags.from_args(BeamConfig, args)
    check_beam(beam_cfg, extra, where="--")
    # Every name that must load, checked before the output folder is made (a hub name offline: one line).
    check_hf_names([(f"--{flag}", p) for flag in ("input", "unlabeled", "exclude") for p in getattr(args, flag)])
    check_ops(cfg)  # the op names first: `needs` looks them up
    if cfg.makes_variants and needs(cfg, "candidates"):
        check_model(cfg.mlm_model, what="--mlm-model", allow_pickle=cfg.allow_pickle,
                    trust_remote_code=cfg.trust_remote_code)
    stats = run_augment(cfg, inputs=args.input, output=args.output, unlabeled=args.unlabeled,
                        exclude=args.exclude, beam_cfg=beam_cfg, extra=extra,
                        overwrite=args.overwrite)
    print(json.dumps({k: stats[k] for k in STAT_KEYS}, indent=2))
    return 0
