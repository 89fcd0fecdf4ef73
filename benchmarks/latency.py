"""Latency of a run's teacher and students on PyTorch and on ONNX Runtime, measured so it holds still.

Every model on both runtimes is timed in the same rounds, interleaved (transferset.runtime.timing: each round
times every model once per batch size, in an order rotated each round), threads pinned, tokenization
included. Printed: the median ms per example and its spread (quartiles) at batch 1 and 64, and the
speed-up over the teacher on the same runtime. For each BiLSTM student, where its time goes at batch
1 and 64: tokenizer, embedding, LSTM, head (PyTorch), and tokenizer vs graph (ONNX Runtime).

    .venv/bin/python benchmarks/latency.py runs/demo                    # RUN/teacher, RUN/students/*
    .venv/bin/python benchmarks/latency.py runs/demo --threads 2 --rounds 15 --out latency.json
    .venv/bin/python benchmarks/latency.py runs/demo --onnx-dir runs/demo/onnx   # keep (and reuse) the exports

Run it on an idle machine: the interleaving evens out load between models, not the noise itself.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from students.compress.export import export  # noqa: E402
from students.data.encoding import Encoder, hf_arrays  # noqa: E402
from students.families.bilstm import BiLSTM  # noqa: E402
from students.student import EXPORT_KEY, ONNX_FILE, OnnxStudent, Student  # noqa: E402
from transferset.config import DEFAULT_MAX_LENGTH  # noqa: E402
from transferset.contract import schema  # noqa: E402
from transferset.runtime.threads import set_torch_threads  # noqa: E402
from transferset.runtime.timing import describe, measure, ratios  # noqa: E402
from transferset.sources import read_texts  # noqa: E402

SST2_DEV = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "sst2", "dev.tsv")
RUNTIMES = ("torch", "onnx")


def models_of(run_dir: str) -> dict[str, str]:
    """{name: directory}: RUN/teacher, then every RUN/students/NAME holding a student.

    A teacher-ensemble run (`teacher_seeds`: RUN/teachers/seedS) has no RUN/teacher: its first member folder (by name) is
    the teacher here, so the speed-ups are against one teacher (the ensemble costs the sum of its members)."""
    out = {"teacher": os.path.join(run_dir, "teacher")}
    members = os.path.join(run_dir, "teachers")
    if not os.path.isdir(out["teacher"]) and os.path.isdir(members) and os.listdir(members):
        out["teacher"] = os.path.join(members, sorted(os.listdir(members))[0])
    if not os.path.isfile(os.path.join(out["teacher"], schema.HF_CONFIG_FILE)):
        sys.exit(f"{run_dir}: no teacher/ with {schema.HF_CONFIG_FILE}; pass a `transferset run` directory")
    students = os.path.join(run_dir, "students")
    for name in sorted(os.listdir(students)) if os.path.isdir(students) else []:
        if os.path.isfile(os.path.join(students, name, schema.STUDENT_MODEL_DIR, schema.STUDENT_SIDECAR_FILE)):
            out[name] = os.path.join(students, name)
    return out


def _float32_export(out: str) -> bool:
    config = os.path.join(out, schema.HF_CONFIG_FILE)
    if not (os.path.isfile(os.path.join(out, ONNX_FILE)) and os.path.isfile(config)):
        return False
    with open(config, encoding="utf-8") as fh:
        return (json.load(fh).get(EXPORT_KEY) or {}).get("quantize") is None


def load(models: dict[str, str], runtimes, onnx_dir: str, threads: int,
         tokenizer_baseline: bool = False) -> dict[str, object]:
    """{"name/runtime": loaded model}; ONNX exports are made in onnx_dir (reused when there). With
    `tokenizer_baseline`, each export also as "name/onnx-hf": tokenized by transformers' call, not the
    backend directly (students/data/encoding.py), for the same graph."""
    loaded = {}
    for name, path in models.items():
        max_length = DEFAULT_MAX_LENGTH if name == "teacher" else None  # as the run report times the teacher
        if "torch" in runtimes:
            loaded[f"{name}/torch"] = Student.from_pretrained(path, max_length=max_length)
        if "onnx" in runtimes:
            out = os.path.join(onnx_dir, name)
            if not _float32_export(out):  # an int8 export there (benchmarks/int8.py) is not this row
                t0 = time.perf_counter()
                export(path, out, max_length=max_length, overwrite=True)
                print(f"exported {name} to {out} ({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
            loaded[f"{name}/onnx"] = onnx = OnnxStudent.from_dir(out, threads=threads)
            if tokenizer_baseline:  # the same session and tokenizer, another encoder
                baseline = copy.copy(onnx)
                baseline.encoder = Encoder(onnx.tokenizer, direct=False)
                loaded[f"{name}/onnx-hf"] = baseline
    return loaded


def _median_ms(fn, items, rows: int, rounds: int) -> float:
    """Median over rounds of ms per example of fn over items (one untimed call first)."""
    fn(items[0])
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for item in items:
            fn(item)
        samples.append(1000.0 * (time.perf_counter() - t0) / rows)
    return statistics.median(samples)


@torch.inference_mode()
def bilstm_breakdown(student: Student, onnx_student, texts, batch_size: int, rounds: int) -> dict[str, float]:
    """ms per example of each part of the BiLSTM's forward pass (PyTorch) and of the ONNX path."""
    model: BiLSTM = student.model.eval()
    n = 16 if batch_size == 1 else 2 * batch_size
    chunks = [list(texts[i:i + batch_size]) for i in range(0, n, batch_size)]
    enc = [student.tokens.encode(c) for c in chunks]                                  # (ids, mask, types)
    emb = [(model.embed(ids), mask.sum(1).clamp(min=1)) for ids, mask, _ in enc]
    seq = [(model.encode(x, lengths)[0], x.shape[1], lengths) for x, lengths in emb]

    def head(item):
        out, T, lengths = item
        if model.config.pool == "max":
            valid = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
            pooled = out.masked_fill(~valid.unsqueeze(-1), float("-inf")).max(dim=1).values
        else:
            pooled = out[:, -1]  # the same work as the last-state gather, for timing
        z = model.head(pooled)
        return model.classifier(F.gelu(z) if model.config.head_act == "gelu" else F.relu(z))

    # Each part timed over the same batches, on the previous part's outputs (by the batch's position).
    parts = {
        "tokenizer": lambda c: student.tokens.encode(c),
        "embedding": lambda i: model.embed(enc[i][0]),
        "lstm": lambda i: model.encode(*emb[i]),
        "head": lambda i: head(seq[i]),
    }
    rows = sum(len(c) for c in chunks)
    batches = list(range(len(chunks)))
    out = {f"torch {name}": _median_ms(fn, chunks if name == "tokenizer" else batches, rows, rounds)
           for name, fn in parts.items()}
    if onnx_student is not None:
        names, length = onnx_student.input_names, onnx_student.max_length
        feeds = [onnx_student.encoder(c, None, length, names) for c in chunks]
        out["onnx tokenizer"] = _median_ms(lambda c: onnx_student.encoder(c, None, length, names), chunks, rows, rounds)
        out["onnx tokenizer (transformers' call)"] = _median_ms(
            lambda c: hf_arrays(onnx_student.tokenizer, c, None, length, names), chunks, rows, rounds)
        out["onnx graph"] = _median_ms(lambda f: onnx_student.session.run(None, f), feeds, rows, rounds)
    return out


