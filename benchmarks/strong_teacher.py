"""The strong-teacher table: teacher, labels-only and distilled BiLSTMs, by length, and the margin.

    RUN=$HOME/.cache/transferset/runs/sst2_mpnet
    OMP_NUM_THREADS=1 transferset run --config configs/sst2_mpnet.yaml \
        teacher.model="$(bash benchmarks/fetch_mpnet.sh)" run_dir=$RUN
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/strong_teacher.py --run $RUN --seeds 3 --out runs/mpnet_seeds [--jobs 2]

The run trains each student once (seed 0). With --seeds N this script first trains seeds 1 .. N-1 of the
students named by --train (default: all) on the run's scored set, as the run would: `transferset train
--transfer RUN/scored --dev RUN/dev/scored --teacher RUN/teacher --config SECTION --seed S` with the student's
section of --config, into OUT/NAME_sS (a finished one is kept, so a rerun goes on). Then every model (the
teacher, the run's students, OUT's seeds) is evaluated once on --test (SST-2's dev file, which chose nothing:
the run carves its selection split from train), overall and per band of length in words (`transferset
evaluate --by-length`). Printed: one row per model kind, mean ± sd over its seeds, with its selection accuracy
(the split its epoch was chosen on), and the fraction of the teacher's margin over the labels-only student that
each distilled one recovers: (distilled − labels only) / (teacher − labels only), on the test means (Tang et
al.: 49 %).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import quality  # noqa: E402  (benchmarks/quality.py, beside this file)
from students.evaluate import LENGTH_EDGES, evaluate  # noqa: E402
from transferset.contract import schema  # noqa: E402
from transferset.runtime import typed  # noqa: E402

SST2_DEV = ROOT.parent / "shared" / "data" / "sst2" / "dev.tsv"
SEED_FOLDER = re.compile(r"^(?P<name>.+)_s(?P<seed>\d+)$")


def train_seeds(run: Path, config: Path, names: list[str], seeds: int, out: Path, jobs: int = 1) -> None:
    """Seeds 1 .. seeds-1 of each named student, with its section of the run config, on the run's scored set;
    `jobs` trainings at a time (each its own process: give each a thread, OMP_NUM_THREADS=1)."""
    sections = typed.read_yaml(str(config))["students"]
    out.mkdir(parents=True, exist_ok=True)
    todo = [(name, seed) for name in names for seed in range(1, seeds)
            if not (out / f"{name}_s{seed}" / schema.COMPLETE_MARKER).exists()]

    def one(name: str, seed: int) -> None:
        folder = out / f"{name}_s{seed}"
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as fh:
            yaml.safe_dump(sections[name], fh)
        print(f"[strong_teacher] training {name}, seed {seed} → {folder}", file=sys.stderr, flush=True)
        cli = str(Path(sys.executable).parent / "transferset")
        subprocess.run([cli, "train", "--transfer", str(run / "scored"), "--dev", str(run / "dev" / "scored"),
                        "--teacher", str(run / "teacher"),
                        "--config", fh.name, "--seed", str(seed), "--output", str(folder), "--overwrite"],
                       check=True, cwd=ROOT)
        os.unlink(fh.name)

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for done in [pool.submit(one, name, seed) for name, seed in todo]:
            done.result()  # a failed training stops the script with its error


def models(run: Path, seeds_dir: Path | None) -> dict[str, list[Path]]:
    """Each student kind's folders, seed 0 (the run's) first, then --out's in seed order."""
    kinds: dict[str, list[tuple[int, Path]]] = {}
    for folder in sorted((run / "students").iterdir()):
        if (folder / schema.COMPLETE_MARKER).exists():
            kinds.setdefault(folder.name, []).append((0, folder))
    for folder in sorted(seeds_dir.iterdir()) if seeds_dir else []:
        match = SEED_FOLDER.match(folder.name)
        if match and folder.is_dir() and (folder / schema.COMPLETE_MARKER).exists():
            kinds.setdefault(match["name"], []).append((int(match["seed"]), folder))
    return {name: [f for _, f in sorted(found)] for name, found in kinds.items()}


def selection_accuracy(folder: Path) -> float:
    metrics = json.loads((folder / schema.METRICS_FILE).read_text())
    return float(metrics.get("dev_accuracy", metrics.get("best_dev_accuracy")))


