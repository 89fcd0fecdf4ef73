"""Distillation quality on a split no choice has seen: teacher, labels-only and distilled students, mean ± sd.

    .venv/bin/python benchmarks/quality.py                         # both settings, 3 student seeds
    .venv/bin/python benchmarks/quality.py --setting demo --seeds 3 --out runs/quality --fresh

Each setting is a run config in benchmarks/quality/SETTING.yaml whose students are variants without
a seed. Every variant becomes one student per seed (NAME_s0, NAME_s1, ...) in one `transferset run`,
so the teacher, the transfer set and the scored sets are built once and shared by all students of
the setting (a rerun reuses every stage that is still current: pass --fresh for a cold timing).

Every setting carves its validation split from SST-2 train (`validation:`): early stopping, the
teacher's best epoch and the choice of the best variant of each kind use it alone; the official dev
file is the test split, scored once per model at the end (`transferset run`'s test stage).

Per setting it prints a table: validation (selection) and test accuracy as mean ± sd over seeds,
agreement with the teacher on validation, CPU latency at batch 1 and 64 (tokenization included),
parameters, training rows/s, and the wall time of each stage and of the whole setting. Then it picks,
on validation means only, the best labels-only and the best distilled variant of each family, and
checks the targets on their test means: demo: best distilled BiLSTM ≥ teacher − 2.0 and ≥ best
labels-only BiLSTM + 4.0, best transformer student with at most half the teacher's layers ≥ teacher −
1.0 and ≥ 2× faster at batch 64; low resource: best distilled ≥ teacher − 0.5.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from typing import Optional


HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from transferset.app.report import pct  # noqa: E402
from transferset.contract import schema  # noqa: E402
from transferset.runtime import typed  # noqa: E402
from transferset.runtime.timing import describe  # noqa: E402
from students.families.transformer import TransformerConfig  # noqa: E402
from transferset.config import RunConfig  # noqa: E402

SETTINGS = ("demo", "lowres")  # `--setting both` runs these; any benchmarks/quality/NAME.yaml runs by name


def expand(raw: dict, seeds: int) -> dict:
    """One student per (variant, seed): NAME_s{k} with `seed: k`; a variant's own `seeds: N` caps its count."""
    students = {}
    for name, settings in (raw.get("students") or {}).items():
        settings = dict(settings or {})
        for k in range(min(seeds, int(settings.pop("seeds", seeds)))):
            students[f"{name}_s{k}"] = {**settings, "seed": k}
    return {**raw, "students": students}


def mean_sd(values: list[float], scale: float = 100.0, digits: int = 1) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{scale * statistics.mean(values):.{digits}f} ± {scale * sd:.{digits}f}"


def stage_seconds(run_dir: str) -> dict[str, float]:
    """Seconds each stage took in this run directory (its .stage.json), students summed."""
    from transferset.app.run.runner import STAGE_FILE

    out: dict[str, float] = {}
    for root, _, files in os.walk(run_dir):
        if STAGE_FILE in files:
            with open(os.path.join(root, STAGE_FILE), encoding="utf-8") as fh:
                sec = json.load(fh).get("seconds", 0.0)
            name = os.path.relpath(root, run_dir).split(os.sep)[0]
            out[name] = out.get(name, 0.0) + sec
    return out


def run_setting(setting: str, seeds: int, out: str, overrides: list[str], fresh: bool) -> dict:
    from transferset.app.run.runner import apply_override, run_pipeline

    raw = typed.read_yaml(os.path.join(HERE, "quality", f"{setting}.yaml"))
    run_dir = os.path.join(out, setting)
    if fresh and os.path.exists(run_dir):
        shutil.rmtree(run_dir)
    raw = expand(raw, seeds)
    raw["run_dir"] = run_dir
    for item in overrides:
        apply_override(raw, item)
    cfg = typed.load(RunConfig, raw, where=f"benchmarks/quality/{setting}.yaml")
    print(f"[{setting}] transferset run with {len(cfg.students)} students → {run_dir}", flush=True)
    t0 = time.time()
    run_pipeline(cfg)
    wall = time.time() - t0
    return summarize(setting, run_dir, raw, wall)


