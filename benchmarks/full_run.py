"""A whole `transferset run`, stage by stage: wall time and peak resident memory of each stage.

    .venv/bin/python benchmarks/full_run.py --config configs/sst2_tang.yaml [key=value ...]

Runs `transferset run --config YAML key=value ...` as it is, samples the summed RSS of its whole
process tree (the run and every Beam worker it starts) every 0.5 s into RUN_DIR/memory.csv, and when
the run ends reads each stage's `.stage.json` (its wall seconds, written when the stage ends) to cut
the samples into stages: per stage, the wall time and the peak RSS inside its window. Then it prints the
test accuracy of every model (RUN_DIR/test/accuracy.json). A stage reused from an earlier run (its
`.stage.json` older than this run) is left out of the table. The figures are those of the machine as it was: run it alone.
"""
from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scale import tree_rss  # noqa: E402  benchmarks/scale.py: this script's folder is on sys.path
from transferset.app.run.runner import STAGE_FILE, load_config  # noqa: E402
from transferset.app.stages.heldout import TEST_RESULTS_FILE  # noqa: E402


def stage_windows(run_dir: Path, since: float) -> list[tuple[str, float, float]]:
    """(stage folder relative to run_dir, start, end) for every stage that ran after `since`."""
    out = []
    for meta in run_dir.rglob(STAGE_FILE):
        end = meta.stat().st_mtime
        record = json.loads(meta.read_text())
        if end < since or "seconds" not in record:  # no seconds: a stage that began and did not finish
            continue
        seconds = record["seconds"]
        out.append((str(meta.parent.relative_to(run_dir)) or ".", end - seconds, end))
    return sorted(out, key=lambda w: w[1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True)
    ap.add_argument("--interval", type=float, default=0.5, help="seconds between memory samples")
    ap.add_argument("overrides", nargs="*", metavar="key=value")
    args = ap.parse_args(argv)
    cfg = load_config(args.config, args.overrides)
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    cmd = [str(Path(sys.executable).parent / "transferset"), "run", "--config", args.config, *args.overrides]
    print("$", " ".join(cmd), flush=True)
    started = time.time()
    samples: list[tuple[float, int]] = []
    with open(run_dir / "memory.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["unix_time", "rss_bytes"])
        proc = subprocess.Popen(cmd)
        root = psutil.Process(proc.pid)
        while proc.poll() is None:
            s = (time.time(), tree_rss(root))
            samples.append(s)
            w.writerow([f"{s[0]:.1f}", s[1]])
            f.flush()
            time.sleep(args.interval)
    wall = time.time() - started
    print(f"\nrun exit {proc.returncode}, {wall:.0f} s, peak {max((r for _, r in samples), default=0) / 2**20:,.0f} MB")
    print("| stage | wall (s) | peak RSS (MB) |\n| --- | --- | --- |")
    for name, t0, t1 in stage_windows(run_dir, started):
        peak = max((r for t, r in samples if t0 <= t <= t1), default=0)
        print(f"| {name} | {t1 - t0:,.0f} | {peak / 2**20:,.0f} |")
    test = run_dir / "test" / TEST_RESULTS_FILE
    if test.exists():
        print("\ntest accuracy:", json.dumps(json.loads(test.read_text()), indent=1))
    return proc.returncode


if __name__ == "__main__":
    raise SystemExit(main())
