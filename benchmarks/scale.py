"""Benchmark: the chain (augment → score → train) at growing row counts: wall time, rows/s, peak memory.

    .venv/bin/python benchmarks/scale.py                                  # 20k, 100k, 300k, 1M rows; 1 and 2 workers
    .venv/bin/python benchmarks/scale.py --rows 20000,100000 --workers 1 --stages augment,score
    .venv/bin/python benchmarks/scale.py --teacher runs/demo/teacher      # a fine-tuned teacher instead of the stand-in

Input: the first M sentences of SST-2 train as labeled text, each with `--n-iter` tang variants
(default 20, Tang et al.'s), M = rows / ((1 + n_iter) × keep) (at most the 67,349 of the file; `--keep`:
the share left after dedup, ~0.72 on SST-2), so every size has the same mix of originals and variants
and the row count grows through the sentences, as it does in use. All of SST-2 train × 20 gives
about a million rows, Tang et al.'s transfer set.
Each size runs every stage as the real command (`transferset augment|score|train`) in a
subprocess, from the previous stage's output at that size:

- augment with 1 and 2 local workers (FnApiRunner, `--workers`), the leak guard on SST-2 dev;
- score the 1-worker transfer set with 1 and 2 workers;
- train one epoch of Tang et al.'s BiLSTM (`model.shape=tang`, 1 torch thread) on the 1-worker scored set.

Peak memory is the peak of the summed resident set of the command's whole process tree (the
command and every Beam worker it starts), sampled every 0.2 s with psutil; shared pages of forked
workers count once per process, so it is an upper bound. Rows/s is rows out of the stage (augment:
rows written after dedup; score: rows scored; train: rows of the epoch) over the command's wall
time, start-up included. The table compares each size with the smallest (throughput) and with the
second smallest (memory, the 100k-row baseline).

Without `--teacher`, the packaged MiniLM with a seeded, untrained 2-class head stands in (scoring
costs the same whatever the weights); `--teacher-layers K` keeps its first K layers to make scoring
at 1M rows affordable on 2 cores (scoring time is about linear in the layers; say so when quoting).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
SST2 = ROOT.parent / "shared" / "data" / "sst2"
SST2_TRAIN_ROWS = 67349
STAGES = ("augment", "score", "train")


def tree_rss(root: psutil.Process) -> int:
    """Summed RSS in bytes of `root` and all its descendants (0 when it has just exited)."""
    try:
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass  # a worker that just exited
    return total


def peak_rss(cmd: list[str], log: Path, env: dict) -> tuple[float, int, int]:
    """Run `cmd`; return (wall seconds, peak summed RSS of its process tree in bytes, exit status)."""
    t0 = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        root = psutil.Process(proc.pid)
        peak = 0
        while proc.poll() is None:
            peak = max(peak, tree_rss(root))
            time.sleep(0.2)
    return time.perf_counter() - t0, peak, proc.returncode


def stand_in_teacher(directory: Path, layers: int) -> str:
    """benchmarks/score.py's MiniLM stand-in cut to `layers` layers, made once per output folder."""
    from score import make_teacher  # benchmarks/score.py: this script's folder is on sys.path

    if (directory / "config.json").exists():
        return str(directory)
    return make_teacher(str(directory), layers)


