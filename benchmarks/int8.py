"""int8 against float32 on ONNX Runtime, for a run's teacher and students: speed, size and accuracy.

    .venv/bin/python benchmarks/int8.py runs/demo --data ../shared/data/sst2/dev.tsv
    .venv/bin/python benchmarks/int8.py runs/demo --data test.tsv --onnx-dir runs/demo/onnx --rounds 15 --out int8.json

For RUN/teacher and every RUN/students/NAME: `transferset export` in float32 (ONNX_DIR/NAME) and with
`--quantize int8` (ONNX_DIR/NAME-int8; the export's own check against PyTorch runs, and a refusal is
printed and that model skipped), both kept and reused when --onnx-dir holds them. Then every graph is
timed in the same interleaved rounds (transferset.runtime.timing.measure: one thread by default, batch 1 and
64, tokenization included, median ms per example), and each predicts the labeled --data. Printed per
model: accuracy in float32 and int8 (and how many labels differ), ms per example and the int8 speed-up
at batch 1 and 64, the file sizes; then the int8 teacher as the peer, what a user would ship instead of
distilling: each float32 student's speed-up over it. Run it on an idle machine (the figures carry the
load the timing saw, transferset.runtime.timing.describe).

CPU instructions decide the int8 speed-up, so they are printed and written with the figures. ONNX
Runtime's int8 matrix products (MatMulInteger, DynamicQuantizeLSTM) use AVX512-VNNI or AVX-VNNI
(VPDPBUSD: four uint8 x int8 products summed into int32 in one instruction) where the CPU has them,
else AVX2 (VPMADDUBSW + VPMADDWD: two instructions, pairs summed in int16, which is why the export
quantizes weights to 7 bits, students/compress/export.py); float32 runs on AVX2/AVX512 FMA either way. Published
int8 speed-ups on BERT-size models range from ~1.1x without VNNI to ~1.6x with it. The machine this
script was written on has avx2 and no vnni (`grep -o 'vnni\\|avx2' /proc/cpuinfo | sort | uniq -c`):
figures measured there are the AVX2 case.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

from latency import SST2_DEV, models_of  # noqa: E402
from students.compress.export import export  # noqa: E402
from students.data import read_eval_data  # noqa: E402
from students.student import EXPORT_KEY, ONNX_FILE, OnnxStudent, accuracy  # noqa: E402
from transferset.config import DEFAULT_MAX_LENGTH  # noqa: E402
from transferset.contract import schema  # noqa: E402
from transferset.runtime.errors import UserError  # noqa: E402
from transferset.runtime.threads import set_torch_threads  # noqa: E402
from transferset.runtime.timing import describe, measure  # noqa: E402
from transferset.sources import read_texts  # noqa: E402

KINDS = {"fp32": None, "int8": "int8"}  # the name in the tables → export's `quantize`
# The flags that decide which int8 kernels ONNX Runtime runs (x86; absent elsewhere).
CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8")


def cpu_flags() -> list[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            flags = next((line.split(":", 1)[1].split() for line in fh if line.startswith("flags")), [])
    except OSError:
        return []
    return [f for f in CPU_FLAGS if f in flags]


def ensure_export(path: str, out: str, max_length, quantize) -> str:
    """`out`, holding an export of `path` of the kind asked (reused when it is; exported again otherwise)."""
    config = os.path.join(out, schema.HF_CONFIG_FILE)
    if os.path.isfile(os.path.join(out, ONNX_FILE)) and os.path.isfile(config):
        with open(config, encoding="utf-8") as fh:
            if (json.load(fh).get(EXPORT_KEY) or {}).get("quantize") == quantize:
                return out
    t0 = time.perf_counter()
    export(path, out, max_length=max_length, quantize=quantize, overwrite=True)
    print(f"exported {path} to {out} ({quantize or 'float32'}, {time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", metavar="RUN_DIR", help="a `transferset run` directory: RUN/teacher, RUN/students/*")
    ap.add_argument("--data", default=SST2_DEV, help="labeled file the accuracy is measured on (default: SST-2 dev)")
    ap.add_argument("--texts", default=None, help="texts timed (default: --data; the first 512)")
    ap.add_argument("--threads", type=int, default=1, help="onnxruntime intra-op threads")
    ap.add_argument("--rounds", type=int, default=9, help="interleaved rounds (the median is reported)")
    ap.add_argument("--onnx-dir", default=None,
                    help="where the exports go and are reused (default: a temporary folder)")
    ap.add_argument("--models", default=None, help="comma-separated names to keep (teacher, student names)")
    ap.add_argument("--out", default=None, help="also write the figures as JSON here")
    args = ap.parse_args()
    set_torch_threads(args.threads)  # before loading: an ONNX session takes its threads when it is made
    models = models_of(args.run_dir)
    if args.models:
        models = {k: v for k, v in models.items() if k in args.models.split(",")}
    flags = cpu_flags()
    print(f"CPU int8 instructions: {', '.join(flags) or 'none of ' + ', '.join(CPU_FLAGS)}"
          f"{'' if any('vnni' in f for f in flags) else ' (no VNNI: the AVX2 int8 path)'}", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        onnx_dir = args.onnx_dir or tmp
        loaded, dirs, refused = {}, {}, {}
        for name, path in models.items():
            max_length = DEFAULT_MAX_LENGTH if name == "teacher" else None  # as the run report times the teacher
            for kind, quantize in KINDS.items():
                out = os.path.join(onnx_dir, name if quantize is None else f"{name}-{quantize}")
                try:
                    dirs[f"{name}/{kind}"] = ensure_export(path, out, max_length, quantize)
                except UserError as exc:
                    refused[f"{name}/{kind}"] = str(exc)
                    print(f"{name} {kind}: {exc}", file=sys.stderr)
                    continue
                loaded[f"{name}/{kind}"] = OnnxStudent.from_dir(dirs[f"{name}/{kind}"], threads=args.threads)
        first = next(iter(loaded.values()))
        data = read_eval_data(args.data, first.label_names)
        preds = {key: m.predict_ids(data.texts, data.texts_b) for key, m in loaded.items()}
        acc = {key: accuracy(p, data.labels) for key, p in preds.items()}
        texts = list(read_texts(args.texts or args.data))[:512]
        timed = measure({key: m.logits for key, m in loaded.items()}, texts, batch_sizes=(1, 64),
                        rounds=args.rounds, threads=args.threads, log=lambda msg: print(msg, file=sys.stderr))
    lat, cond = timed["latency"], timed["conditions"]
    size = {key: os.path.getsize(os.path.join(d, ONNX_FILE)) for key, d in dirs.items()}

    def ms(key, bs):
        return lat[key][f"batch_{bs}"]["median"] if key in lat else float("nan")

    print(f"{describe(cond)}; accuracy on {args.data} ({len(data.texts)} rows)")
    head = (f"{'model':<22} {'acc fp32':>8} {'acc int8':>8} {'diff':>6} {'labels changed':>14} "
            f"{'b1 fp32':>8} {'b1 int8':>8} {'x':>5} {'b64 fp32':>8} {'b64 int8':>8} {'x':>5} {'MB fp32/int8':>13}")
    print(head + "\n" + "-" * len(head))
    rows = {}
    for name in models:
        f, i = f"{name}/fp32", f"{name}/int8"
        if f not in loaded:
            continue
        changed = int((preds[f] != preds[i]).sum()) if i in preds else None
        row = {"accuracy_fp32": acc[f], "accuracy_int8": acc.get(i), "labels_changed": changed,
               "ms_fp32": {bs: ms(f, bs) for bs in (1, 64)}, "ms_int8": {bs: ms(i, bs) for bs in (1, 64)},
               "bytes_fp32": size[f], "bytes_int8": size.get(i)}
        rows[name] = row
        a8 = row["accuracy_int8"]
        print(f"{name:<22} {100 * acc[f]:8.2f} "
              + (f"{100 * a8:8.2f} {100 * (a8 - acc[f]):+6.2f} {changed:>14}" if a8 is not None else
                 f"{'refused':>8} {'':>6} {'':>14}")
              + "".join(f" {ms(f, bs):8.3f} {ms(i, bs):8.3f} {ms(f, bs) / ms(i, bs):5.2f}" for bs in (1, 64))
              + f" {size[f] / 1e6:6.1f}/{(size.get(i) or 0) / 1e6:<6.1f}")
    peer = "teacher/int8"
    if peer in lat:
        print(f"\nthe peer, the int8 teacher ({ms(peer, 1):.3f} / {ms(peer, 64):.3f} ms per example at batch 1 / 64): "
              "each float32 student's speed-up over it")
        for name in models:
            if name != "teacher" and f"{name}/fp32" in lat:
                print(f"  {name:<22} {ms(peer, 1) / ms(f'{name}/fp32', 1):6.1f}x at batch 1, "
                      f"{ms(peer, 64) / ms(f'{name}/fp32', 64):6.1f}x at batch 64")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump({"run_dir": args.run_dir, "data": args.data, "threads": args.threads, "rounds": args.rounds,
                       "cpu_flags": flags, "models": rows, "refused": refused, "latency": lat,
                       "conditions": cond}, fh, indent=2)


if __name__ == "__main__":
    main()
