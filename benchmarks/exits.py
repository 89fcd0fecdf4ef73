"""FastBERT's speed / accuracy curve: a model with early exits (`transferset exits`) at thresholds 0, 0.1, ...,
1 against the same model without exits, measured in the same run.

For each threshold (`speed`): test accuracy, the mean layers a test row ran, and ms per example at batch 1
and 64 on one thread (transferset.runtime.timing: every threshold and the baseline in the same interleaved rounds,
tokenization included, the machine's load printed with the figures). The baseline is the exits folder's
own model with its exits switched off: the same weights and truncation, what `transferset exits` left
unchanged. Also the cost of one branch next to one encoder layer at batch 1, since the branch runs after
every layer on every row still in flight.

    .venv/bin/python benchmarks/exits.py --model runs/demo/teacher-exits --test ../shared/data/sst2/dev.tsv
    # several seeds of the branches: accuracy and layers per seed (mean, spread); latency of the first
    .venv/bin/python benchmarks/exits.py --model exits-s0 --model exits-s1 --model exits-s2 --test dev.tsv --out exits.json

Run it on an idle machine: on a busy one every figure is slower and the ratios bend (the load is printed).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from students.data import read_eval_data  # noqa: E402
from students.families.exits import pool  # noqa: E402
from students.student import Student, accuracy  # noqa: E402
from transferset.runtime.threads import set_torch_threads, torch_threads  # noqa: E402
from transferset.runtime.timing import describe, measure, ratios  # noqa: E402

SST2_DEV = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "sst2", "dev.tsv")
SPEEDS = tuple(round(0.1 * i, 1) for i in range(11))
BASELINE = "no exits"


def label(speed: float) -> str:
    return f"speed {speed:.1f}"


def load(path: str) -> Student:
    model = Student.from_pretrained(path)
    if not isinstance(model, Student) or model.exits is None:
        sys.exit(f"{path}: no early exits here; pass the --output of `transferset exits`")
    return model


def branch_cost(model: Student, tokens: int = 24, calls: int = 200) -> dict:
    """ms of one branch and of one encoder layer on one row of `tokens` tokens (one thread)."""
    hidden = int(model.model.config.hidden_size)
    x = torch.randn(1, tokens, hidden)
    mask = torch.ones(1, tokens, dtype=torch.long)
    layer = model.model.base_model.encoder.layer[0]
    branch = model.exits.heads[0]
    how = model.exits.config.pool

    def ms(fn) -> float:
        fn()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        return 1000.0 * (time.perf_counter() - start) / calls

    with torch_threads(1), torch.inference_mode():
        return {"tokens": tokens, "pool": how, "branch_ms": round(ms(lambda: branch(pool(x, mask, how))), 4),
                "layer_ms": round(ms(lambda: layer(x, None)), 4)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", action="append", required=True, help="a `transferset exits` output (repeat: seeds)")
    p.add_argument("--test", default=SST2_DEV, help="labeled test file (default: SST-2 dev)")
    p.add_argument("--speeds", default=",".join(str(s) for s in SPEEDS), help="comma-separated thresholds")
    p.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds (0: no timing)")
    p.add_argument("--batch-size", type=int, default=64, help="rows per batch for the accuracy pass")
    p.add_argument("--out", default=None, help="write the figures as JSON here too")
    args = p.parse_args()
    speeds = [float(s) for s in args.speeds.split(",")]
    set_torch_threads(1)  # accuracy passes too: the layers used do not depend on it, the wall time does

    models = [load(m) for m in args.model]
    data = read_eval_data(args.test, models[0].label_names)
    baseline = Student.from_pretrained(args.model[0])
    baseline.exits = None  # the same model and truncation, every row through every layer
    base_acc = accuracy(baseline.predict_ids(data.texts, batch_size=args.batch_size), data.labels)
    rows = {}
    for speed in speeds:
        per_seed = []
        for m in models:
            logits, layers = m.logits_and_layers(data.texts, batch_size=args.batch_size, speed=speed)
            per_seed.append((accuracy(logits.argmax(-1), data.labels), float(layers.mean())))
        accs, layers = [a for a, _ in per_seed], [n for _, n in per_seed]
        rows[label(speed)] = {"speed": speed, "accuracy": statistics.mean(accs),
                              "accuracy_sd": statistics.stdev(accs) if len(accs) > 1 else 0.0,
                              "accuracies": accs, "mean_layers": statistics.mean(layers)}
    result = {"models": args.model, "test": args.test, "test_rows": len(data.texts),
              "layers": len(models[0].model.base_model.encoder.layer), "baseline_accuracy": base_acc,
              "rows": rows, "branch_cost": branch_cost(models[0])}
    if args.rounds > 0:
        predictors = {BASELINE: baseline.logits}
        predictors.update({label(s): functools.partial(models[0].logits, speed=s) for s in speeds})
        timed = measure(predictors, data.texts, rounds=args.rounds,
                        log=lambda msg: print(msg, file=sys.stderr, flush=True))
        result["latency"], result["conditions"] = timed["latency"], timed["conditions"]
        result["speedup"] = ratios(timed["latency"], BASELINE)

    print(f"{result['layers']}-layer model, {len(models)} seed(s) of the branches, {len(data.texts)} test rows "
          f"({args.test}); without exits: accuracy {100 * base_acc:.2f}")
    cost = result["branch_cost"]
    print(f"one branch ({cost['pool']}) {cost['branch_ms']:.3f} ms vs one layer {cost['layer_ms']:.3f} ms (batch 1, "
          f"{cost['tokens']} tokens, 1 thread)")
    head = f"{'threshold':>10} {'accuracy':>14} {'layers':>7}"
    if "latency" in result:
        head += f" {'ms b1':>8} {'x b1':>6} {'ms b64':>8} {'x b64':>6}"
        print(describe(result["conditions"]))
    print(head)
    names = ([BASELINE] if "latency" in result else []) + list(rows)
    for name in names:
        r = rows.get(name, {"accuracy": base_acc, "accuracy_sd": 0.0, "mean_layers": result["layers"]})
        line = f"{name:>10} {100 * r['accuracy']:8.2f} ± {100 * r['accuracy_sd']:.2f} {r['mean_layers']:7.2f}"
        if "latency" in result:
            lat, up = result["latency"][name], result["speedup"][name]
            line += (f" {lat['batch_1']['median']:8.2f} {up['batch_1']:6.2f} {lat['batch_64']['median']:8.2f} "
                     f"{up['batch_64']:6.2f}")
        print(line)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=2, default=float)


if __name__ == "__main__":
    main()