def mean_sd(values: list[float]) -> str:
    """quality.py's mean ± sd; one seed as its value alone."""
    return f"{100 * values[0]:.1f}" if len(values) == 1 else quality.mean_sd(values)


def measure(folders: list[Path], test: str) -> dict:
    """Selection and test accuracy of each folder, and the test accuracy per length band."""
    results = [evaluate(str(f), test, by_length=LENGTH_EDGES) for f in folders]
    bands = [b["words"] for b in results[0]["by_length"]]
    return {"seeds": len(folders), "selection": [selection_accuracy(f) for f in folders],
            "test": [r["accuracy"] for r in results], "rows": [b["rows"] for b in results[0]["by_length"]],
            "bands": {name: [r["by_length"][i]["accuracy"] for r in results] for i, name in enumerate(bands)}}


def table(figures: dict[str, dict]) -> list[str]:
    bands = list(next(iter(figures.values()))["bands"])
    rows = next(iter(figures.values()))["rows"]
    lines = ["| model | seeds | selection | **test** | " + " | ".join(f"{b} words" for b in bands) + " |",
             "| --- " * (4 + len(bands)) + "|",
             "| test rows | | | | " + " | ".join(str(n) for n in rows) + " |"]
    for name, f in figures.items():
        lines.append(f"| {name} | {f['seeds']} | {mean_sd(f['selection'])} | **{mean_sd(f['test'])}** | "
                     + " | ".join(mean_sd(f["bands"][b]) for b in bands) + " |")
    return lines


def margins(figures: dict[str, dict], labels_only: str) -> list[str]:
    """The fraction of the teacher's margin over the labels-only student each distilled student recovers."""
    teacher = statistics.mean(figures["teacher"]["test"])
    base = statistics.mean(figures[labels_only]["test"])
    lines = [f"teacher − {labels_only}: {100 * (teacher - base):+.1f} on test"]
    for name, f in figures.items():
        if name in ("teacher", labels_only):
            continue
        mean = statistics.mean(f["test"])
        share = (mean - base) / (teacher - base) if teacher != base else float("nan")
        lines.append(f"{name}: {100 * (mean - base):+.1f} over {labels_only}, {100 * (mean - teacher):+.1f} from the "
                     f"teacher, margin recovered {100 * share:.0f} %")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", required=True, type=Path, help="the run directory of --config")
    ap.add_argument("--config", type=Path, default=ROOT / "configs" / "sst2_mpnet.yaml",
                    help="the run's config: each student's section for its other seeds")
    ap.add_argument("--seeds", type=int, default=1, help="seeds per student (the run's is seed 0)")
    ap.add_argument("--train", default=None, help="the students to train more seeds of, comma-separated (default: all)")
    ap.add_argument("--jobs", type=int, default=1, help="trainings at a time, one process each (default: 1)")
    ap.add_argument("--out", type=Path, default=None,
                    help="where the other seeds go (folders NAME_sS); required with --seeds > 1")
    ap.add_argument("--test", default=str(SST2_DEV), help="the test split (default: SST-2's dev file)")
    ap.add_argument("--labels-only", default="labels_only", help="the labels-only student's name in the run")
    ap.add_argument("--json", type=Path, default=None, help="also write every figure here")
    args = ap.parse_args(argv)
    if args.seeds > 1:
        if args.out is None:
            ap.error("--seeds > 1 needs --out (where the other seeds are trained)")
        names = args.train.split(",") if args.train else list(typed.read_yaml(str(args.config))["students"])
        train_seeds(args.run, args.config, names, args.seeds, args.out, args.jobs)
    kinds = models(args.run, args.out)
    if args.labels_only not in kinds:
        ap.error(f"no finished student {args.labels_only!r} under {args.run}/students (found: {sorted(kinds)})")
    figures = {"teacher": measure([args.run / "teacher"], args.test)}
    for name, folders in kinds.items():
        print(f"[strong_teacher] {name}: {len(folders)} seed(s)", file=sys.stderr, flush=True)
        figures[name] = measure(folders, args.test)
    print("\n".join([*table(figures), "", *margins(figures, args.labels_only)]))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