FAMILIES = ("bilstm", "static", "transformer")


def family_of(metrics: dict) -> str:
    return metrics["student"]


def summarize(setting: str, run_dir: str, raw: dict, wall: float) -> dict:
    with open(os.path.join(run_dir, "results.json"), encoding="utf-8") as fh:
        results = json.load(fh)
    with open(os.path.join(run_dir, "test", "accuracy.json"), encoding="utf-8") as fh:
        tested = json.load(fh)["models"]
    teacher = next(r for r in results["rows"] if r["name"] == "teacher")
    variants: dict[str, list[dict]] = {}
    for name in raw["students"]:
        with open(os.path.join(run_dir, "students", name, schema.METRICS_FILE), encoding="utf-8") as fh:
            m = json.load(fh)
        m["test_accuracy"] = tested[name]["accuracy"]
        # The report's figures, every model timed together: metrics.json's is this student alone at training time.
        row = next(r for r in results["rows"] if r["name"].startswith(f"student: {name} ("))
        m["report_latency"] = {"batch_1": row["latency_1"], "batch_64": row["latency_64"]}
        variants.setdefault(name.rsplit("_s", 1)[0], []).append(m)
    head = ["model", "validation (selection)", "test", "agreement (validation)", "ms/example batch 1", "batch 64",
            "parameters", "train rows/s", "train s"]
    rows = [["teacher", f"{100 * teacher['dev_accuracy']:.1f}", f"{100 * teacher['test_accuracy']:.1f}", "-",
             f"{teacher['latency_1']:.2f}", f"{teacher['latency_64']:.2f}", f"{teacher['parameters'] / 1e6:.1f} M",
             "-", "-"]]
    for base, ms in variants.items():
        rows.append([f"{base} (n={len(ms)})", mean_sd([m["dev_accuracy"] for m in ms]),
                     mean_sd([m["test_accuracy"] for m in ms]),
                     mean_sd([m["teacher_agreement"] for m in ms]),
                     mean_sd([m["report_latency"]["batch_1"] for m in ms], 1.0, 2),
                     mean_sd([m["report_latency"]["batch_64"] for m in ms], 1.0, 2),
                     f"{ms[0]['parameters'] / 1e6:.2f} M",
                     f"{statistics.mean(m.get('train_rows_per_second') or 0 for m in ms):.0f}",
                     f"{statistics.mean(m['train_seconds'] for m in ms):.0f}"])
    # The run's compress: models (int8, exits, pruned), one row each as the report has them (selection accuracy
    # measured by the report; no seeds: each is made once from the model it names).
    rows += [[r.get("display") or r["name"], pct(r["dev_accuracy"]), pct(r["test_accuracy"]), "-",
              f"{r['latency_1']:.2f}", f"{r['latency_64']:.2f}", f"{r['parameters'] / 1e6:.1f} M", "-", "-"]
             for r in results["rows"] if r.get("kind") == "compressed"]
    stages = stage_seconds(run_dir)
    lines = [f"## {setting}: {run_dir}", "",
             ("latency: " + describe(results["latency_conditions"]) if results.get("latency_conditions") else
              "latency: conditions not recorded"),
             f"wall {wall / 60:.1f} min; stages (s): " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(stages.items())),
             f"transfer rows {next(iter(variants.values()))[0]['transfer']['rows']}; test split {tested['teacher']['data']}"
             f" ({tested['teacher']['labeled_rows']} rows)",
             "", "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    lines += ["", *targets(setting, run_dir, teacher, variants)]
    table = "\n".join(lines)
    with open(os.path.join(run_dir, "quality.md"), "w", encoding="utf-8") as fh:
        fh.write(table + "\n")
    return {"setting": setting, "table": table, "wall_seconds": wall, "stages": stages,
            "teacher": {"validation": teacher["dev_accuracy"], "test": teacher["test_accuracy"],
                        "latency_64": teacher["latency_64"]},
            "variants": {b: {"validation": [m["dev_accuracy"] for m in ms], "test": [m["test_accuracy"] for m in ms],
                             "student": ms[0]["student"], "parameters": ms[0]["parameters"],
                             "latency_1": [m["report_latency"]["batch_1"] for m in ms],
                             "latency_64": [m["report_latency"]["batch_64"] for m in ms]}
                         for b, ms in variants.items()}}