def table(result: dict, params: dict) -> str:
    speed = {}
    for runtime in RUNTIMES:
        names = {k: v for k, v in result.items() if k.endswith("/" + runtime)}
        if f"teacher/{runtime}" in names:
            speed.update(ratios(names, f"teacher/{runtime}"))
    head = (f"{'model':<28} {'parameters':>12} {'batch 1 ms/ex (IQR)':>24} {'batch 64 ms/ex (IQR)':>24} "
            f"{'vs teacher, same runtime (1 / 64)':>34}")
    lines = [head, "-" * len(head)]
    for name, cells in result.items():
        def cell(key):
            c = cells[key]
            return f"{c['median']:.3f} ({c['q1']:.3f}-{c['q3']:.3f})"
        s = speed.get(name)
        ratio = f"{s['batch_1']:.1f}x / {s['batch_64']:.1f}x" if s else "-"
        lines.append(f"{name:<28} {params.get(name.split('/')[0], 0):>12,} {cell('batch_1'):>24} "
                     f"{cell('batch_64'):>24} {ratio:>34}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", metavar="RUN_DIR", help="a `transferset run` directory: RUN/teacher, RUN/students/*")
    ap.add_argument("--threads", type=int, default=1, help="torch and onnxruntime intra-op threads")
    ap.add_argument("--rounds", type=int, default=9, help="interleaved rounds (the median is reported)")
    ap.add_argument("--texts", default=SST2_DEV, help="texts timed (a .tsv/.csv/.jsonl/.parquet file)")
    ap.add_argument("--runtimes", default=",".join(RUNTIMES), help="torch, onnx or both")
    ap.add_argument("--onnx-dir", default=None, help="where the ONNX exports go (default: a temporary folder)")
    ap.add_argument("--no-breakdown", dest="breakdown", action="store_false",
                    help="skip the per-part timing of the BiLSTM students")
    ap.add_argument("--tokenizer-baseline", action="store_true",
                    help="also time each ONNX export tokenized by transformers' call (NAME/onnx-hf), the baseline of "
                         "calling the tokenizer's backend directly (students/data/encoding.py)")
    ap.add_argument("--out", default=None, help="also write every sample as JSON here")
    args = ap.parse_args()
    runtimes = [r for r in args.runtimes.split(",") if r]
    set_torch_threads(args.threads)  # before loading: an ONNX session takes its threads when it is made
    texts = list(read_texts(args.texts))[:512]
    models = models_of(args.run_dir)
    with tempfile.TemporaryDirectory() as tmp:
        loaded = load(models, runtimes, args.onnx_dir or tmp, args.threads, args.tokenizer_baseline)
        params = {name: loaded[f"{name}/torch"].num_parameters() if f"{name}/torch" in loaded else 0
                  for name in models}
        print(f"{len(models)} models x {len(runtimes)} runtimes, {args.threads} thread(s), {args.rounds} interleaved "
              f"rounds, load average {os.getloadavg()[0]:.1f}, texts {args.texts}", file=sys.stderr)
        t0 = time.perf_counter()
        timed = measure({name: m.logits for name, m in loaded.items()}, texts, batch_sizes=(1, 64),
                        rounds=args.rounds, threads=args.threads, log=lambda msg: print(msg, file=sys.stderr))
        result, conditions = timed["latency"], timed["conditions"]
        print(f"measured in {time.perf_counter() - t0:.0f} s: {describe(conditions)}", file=sys.stderr)
        print(table(result, params))
        for name in models:
            if f"{name}/onnx-hf" in result:
                direct = ratios({k: result[k] for k in (f"{name}/onnx", f"{name}/onnx-hf")}, f"{name}/onnx-hf")
                print(f"{name}/onnx, the tokenizer's backend called directly vs transformers' call: "
                      f"{direct[f'{name}/onnx']['batch_1']:.2f}x at batch 1, {direct[f'{name}/onnx']['batch_64']:.2f}x at 64")
        breakdown = {}
        if args.breakdown:
            for name in models:
                student = loaded.get(f"{name}/torch")
                if isinstance(student, Student) and isinstance(student.model, BiLSTM):
                    for bs in (1, 64):
                        parts = bilstm_breakdown(student, loaded.get(f"{name}/onnx"), texts, bs, args.rounds)
                        breakdown[f"{name} batch {bs}"] = parts
                        print(f"\n{name}, batch {bs}: where the time goes (ms per example, median)")
                        for part, ms in parts.items():
                            print(f"  {part:<16} {ms:8.4f}")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump({"threads": args.threads, "rounds": args.rounds, "texts": args.texts, "latency": result,
                       "conditions": conditions,
                       "parameters": params, "breakdown": breakdown}, fh, indent=2)


if __name__ == "__main__":
    main()