def stats_rows(directory: Path, key: str) -> int:
    return int(json.loads((directory / "stats.json").read_text())[key])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="20000,100000,300000,1000000", help="target transfer-set sizes")
    ap.add_argument("--workers", default="1,2", help="local Beam workers for augment and score")
    ap.add_argument("--stages", default=",".join(STAGES))
    ap.add_argument("--n-iter", type=int, default=20, help="tang variants per sentence (Tang et al.: 20)")
    ap.add_argument("--keep", type=float, default=0.72,
                    help="share of the generated rows left after dedup, to size the input (SST-2 tang: ~0.72)")
    ap.add_argument("--teacher", default=None, help="teacher directory (default: the MiniLM stand-in)")
    ap.add_argument("--teacher-layers", type=int, default=6, help="layers of the MiniLM stand-in")
    ap.add_argument("--train-epochs", type=int, default=1)
    ap.add_argument("--out", default="runs/scale")
    ap.add_argument("--json", default=None, help="also write the figures here")
    args = ap.parse_args(argv)

    sizes = [int(r) for r in args.rows.split(",")]
    workers = [int(w) for w in args.workers.split(",")]
    stages = args.stages.split(",")
    unknown = set(stages) - set(STAGES)
    if unknown:
        ap.error(f"--stages: unknown {sorted(unknown)}; choose from {', '.join(STAGES)}")
    out = (ROOT / args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    teacher = args.teacher or stand_in_teacher(out / f"teacher_l{args.teacher_layers}", args.teacher_layers)
    exe = [sys.executable, "-c", "from transferset.app.cli import main; raise SystemExit(main())"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    results = []

    def record(n, stage, w, directory, cmd, rows_key=None, rows=None):
        log = directory.with_suffix(".log")
        wall, peak, rc = peak_rss(cmd, log, env)
        if rc != 0:
            print(f"{stage} at {n:,} rows failed (exit {rc}); see {log}", file=sys.stderr)
            raise SystemExit(1)
        rows = rows if rows is not None else stats_rows(directory, rows_key)
        r = {"target": n, "stage": stage, "workers": w, "rows": rows, "wall_s": round(wall, 1),
             "rows_per_s": round(rows / wall, 1), "peak_rss_mb": round(peak / 2**20)}
        results.append(r)
        print(f"{n:>9,} {stage:<8} w{w}: {rows:>9,} rows {wall:8.1f} s {rows / wall:8.0f} rows/s "
              f"peak {peak / 2**20:6.0f} MB", flush=True)

    for n in sizes:
        m = min(SST2_TRAIN_ROWS, math.ceil(n / ((1 + args.n_iter) * args.keep)))
        base = out / f"rows{n}"
        base.mkdir(exist_ok=True)
        if "augment" in stages:
            for w in workers:
                d = base / f"augment_w{w}"
                record(n, "augment", w, d, exe + [
                    "augment", "--input", str(SST2 / "train.tsv"), "--limit", str(m), "--n-iter", str(args.n_iter),
                    "--exclude", str(SST2 / "dev.tsv"), "--output", str(d), "--workers", str(w), "--overwrite"],
                    rows_key="output_rows")
        if "score" in stages:
            for w in workers:
                d = base / f"score_w{w}"
                record(n, "score", w, d, exe + [
                    "score", "--input", str(base / "augment_w1"), "--teacher", teacher, "--output", str(d),
                    "--workers", str(w), "--overwrite"], rows_key="scored")
        if "train" in stages:
            d = base / "train"
            scored = base / "score_w1"
            rows = stats_rows(scored, "scored") * args.train_epochs
            record(n, "train", 1, d, exe + [
                "train", "--transfer", str(scored), "--dev", str(SST2 / "dev.tsv"), "--output", str(d),
                "--epochs", str(args.train_epochs), "--threads", "1", "--overwrite", "--no-progress",
                "model.shape=tang"], rows=rows)

    print("\n| rows (target) | stage | workers | rows | wall s | rows/s | peak RSS MB | rows/s vs smallest "
          "| peak vs 100k |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        same = [x for x in results if x["stage"] == r["stage"] and x["workers"] == r["workers"]]
        first = same[0]
        ref = next((x for x in same if x["target"] == 100000), first)
        print(f"| {r['target']:,} | {r['stage']} | {r['workers']} | {r['rows']:,} | {r['wall_s']} | "
              f"{r['rows_per_s']:,.0f} | {r['peak_rss_mb']:,} | {r['rows_per_s'] / first['rows_per_s']:.2f}× | "
              f"{r['peak_rss_mb'] / ref['peak_rss_mb']:.2f}× |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