def best(variants: dict[str, list[dict]], kind: str, family: str) -> Optional[str]:
    """The variant of a kind (labels_only*, distilled*) and family with the best validation mean: test never chooses."""
    names = [b for b, ms in variants.items() if b.startswith(kind) and family_of(ms[0]) == family]
    return max(names, key=lambda b: statistics.mean(m["dev_accuracy"] for m in variants[b]), default=None)


def targets(setting: str, run_dir: str, teacher: dict, variants: dict[str, list[dict]]) -> list[str]:
    """The quality targets on test means, for the variants chosen on validation means."""
    test = {b: statistics.mean(m["test_accuracy"] for m in ms) for b, ms in variants.items()}
    t = teacher["test_accuracy"]
    out = []
    for family in FAMILIES:
        d, lo = best(variants, "distilled", family), best(variants, "labels_only", family)
        if d:
            out.append(f"best distilled {family} on validation: {d}, test {100 * test[d]:.2f} vs teacher {100 * t:.2f}: "
                       f"{100 * (test[d] - t):+.2f}")
        if lo:
            out.append(f"best labels-only {family} on validation: {lo}, test {100 * test[lo]:.2f}"
                       + (f"; distilled − labels-only {100 * (test[d] - test[lo]):+.2f}" if d else ""))
    d, lo = best(variants, "distilled", "bilstm"), best(variants, "labels_only", "bilstm")
    if setting.startswith("demo") and d:
        out.append(f"  target BiLSTM >= teacher - 2.0: {'met' if test[d] >= t - 0.02 else 'not met'}")
        if lo:
            out.append(f"  target BiLSTM >= best labels-only + 4.0: {'met' if test[d] - test[lo] >= 0.04 else 'not met'}")
        small = [b for b, ms in variants.items() if b.startswith("distilled") and family_of(ms[0]) == "transformer"
                 and 2 * ms[0]["config"]["model"].get("n_layer", TransformerConfig.n_layer) <= teacher_layers(run_dir)]
        if small:
            tb = max(small, key=lambda b: statistics.mean(m["dev_accuracy"] for m in variants[b]))
            speed = teacher["latency_64"] / statistics.mean(m["report_latency"]["batch_64"] for m in variants[tb])
            out.append(f"  best transformer with <= half the teacher's layers (on validation): {tb}, test "
                       f"{100 * (test[tb] - t):+.2f} vs teacher, {speed:.1f}x faster at batch 64; target >= -1.0 and "
                       f">= 2x: {'met' if test[tb] >= t - 0.01 and speed >= 2 else 'not met'}")
    elif d:
        out.append(f"  target >= teacher - 0.5: {'met' if test[d] >= t - 0.005 else 'not met'}")
    return [f"- {line}" for line in out]


def teacher_layers(run_dir: str) -> int:
    with open(os.path.join(run_dir, "teacher", "config.json"), encoding="utf-8") as fh:
        return int(json.load(fh)["num_hidden_layers"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--setting", default="both",
                    help="both, or NAME of a benchmarks/quality/NAME.yaml (demo, lowres, demo_transformers)")
    ap.add_argument("--seeds", type=int, default=3, help="student seeds per variant")
    ap.add_argument("--out", default="runs/quality", help="one run directory per setting under here")
    ap.add_argument("--fresh", action="store_true", help="delete the setting's run directory first (cold timing)")
    ap.add_argument("overrides", nargs="*", metavar="key=value", help="settings on top of the YAML, as for `run`")
    args = ap.parse_args(argv)
    settings = SETTINGS if args.setting == "both" else (args.setting,)
    summaries = [run_setting(s, args.seeds, args.out, args.overrides, args.fresh) for s in settings]
    for s in summaries:
        print("\n" + s["table"])
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "quality.json"), "w", encoding="utf-8") as fh:
        json.dump(summaries, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
