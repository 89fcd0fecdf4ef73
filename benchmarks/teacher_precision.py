"""The teacher's fine-tuning at the machine's limit: fp32 against bf16 autocast (teacher.engine.precision), on a
newcomer's proxy (benchmarks/newcomer.py's), seeds interleaved in one run (figures, not a test).

For each seed, `transferset teacher` fine-tunes the default MiniLM teacher on the proxy's train rows (the selection
split carved off as `run` carves it: 10 %, seed 0) once at fp32 and once at bf16, in alternating order (fp32 first
on even seeds). Printed per run: seconds per epoch, tokens trained per second (unpadded), the useful FLOP rate
(6 x per-token parameters x tokens per second: forward and backward of the encoder's matmuls) as a fraction of this
machine's fp32 matmul peak (benchmarks/score.py's, measured in the same run), the best selection accuracy and the
test accuracy of the kept checkpoint (the proxy's test file: no choice sees it). Then mean ± sd per precision and
the bf16 / fp32 ratios.

    .venv/bin/python benchmarks/teacher_precision.py --out runs/teacher_precision            # sst2, 3 seeds
    .venv/bin/python benchmarks/teacher_precision.py --proxy long --seeds 1 --epochs 1

Run it alone on the machine: the two precisions share it in turn, so a busy machine slows both, but unequally.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import random
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from newcomer import REPO, make_proxies  # noqa: E402
from score import matmul_peak, per_token_params  # noqa: E402

CLI = os.path.join(REPO, ".venv", "bin", "transferset")


def carve(train_csv: str, folder: str) -> tuple[str, str]:
    """train.csv and selection.csv: 10 % of the rows held out (seed 0), as `run --data` carves its selection split."""
    with open(train_csv, encoding="utf-8") as fh:
        rows = list(csv.reader(fh))
    head, body = rows[0], rows[1:]
    random.Random(0).shuffle(body)
    cut = len(body) // 10
    paths = os.path.join(folder, "train.csv"), os.path.join(folder, "selection.csv")
    for path, part in zip(paths, (body[cut:], body[:cut])):
        with open(path, "w", encoding="utf-8", newline="") as fh:
            csv.writer(fh).writerows([head, *part])
    return paths


def tokens(path: str) -> int:
    """Unpadded tokens of the file's texts at the teacher's tokenizer (max_length 128, as trained)."""
    from transferset.models import loading

    tok = loading.load_tokenizer(loading.resolve_model(loading.DEFAULT_MODEL))
    with open(path, encoding="utf-8") as fh:
        texts = [r[0] for r in list(csv.reader(fh))[1:]]
    return sum(len(ids) for ids in tok(texts, truncation=True, max_length=128)["input_ids"])


def one(split: tuple[str, str], test: str, out: str, precision: str, seed: int, epochs: int,
        lr: str = "") -> dict:
    """One fine-tuning (`lr`: the teacher's learning rate, "" its default) → its times and accuracies."""
    folder = os.path.join(out, f"teacher-{precision}{'-lr' + lr if lr else ''}-s{seed}")
    cmd = [CLI, "teacher", "--train", split[0], "--dev", split[1], "--output", folder, "--text-column", "review",
           "--label-column", "sentiment", "--precision", precision, "--seed", str(seed), "--epochs", str(epochs),
           "--patience", "null", "--overwrite", "--no-progress", *(["--lr", lr] if lr else [])]
    t0 = time.time()
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    wall = time.time() - t0
    metrics = json.load(open(os.path.join(folder, "metrics.json"), encoding="utf-8"))
    tested = subprocess.run([CLI, "evaluate", "--model", folder, "--data", test, "--text-column", "review",
                             "--label-column", "sentiment", "--json"], check=True, capture_output=True, text=True)
    history = metrics.get("history", [])
    seconds = [h["seconds"] for h in history if h.get("seconds")]
    return {"precision": precision, "lr": lr or "default", "seed": seed, "wall_s": wall, "epoch_s": statistics.mean(seconds),
            "selection": max(h["dev_accuracy"] for h in history),
            "test": json.loads(tested.stdout)["accuracy"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/teacher_precision")
    ap.add_argument("--proxy", default="sst2", choices=("sst2", "long"))
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    train_csv, test = make_proxies(args.out)[args.proxy][:2]
    split = carve(train_csv, args.out)
    import torch

    from transferset.models import loading

    work = 6 * per_token_params(loading.load_classifier(loading.resolve_model(loading.DEFAULT_MODEL),
                                                        label_names=("0", "1"))) * tokens(split[0])
    peak = matmul_peak("cpu")[0]
    print(f"threads {torch.get_num_threads()}, fp32 matmul peak {peak / 1e9:.1f} GFLOP/s, "
          f"load average {os.getloadavg()}", flush=True)
    runs = []
    for seed in range(args.seeds):
        for precision in (("fp32", "bf16") if seed % 2 == 0 else ("bf16", "fp32")):
            r = one(split, test, args.out, precision, seed, args.epochs)
            r["fraction_of_fp32_peak"] = work / r["epoch_s"] / peak
            print(json.dumps(r), flush=True)
            runs.append(r)
    print(f"load average after {os.getloadavg()}")
    summary = {}
    for precision in ("fp32", "bf16"):
        rs = [r for r in runs if r["precision"] == precision]
        summary[precision] = {k: (statistics.mean(r[k] for r in rs), statistics.pstdev(r[k] for r in rs))
                              for k in ("epoch_s", "fraction_of_fp32_peak", "selection", "test")}
        print(precision, "  ".join(f"{k} {m:.3f} ± {s:.3f}" for k, (m, s) in summary[precision].items()))
    print(f"bf16 / fp32: epoch time {summary['bf16']['epoch_s'][0] / summary['fp32']['epoch_s'][0]:.2f}, "
          f"selection {100 * (summary['bf16']['selection'][0] - summary['fp32']['selection'][0]):+.1f} points, "
          f"test {100 * (summary['bf16']['test'][0] - summary['fp32']['test'][0]):+.1f} points")
    json.dump(runs, open(os.path.join(args.out, f"runs-{args.proxy}.json"), "w"), indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
