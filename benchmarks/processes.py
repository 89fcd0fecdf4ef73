"""Benchmark: 2 processes × 1 thread against 1 process × 2 threads, for the teacher and a student.

    .venv/bin/python benchmarks/processes.py --scored runs/demo/scored --dev runs/demo/dev/scored
    .venv/bin/python benchmarks/processes.py --scored S --dev D --rounds 3 --teacher-rows 960 --student-epochs 1

Each round runs, as the real commands in subprocesses and in alternating order (a quiet or busy spell then
favours neither):
- the teacher: `transferset teacher` fine-tuning the packaged MiniLM (or --model) on the first
  --teacher-rows SST-2 train rows for one epoch, selection on --teacher-dev rows of SST-2 dev;
- the student: `transferset train ... model.shape=tang` on the scored set for --student-epochs epochs;
each once as one process with 2 torch threads and once under `torchrun --nproc_per_node 2` with 1 thread per
process (gloo; each rank trains on its own rows, rank 0 evaluates and writes).

Figures: the student's `train_rows_per_second` from its metrics.json (training only: the per-epoch
evaluation on the selection split is excluded) and each command's wall time; for the teacher, rows trained
over the command's wall time (model load and the selection evaluation included: say so when quoting). The
ratio is 2 × 1 over 1 × 2 (> 1: the processes are faster). Run it alone: other processes on the cores skew
every figure, the two layouts differently.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SST2 = ROOT.parent / "shared" / "data" / "sst2"
LAYOUTS = ("1x2", "2x1")


def command(layout: str, args: list[str]) -> tuple[list[str], dict]:
    """The command line and environment of one layout."""
    env = {**os.environ, "OMP_NUM_THREADS": "2" if layout == "1x2" else "1"}
    if layout == "1x2":
        return [sys.executable, "-m", "transferset.app.cli", *args], env
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    return [torchrun, "--nproc_per_node", "2", "--master_port", "29533", "-m", "transferset.app.cli", *args], env


def timed(cmd: list[str], env: dict) -> float:
    started = time.perf_counter()
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return time.perf_counter() - started


def head(src: Path, dst: Path, rows: int) -> str:
    with open(src, encoding="utf-8") as fh:
        lines = [next(fh) for _ in range(rows + 1)]
    dst.write_text("".join(lines), encoding="utf-8")
    return str(dst)


def teacher_round(layout: str, args, work: Path, train: str, dev: str) -> dict:
    out = work / f"teacher-{layout}"
    cmd, env = command(layout, ["teacher", "--model", args.model, "--train", train, "--dev", dev, "--output",
                                str(out), "--overwrite", "--epochs", "1", "--no-progress"])
    seconds = timed(cmd, env)
    rows = json.loads((out / "metrics.json").read_text())["train_rows"]
    return {"seconds": seconds, "rows_per_second": rows / seconds}


def student_round(layout: str, args, work: Path) -> dict:
    out = work / f"student-{layout}"
    cmd, env = command(layout, ["train", "--transfer", args.scored, "--dev", args.dev, "--output", str(out),
                                "--overwrite", "--epochs", str(args.student_epochs),
                                "--threads", "2" if layout == "1x2" else "1", "--latency-examples", "16",
                                "--no-progress", *(["--teacher", args.set_teacher] if args.set_teacher else []),
                                "model.shape=tang"])
    seconds = timed(cmd, env)
    metrics = json.loads((out / "metrics.json").read_text())
    return {"seconds": seconds, "rows_per_second": metrics["train_rows_per_second"]}


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):,.1f} (min {min(values):,.1f}, max {max(values):,.1f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scored", required=True, help="a scored transfer set (e.g. runs/demo/scored)")
    ap.add_argument("--dev", required=True, help="the student's selection split (e.g. runs/demo/dev/scored)")
    ap.add_argument("--model", default="sentence-transformers/all-MiniLM-L6-v2", help="the teacher's base model")
    ap.add_argument("--teacher-rows", type=int, default=960, help="SST-2 train rows the teacher trains on")
    ap.add_argument("--teacher-dev", type=int, default=200, help="SST-2 dev rows for the teacher's selection")
    ap.add_argument("--set-teacher", default=None,
                    help="the scored set's teacher folder, for its tokenizer (default: where the set records it)")
    ap.add_argument("--student-epochs", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--output", default=None, help="also write the figures to this JSON file")
    args = ap.parse_args()
    figures = {f"{what}/{layout}": [] for what in ("teacher", "student") for layout in LAYOUTS}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        train = head(SST2 / "train.tsv", work / "train.tsv", args.teacher_rows)
        dev = head(SST2 / "dev.tsv", work / "dev.tsv", args.teacher_dev)
        for r in range(args.rounds):
            order = LAYOUTS if r % 2 == 0 else LAYOUTS[::-1]
            for layout in order:
                figures[f"teacher/{layout}"].append(teacher_round(layout, args, work, train, dev))
                figures[f"student/{layout}"].append(student_round(layout, args, work))
                print(f"round {r + 1} {layout}: teacher {figures[f'teacher/{layout}'][-1]}, "
                      f"student {figures[f'student/{layout}'][-1]}", flush=True)
    print(f"\n{os.cpu_count()} CPUs, {args.rounds} rounds; rows/s, median (min, max)")
    result = {}
    for what in ("teacher", "student"):
        rates = {layout: [f["rows_per_second"] for f in figures[f"{what}/{layout}"]] for layout in LAYOUTS}
        ratio = statistics.median(rates["2x1"]) / statistics.median(rates["1x2"])
        result[what] = {"rows_per_second": rates, "ratio_2x1_over_1x2": ratio}
        print(f"{what:8s} 1 process x 2 threads {summary(rates['1x2'])}   2 processes x 1 thread "
              f"{summary(rates['2x1'])}   ratio {ratio:.2f}")
    if args.output:
        Path(args.output).write_text(json.dumps({"figures": figures, "result": result}, indent=2))


if __name__ == "__main__":
    main()
