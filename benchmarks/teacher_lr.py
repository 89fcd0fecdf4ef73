"""The teacher's learning rate for a budget's short fine-tuning, on a newcomer's proxy (benchmarks/newcomer.py's):
does a higher peak rate buy a better teacher in the one or two epochs a 15-minute budget leaves it (figures, not a
test)? A budget that leaves the teacher no better than the labels-only student on selection leaves distillation
nothing to pass on (docs/results.md, "Where should a budget's minutes go?").

For each seed, `transferset teacher` fine-tunes the default MiniLM teacher on the proxy's train rows (selection: the
long proxy's own file, sst2's carved as benchmarks/teacher_precision.py carves it) once per learning rate, in an order that rotates with the
seed, at the precision `run` uses (auto). Printed per run: seconds per epoch, the best selection accuracy and the
test accuracy of the kept checkpoint (no choice sees it); then mean ± sd per rate. Choose on selection.

    .venv/bin/python benchmarks/teacher_lr.py --proxy long --lrs 5e-5,1e-4,2e-4 --seeds 2 --epochs 1

Run it alone on the machine.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from newcomer import make_proxies  # noqa: E402
from teacher_precision import carve, one  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/teacher_lr")
    ap.add_argument("--proxy", default="long", choices=("sst2", "long"))
    ap.add_argument("--lrs", default="5e-5,1e-4,2e-4", help="peak learning rates, comma-separated")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--first-seed", type=int, default=0)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    files = make_proxies(args.out)[args.proxy]
    test = files[1]
    split = (files[0], files[2]) if len(files) > 2 else carve(files[0], args.out)  # long: its selection file
    lrs = args.lrs.split(",")
    print(f"load average {os.getloadavg()}", flush=True)
    runs = []
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        for lr in lrs[seed % len(lrs):] + lrs[:seed % len(lrs)]:
            r = one(split, test, args.out, "auto", seed, args.epochs, lr)
            print(json.dumps(r), flush=True)
            runs.append(r)
    print(f"load average after {os.getloadavg()}")
    for lr in lrs:
        rs = [r for r in runs if r["lr"] == lr]
        print(f"lr {lr}: " + "  ".join(
            f"{k} {statistics.mean(r[k] for r in rs):.3f} ± {statistics.pstdev(r[k] for r in rs):.3f}"
            for k in ("epoch_s", "selection", "test")))
    json.dump(runs, open(os.path.join(args.out, f"runs-{args.proxy}-{args.epochs}ep-s{args.first_seed}.json"), "w"), indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
