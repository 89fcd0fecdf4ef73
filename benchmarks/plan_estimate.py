"""The plan's estimate against the run's own time, per stage (figures, not a test).

Run from the repository root (about 5-10 minutes on 2 busy CPU cores):

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/plan_estimate.py

Options: `--run-dir DIR` (default runs/plan_estimate, cleared first), `--config YAML` (default configs/demo.yaml)
and key=value overrides after the defaults below (a small real run: 1,000 labeled SST-2 rows, 1,000 unlabeled, a
500-row validation split, the packaged MiniLM teacher for 2 epochs, 2 variants per labeled row, each student 2
epochs). It prints the plan as `run` does (transferset/app/planning/estimate.py, rates from transferset/app/planning/calibrate.py),
runs the whole chain, and for each stage the estimate, the actual seconds (its folder's `.stage.json`) and
actual / estimate. The machine's load average is printed before and after: figures taken under load are noisy.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from transferset import fs  # noqa: E402
from transferset.app.planning.calibrate import measure_rates  # noqa: E402
from transferset.app.planning.estimate import count_rows, current, estimate, plan_lines  # noqa: E402
from transferset.app.run.runner import load_config, plan_stages, resolve_data, run_pipeline  # noqa: E402
from transferset.contract import schema  # noqa: E402

SMALL = ["validation.rows=500", "labeled_limit=1000", "unlabeled_rows=1000", "teacher.epochs=2", "augment.n_iter=2",
         "students.labels_only.epochs=2", "students.distilled.epochs=2", "report.latency_rounds=1"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-dir", default="runs/plan_estimate")
    ap.add_argument("--config", default="configs/demo.yaml")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    shutil.rmtree(args.run_dir, ignore_errors=True)
    cfg = load_config(args.config, [*SMALL, f"run_dir={args.run_dir}", *args.overrides])
    print(f"load average before: {os.getloadavg()}, cores: {os.cpu_count()}, "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}")
    files = resolve_data(cfg.data, cfg.test, cfg.dev)
    stages = plan_stages(cfg, files).stages
    reused = current(stages)
    t0 = time.time()
    rows = count_rows(cfg, files, fs.join(cfg.run_dir, "data"), False)
    rates = measure_rates(cfg, rows, {s.name for s in stages} - reused)
    estimates = estimate(cfg, stages, rows, rates, reused)
    print(f"counting and calibration: {time.time() - t0:.0f} s")
    print("\n".join(plan_lines(estimates, rates)))
    t0 = time.time()
    run_pipeline(cfg, log=lambda m: None)
    print(f"run: {time.time() - t0:.0f} s; load average after: {os.getloadavg()}")
    print(f"\n| stage | estimate s | actual s | actual / estimate |\n| --- | ---: | ---: | ---: |")
    for s, e in zip(stages, estimates):
        record = fs.join(s.folder, schema.STAGE_FILE) if s.folder else None
        actual = fs.read_json(record).get("seconds") if record and fs.exists(record) else None
        if e.seconds is None or actual is None:
            continue
        ratio = f"{actual / e.seconds:.2f}" if e.seconds else "-"
        print(f"| {s.name} | {e.seconds:.0f} | {actual:.0f} | {ratio} |")


if __name__ == "__main__":
    main()
