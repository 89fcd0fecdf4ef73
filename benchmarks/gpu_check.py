"""GPU check: the teacher fine-tuned, the set scored, a BiLSTM and a transformer student trained on CUDA in bf16.

    python benchmarks/gpu_check.py [--data ../shared/data/sst2] [--rows 4000] [--cpu-rows 256]

On a small slice of SST-2 (the first `--rows` train rows, 500 dev rows) it runs each step on the GPU through
the same functions the commands call (transferset.teacher.train.train, Teacher.predict as `score` runs it,
the score pipeline, students.trainer.train), then the same steps on the CPU on `--cpu-rows` rows, and prints
rows/s for both and their ratio: the CPU figures are measured in the same run, on the same machine. Meant to
finish in under 5 minutes on one GPU. Without a CUDA device it exits (status 2) saying so.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from transferset.config import EngineConfig, ScoreConfig, StudentConfig, TeacherConfig  # noqa: E402
from transferset.runtime import typed  # noqa: E402


def head(src: Path, dst: Path, n: int) -> str:
    with open(src, encoding="utf-8") as fh, open(dst, "w", encoding="utf-8") as out:
        for i, line in enumerate(fh):
            if i > n:
                break
            out.write(line)
    return str(dst)


def teacher_step(train: str, dev: str, out: str, engine: EngineConfig) -> tuple[str, float]:
    from transferset.teacher.train import train as fine_tune

    cfg = TeacherConfig(epochs=1, batch_size=32, max_length=64, progress=False, engine=engine)
    m = fine_tune(cfg, train=train, dev=dev, output=out, log=lambda msg: None)
    h = m["history"][0]
    return out, h["rows_per_second"]


def score_rows_per_second(teacher: str, texts: list, device: str) -> float:
    from transferset.teacher.scoring import Teacher

    t = Teacher.load(teacher, device=device)
    t.predict(texts[:64])  # warm-up: kernels, allocator
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    t.predict(texts)
    if device == "cuda":
        torch.cuda.synchronize()
    return len(texts) / (time.perf_counter() - t0)


def score_set(train: str, teacher: str, out: str) -> str:
    from pipelines.score import run_score

    run_score(ScoreConfig(max_length=64), input=train, teacher=teacher, output=out)
    return out


def student_rows_per_second(scored: str, dev: str, out: str, values: dict, engine: EngineConfig) -> float:
    from students.trainer import train

    cfg = typed.load(StudentConfig, {"epochs": 1, "report": {"latency_examples": 16}, **values}, "gpu_check")
    cfg = StudentConfig(**{**cfg.__dict__, "engine": engine})
    return float(train(cfg, scored, dev, out, progress=False)["train_rows_per_second"])


STUDENTS = {"bilstm": {"student": "bilstm"},
            "transformer": {"student": "transformer", "model": {"n_layer": 3}, "losses": {"ce": 1.0, "kd": 1.0}}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(REPO.parent / "shared" / "data" / "sst2"))
    ap.add_argument("--rows", type=int, default=4000, help="train rows on the GPU")
    ap.add_argument("--cpu-rows", type=int, default=256, help="train rows on the CPU, for the comparison")
    ap.add_argument("--output", default=None, help="also write the figures to this JSON file")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device is visible to torch here (torch.cuda.is_available() is False, torch "
              f"{torch.__version__}); run it on a machine with a GPU and a CUDA build of torch", file=sys.stderr)
        return 2
    gpu = EngineConfig(device="cuda", precision="bf16")
    cpu = EngineConfig(device="cpu")
    started = time.perf_counter()
    figures: dict = {"gpu": torch.cuda.get_device_name(0), "rows": args.rows, "cpu_rows": args.cpu_rows}
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        data = Path(args.data)
        dev = head(data / "dev.tsv", d / "dev.tsv", 500)
        for where, rows, engine in (("cuda", args.rows, gpu), ("cpu", args.cpu_rows, cpu)):
            train = head(data / "train.tsv", d / f"train-{where}.tsv", rows)
            teacher, figures[f"teacher_{where}"] = teacher_step(train, dev, str(d / f"teacher-{where}"), engine)
            texts = [line.split("\t")[0] for line in open(train, encoding="utf-8").read().splitlines()[1:]]
            figures[f"score_{where}"] = score_rows_per_second(teacher, texts, where)
            scored = score_set(train, teacher, str(d / f"scored-{where}"))
            for name, values in STUDENTS.items():
                figures[f"{name}_{where}"] = student_rows_per_second(scored, dev, str(d / f"{name}-{where}"),
                                                                     values, engine)
            print(f"[gpu_check] {where} done at {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    figures["seconds"] = round(time.perf_counter() - started, 1)
    print(f"{'step':<22}{'cuda bf16 rows/s':>18}{'cpu fp32 rows/s':>18}{'ratio':>9}")
    for step in ("teacher", "score", *STUDENTS):
        g, c = figures[f"{step}_cuda"], figures[f"{step}_cpu"]
        print(f"{step:<22}{g:>18.1f}{c:>18.1f}{g / c:>8.1f}x")
    print(f"({figures['gpu']}; {figures['seconds']} s in all; CPU: {os.cpu_count()} cores, torch threads "
          f"{torch.get_num_threads()})")
    if args.output:
        Path(args.output).write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
