"""What each lever of a time budget buys: on a newcomer's proxy (benchmarks/newcomer.py's), the teacher's selection
accuracy by epoch and the distilled student's by variants per row and by epoch, with the minutes each took
(figures, not a test; what transferset/app/planning/time_budget.py's order rests on).

Run from the repository root, alone on the machine (about an hour on 2 cores for the sst2 proxy):

    .venv/bin/python benchmarks/levers.py --proxy sst2 --out runs/levers

One run folder per proxy: the first run fine-tunes the teacher for `--teacher-epochs` epochs with no early stopping
(its metrics.json has the selection accuracy after each epoch) and trains both students at the first `--n-iter`;
each later run changes augment.n_iter only, so the teacher and the labels-only student are reused and the transfer
set, its scoring and the distilled student are made again. The distilled student trains `--student-epochs` epochs
(early stopping at its default patience); its metrics.json has the selection accuracy after each. Minutes are each
stage's own (its .stage.json), so a busy machine inflates them all alike; compare the ratios.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from newcomer import REPO, make_proxies  # noqa: E402


def stage_minutes(run_dir: str, folder: str) -> float | None:
    path = os.path.join(run_dir, folder, ".stage.json")
    if not os.path.exists(path):
        return None
    seconds = json.load(open(path, encoding="utf-8")).get("seconds")
    return None if seconds is None else seconds / 60


def history(run_dir: str, folder: str) -> list[dict]:
    metrics = json.load(open(os.path.join(run_dir, folder, "metrics.json"), encoding="utf-8"))
    return [{"epoch": h["epoch"], "selection": h.get("dev_accuracy"), "minutes": (h.get("seconds") or 0) / 60}
            for h in metrics.get("history", [])]


def one(files: tuple[str, ...], run_dir: str, n_iter: int, args, log: str) -> dict:
    cmd = [os.path.join(REPO, ".venv", "bin", "transferset"), "run", "--data", files[0], "--text-column", "review",
           "--label-column", "sentiment", "--test", files[1], *(["--dev", files[2]] if len(files) > 2 else []),
           f"run_dir={run_dir}",
           f"teacher.epochs={args.teacher_epochs}", "teacher.patience=null", f"augment.n_iter={n_iter}",
           f"students.distilled.epochs={args.student_epochs}", "compress.ship=false", "report.latency_rounds=1",
           "report.latency_rows=40"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    with open(log, "w", encoding="utf-8") as fh:
        fh.write(" ".join(cmd) + "\n" + done.stdout + done.stderr)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {done.stderr.strip().splitlines()[-1:]}")
    tested = json.load(open(os.path.join(run_dir, "test", "accuracy.json"), encoding="utf-8"))["models"]
    rows = json.load(open(os.path.join(run_dir, "scored", "stats.json"), encoding="utf-8")).get("output_rows")
    return {"n_iter": n_iter, "transfer_rows": rows,
            "minutes": {k: stage_minutes(run_dir, f) for k, f in
                        (("teacher", "teacher"), ("augment", "transfer"), ("score", "scored"),
                         ("labels_only", "students/labels_only"), ("distilled", "students/distilled"))},
            "teacher": history(run_dir, "teacher"), "distilled": history(run_dir, "students/distilled"),
            "labels_only": history(run_dir, "students/labels_only"),
            "test": {k: v["accuracy"] for k, v in tested.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--proxy", default="sst2", choices=("sst2", "long"))
    ap.add_argument("--out", default="runs/levers")
    ap.add_argument("--n-iter", default="1,2,4,8", help="variants per labeled row, comma-separated")
    ap.add_argument("--teacher-epochs", type=int, default=3)
    ap.add_argument("--student-epochs", type=int, default=5)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    files = make_proxies(args.out)[args.proxy]
    run_dir = os.path.join(args.out, args.proxy)
    print(f"load average before: {os.getloadavg()}", flush=True)
    results = []
    for n in (int(v) for v in args.n_iter.split(",")):
        r = one(files, run_dir, n, args, os.path.join(args.out, f"{args.proxy}-n{n}.log"))
        print(json.dumps(r), flush=True)
        results.append(r)
        with open(os.path.join(args.out, f"levers-{args.proxy}.json"), "w", encoding="utf-8") as fh:
            json.dump(results, fh, indent=2)
    print(f"load average after: {os.getloadavg()}")
    t = results[0]["teacher"]
    print("teacher selection by epoch: " + ", ".join(f"{h['epoch']}: {100 * h['selection']:.1f} "
                                                    f"({h['minutes']:.1f} min)" for h in t))
    print("| n_iter | rows | score min | distilled min/epoch | distilled selection by epoch | best sel | test |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        d = r["distilled"]
        best = max(d, key=lambda h: h["selection"])
        by_epoch = ", ".join(f"{100 * h['selection']:.1f}" for h in d)
        print(f"| {r['n_iter']} | {r['transfer_rows']} | {r['minutes']['score'] or 0:.1f} | "
              f"{sum(h['minutes'] for h in d) / max(1, len(d)):.1f} | {by_epoch} | "
              f"{100 * best['selection']:.1f} | {100 * r['test'].get('distilled', float('nan')):.1f} |")
    lo = results[0]["labels_only"]
    print(f"labels-only best selection {100 * max(h['selection'] for h in lo):.1f}, "
          f"test {100 * results[0]['test'].get('labels_only', float('nan')):.1f}")


if __name__ == "__main__":
    main()
