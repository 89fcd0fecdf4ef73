"""A newcomer's path, measured: `transferset run --data FILE --budget-minutes M` on two proxies of a user's task
(figures, not a test).

Run from the repository root, alone on the machine (each run takes its budget; 3 seeds at 15 minutes, one at 30 and
one at the defaults for each proxy: about 4.5 hours on 2 cores):

    .venv/bin/python benchmarks/newcomer.py --out runs/newcomer
    .venv/bin/python benchmarks/newcomer.py --out runs/newcomer --proxy long --budgets 15 --seeds 1   # one cell

The proxies (made under OUT/data from ../shared/data/sst2, never copied into the repo):
- `sst2`: 6,000 SST-2 train rows (seeded) as a CSV with other column names (`review`, `sentiment`) and string
  labels (`negative`, `positive`); test: SST-2's dev file in the same shape (872 rows), which no choice sees.
- `long`: 6,000 rows, each 3 or 5 SST-2 train sentences joined (~50 tokens, as a news-topic text), each sentence's
  label drawn at random and the row's label their majority (three rows in four mix both labels: a review that weighs
  good against bad); test: 1,000 rows made the same way from SST-2's dev sentences (drawn with replacement: rows
  share sentences). (Sentences of one label joined, as first built, left nothing to learn: every model at 96-98.)
  SST-2's train file holds each sentence with its phrases, so rows drawn from it share text: a selection split
  carved from them scored the labels-only BiLSTM 5-7 points above its test accuracy (it memorises what it saw),
  and the teacher 0-4. So the long proxy's sentences are grouped by the longest train entry that holds them (a
  family), a tenth of the families (seeded) make a selection file of 600 rows that `run` gets as `--dev`, and the
  train rows come from the other families: no selection row shares a phrase with a train row.
Each run carves the sst2 proxy's selection split from its train file (the `--data` default); the test file is
scored once at the end. Budgets: `--budgets 15,30,default` (default: no budget). Seeds: the whole run's (teacher, augment, carve,
students). Each run folder is kept (a rerun of a cell resumes it); the table is printed again at the end, with
mean ± sd over seeds per proxy and budget.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import random
import re
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SST2 = os.path.join(os.path.dirname(REPO), "shared", "data", "sst2")
NAMES = ("negative", "positive")
ROWS = 6000


def read_tsv(path: str) -> list[tuple[str, int]]:
    with open(path, encoding="utf-8") as fh:
        rows = list(csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [(text, int(label)) for text, label in rows[1:]]


def write_csv(path: str, rows: list[tuple[str, int]]) -> str:
    with open(path, "w", encoding="utf-8", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(["review", "sentiment"])
        out.writerows((text, NAMES[label]) for text, label in rows)
    return path


def joined(sentences: list[tuple[str, int]], n: int, rng: random.Random, replace: bool) -> list[tuple[str, int]]:
    """n rows of 3 or 5 sentences joined, each sentence's label drawn at random, the row's label their majority
    (balanced: half the rows each way); without `replace` each sentence is used once at most."""
    by_label = {c: [t for t, label in sentences if label == c] for c in (0, 1)}
    for pool in by_label.values():
        rng.shuffle(pool)
    rows = []
    for i in range(n):
        label, k = i % 2, rng.choice((3, 5))
        labels = [rng.randint(0, 1) for _ in range(k)]
        while (2 * sum(labels) > k) != bool(label):
            labels = [rng.randint(0, 1) for _ in range(k)]
        part = []
        for c in labels:
            if replace:
                part.append(rng.choice(by_label[c]))
            else:
                part.append(by_label[c].pop())
        rows.append((" ".join(part), label))
    rng.shuffle(rows)
    return rows


def families(entries: list[tuple[str, int]], n: int = 6) -> list[int]:
    """Each entry's family: the index of the longest entry that holds it as a run of whole words (itself when none
    does), found through the entries' first `n` words; entries are of `n` words or more."""
    order = sorted(range(len(entries)), key=lambda i: -len(entries[i][0]))
    grams: dict[tuple[str, ...], list[int]] = {}
    family = [0] * len(entries)
    for i in order:
        words = entries[i][0].split()
        text = f" {entries[i][0]} "
        holder = next((j for j in grams.get(tuple(words[:n]), ()) if text in f" {entries[j][0]} "), None)
        family[i] = i if holder is None else family[holder]
        if holder is None:
            for k in range(len(words) - n + 1):
                grams.setdefault(tuple(words[k:k + n]), []).append(i)
    return family


