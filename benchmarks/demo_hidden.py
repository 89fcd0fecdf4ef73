"""`make demo`'s models on a split no choice saw (figures, not a test): the demo's selection split chooses every
epoch and early stop, and its test split (SST-2's dev file) has chosen the demo's settings over many releases, so
neither says how the shipped student does on new text.

For each seed S, `transferset run --config configs/demo.yaml` with every seed set to S (the selection carve kept at
seed 0, so each run leaves out the same train rows); then a hidden split: ROWS of the SST-2 train sentences the run
left out (RUN/data/rest.jsonl), each of MIN_WORDS words or more and no phrase of a labeled, unlabeled or selection row
(SST-2's train file holds each sentence with its phrases), drawn with a fixed seed. The teacher, both students and the
chosen model are scored on it with `transferset evaluate`, beside their selection and test accuracy. Printed: a row
per seed, then mean ± sd (sample) over the seeds and each seed's distilled-minus-teacher gap. Choose on selection.

    .venv/bin/python benchmarks/demo_hidden.py --out runs/demo_hidden --seeds 3   # about 30 min on 2 cores

Each run folder is kept (a rerun reuses every stage). Run it alone on the machine if its wall times matter.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from newcomer import pct  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(REPO, ".venv", "bin", "transferset")
MODELS = (("teacher", "teacher"), ("labels_only", "students/labels_only"), ("distilled", "students/distilled"),
          ("chosen", "chosen"))


def run_demo(out: str, data: str, seed: int, overrides: list[str]) -> str:
    run_dir = os.path.join(out, f"s{seed}")
    seeds = [f"{k}={seed}" for k in ("teacher.seed", "augment.seed", "students.labels_only.seed",
                                     "students.distilled.seed")]
    cmd = [BIN, "run", "--config", os.path.join(REPO, "configs", "demo.yaml"), f"run_dir={run_dir}", f"data={data}",
           *seeds, *overrides]
    with open(run_dir + ".log", "w", encoding="utf-8") as log:
        subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=True)
    return run_dir


def hidden_split(run_dir: str, path: str, rows: int, min_words: int) -> int:
    """Write the hidden split as a TSV (sentence, label); → how many rows were eligible."""
    def texts(name: str) -> list[dict]:
        with open(os.path.join(run_dir, "data", name), encoding="utf-8") as fh:
            return [json.loads(line) for line in fh]

    seen = "\n".join(r["text"] for name in ("labeled.jsonl", "unlabeled.jsonl", "validation.jsonl")
                     for r in texts(name))
    eligible = [r for r in texts("rest.jsonl") if len(r["text"].split()) >= min_words and r["text"] not in seen]
    random.Random(7).shuffle(eligible)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("sentence\tlabel\n")
        fh.writelines(f"{r['text'].replace(chr(9), ' ')}\t{r['label']}\n" for r in eligible[:rows])
    return len(eligible)


def accuracy(model: str, data: str, *columns: str) -> float:
    done = subprocess.run([BIN, "evaluate", "--model", model, "--data", data, *columns, "--json"],
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout)["accuracy"]


def measure(run_dir: str, test: str, hidden: str) -> dict:
    rows = json.load(open(os.path.join(run_dir, "results.json"), encoding="utf-8"))["rows"]
    selection: dict = {}
    for r in rows:  # each model's row as trained, before its exports' ("teacher (ONNX)" after it), as newcomer.py reads
        selection.setdefault(r["name"].split(" (")[0].replace("student: ", ""), r.get("dev_accuracy"))
    selection["chosen"] = json.load(open(os.path.join(run_dir, "chosen.json"), encoding="utf-8"))["chosen"].get("selection")
    got = {}
    for key, sub in MODELS:
        model = os.path.join(run_dir, sub)
        got[key] = (selection.get(key), accuracy(model, test),
                    accuracy(model, hidden, "--text-column", "sentence", "--label-column", "label"))
    return got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/demo_hidden")
    ap.add_argument("--data", default=os.path.join(REPO, "..", "shared", "data", "sst2"))
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--rows", type=int, default=2000, help="rows of the hidden split")
    ap.add_argument("--min-words", type=int, default=10, help="the hidden split's shortest sentence, in words")
    ap.add_argument("--measure-only", action="store_true", help="score the run folders OUT/sS already there")
    ap.add_argument("overrides", nargs="*", help="KEY=VALUE settings for every run (a lever: teacher.patience=2)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    runs = [os.path.join(args.out, f"s{s}") if args.measure_only else run_demo(args.out, args.data, s, args.overrides)
            for s in seeds]
    hidden = os.path.join(args.out, "hidden.tsv")
    eligible = hidden_split(runs[0], hidden, args.rows, args.min_words)
    print(f"hidden split: {min(args.rows, eligible)} of {eligible} eligible rows → {hidden}")
    results = [measure(r, os.path.join(args.data, "dev.tsv"), hidden) for r in runs]
    print("| run | " + " | ".join(f"{k} sel / test / hidden" for k, _ in MODELS) + " |")
    print("|" + " --- |" * (len(MODELS) + 1))
    for run_dir, got in zip(runs, results):
        print(f"| {os.path.basename(run_dir)} | " + " | ".join(" / ".join(pct([v]) for v in got[k])
                                                                 for k, _ in MODELS) + " |")
    print("| mean ± sd | " + " | ".join(" / ".join(pct([g[k][i] for g in results]) for i in range(3))
                                        for k, _ in MODELS) + " |")
    for i, split in enumerate(("selection", "test", "hidden")):
        gaps = [g["distilled"][i] - g["teacher"][i] for g in results if None not in (g["distilled"][i], g["teacher"][i])]
        print(f"distilled − teacher on {split}: {pct(gaps)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