def make_proxies(out: str) -> dict[str, tuple[str, ...]]:
    """{proxy: (train.csv, test.csv[, selection.csv])} under OUT/data, made once (seed 0)."""
    folder = os.path.join(out, "data")
    os.makedirs(folder, exist_ok=True)
    train, dev = read_tsv(os.path.join(SST2, "train.tsv")), read_tsv(os.path.join(SST2, "dev.tsv"))
    rng = random.Random(0)
    paths = {"sst2": (os.path.join(folder, "sst2_train.csv"), os.path.join(folder, "sst2_test.csv")),
             "long": tuple(os.path.join(folder, f"long_apart_{part}.csv") for part in ("train", "test", "selection"))}
    if not all(os.path.exists(p) for pair in paths.values() for p in pair):
        write_csv(paths["sst2"][0], rng.sample(train, ROWS))
        write_csv(paths["sst2"][1], dev)
        # whole sentences only (SST-2's train file also holds their phrases): 6 words or more, in families apart
        sentences = [(t, label) for t, label in train if len(t.split()) >= 6]
        family = families(sentences)
        held = set(rng.sample(sorted(set(family)), len(set(family)) // 10))
        write_csv(paths["long"][0], joined([s for s, f in zip(sentences, family) if f not in held], ROWS, rng,
                                           replace=False))
        write_csv(paths["long"][1], joined(dev, 1000, rng, replace=True))
        write_csv(paths["long"][2], joined([s for s, f in zip(sentences, family) if f in held], ROWS // 10, rng,
                                           replace=False))
    return paths


def run_one(proxy: str, files: tuple[str, ...], budget: str, seed: int, out: str) -> dict:
    run_dir = os.path.join(out, f"{proxy}-{budget}-s{seed}")
    seeds = [f"{k}={seed}" for k in ("teacher.seed", "augment.seed", *(("validation.seed",) if len(files) < 3 else ()),
                                     "students.labels_only.seed", "students.distilled.seed")]
    cmd = [os.path.join(REPO, ".venv", "bin", "transferset"), "run", "--data", files[0], "--text-column", "review",
           "--label-column", "sentiment", "--test", files[1], *(["--dev", files[2]] if len(files) > 2 else []),
           *(["--budget-minutes", budget] if budget != "default" else []), f"run_dir={run_dir}", *seeds]
    t0 = time.time()
    done = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.time() - t0
    with open(os.path.join(out, f"{proxy}-{budget}-s{seed}.log"), "w", encoding="utf-8") as fh:
        fh.write(" ".join(cmd) + "\n" + done.stdout + done.stderr)
    if done.returncode != 0:
        return {"proxy": proxy, "budget": budget, "seed": seed, "failed": done.stderr.strip().splitlines()[-1:]}
    plan = re.findall(r"total\s+([\d.]+) min", done.stderr)
    results = json.load(open(os.path.join(run_dir, "results.json"), encoding="utf-8"))
    rows: dict = {}
    for r in results["rows"]:  # each model's row as trained, before its exports' ("teacher (int8, ONNX)" after it)
        rows.setdefault(r["name"].split(" (")[0], r)
    chosen = json.load(open(os.path.join(run_dir, "chosen.json"), encoding="utf-8"))["chosen"]
    return {"proxy": proxy, "budget": budget, "seed": seed, "wall_min": wall / 60,
            "plan_min": float(plan[-1]) if plan else None,
            **{f"{k}_{split}": rows[name].get(f"{split}_accuracy")
               for k, name in (("teacher", "teacher"), ("labels_only", "student: labels_only"),
                               ("distilled", "student: distilled"))
               for split in ("dev", "test") if name in rows},
            "chosen": chosen["name"], "chosen_test": chosen["test"], "chosen_speedup": chosen["speedup"],
            "chosen_meets": chosen["meets"]}


def pct(values: list) -> str:
    values = [100 * v for v in values if v is not None]
    if not values:
        return "-"
    return f"{values[0]:.1f}" if len(values) == 1 else f"{statistics.mean(values):.1f} ± {statistics.stdev(values):.1f}"


def table(results: list[dict]) -> str:
    cols = ["teacher", "labels_only", "distilled"]
    head = ("| proxy | budget | seeds | wall min | plan min | " + " | ".join(f"{c} sel / test" for c in cols)
            + " | chosen (test, speed-up b1) |")
    lines = [head, "|" + " --- |" * (head.count("|") - 1)]
    for key in dict.fromkeys((r["proxy"], r["budget"]) for r in results):
        rs = [r for r in results if (r["proxy"], r["budget"]) == key and "failed" not in r]
        if not rs:
            lines.append(f"| {key[0]} | {key[1]} | failed | | | | | | |")
            continue
        accs = " | ".join(f"{pct([r.get(f'{c}_dev') for r in rs])} / {pct([r.get(f'{c}_test') for r in rs])}"
                          for c in cols)
        chosen = "; ".join(f"{r['chosen']} ({pct([r['chosen_test']])}, {r['chosen_speedup'] or 0:.1f}x"
                           f"{'' if r['chosen_meets'] else ', misses the target'})" for r in rs)
        walls = [r["wall_min"] for r in rs]
        plans = [r["plan_min"] for r in rs if r["plan_min"] is not None]
        lines.append(f"| {key[0]} | {key[1]} | {len(rs)} | {statistics.mean(walls):.1f} | "
                     f"{statistics.mean(plans) if plans else float('nan'):.1f} | {accs} | {chosen} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/newcomer")
    ap.add_argument("--proxy", default="sst2,long", help="sst2, long or both (comma-separated)")
    ap.add_argument("--budgets", default="15,30,default", help="minutes, comma-separated; default: no budget")
    ap.add_argument("--seeds", type=int, default=3, help="seeds at the first budget (1 at the others)")
    ap.add_argument("--first-seed", type=int, default=0, help="the seeds are first-seed, first-seed + 1, ...")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    proxies = make_proxies(args.out)
    budgets = args.budgets.split(",")
    print(f"load average before: {os.getloadavg()}, cores: {os.cpu_count()}", flush=True)
    results = []
    for proxy in args.proxy.split(","):
        for i, budget in enumerate(budgets):
            for seed in range(args.first_seed, args.first_seed + (args.seeds if i == 0 else 1)):
                r = run_one(proxy, proxies[proxy], budget, seed, args.out)
                print(json.dumps(r), flush=True)
                results.append(r)
    print(f"load average after: {os.getloadavg()}")
    with open(os.path.join(args.out, f"newcomer-{args.proxy}-{args.budgets}-{args.first_seed}.json".replace(",", "_")),
              "w", encoding="utf-8") as fh:
        json.dump(results, fh, indent=2)
    print(table(results))


if __name__ == "__main__":
    sys.exit(main())
