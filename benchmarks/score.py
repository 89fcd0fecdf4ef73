"""Benchmark: the scoring path against a naive Hugging Face loop, and against this machine's matmul peak.

    .venv/bin/python benchmarks/score.py                 # 2,000 SST-2 rows, MiniLM teacher, CPU
    .venv/bin/python benchmarks/score.py --device cuda   # the same on a GPU
    .venv/bin/python benchmarks/score.py --pipeline      # also time `transferset score` end to end (Beam)

All figures come from one run: the fp32 matmul peak (best of several large square matmuls,
MKL and oneDNN),
the naive loop (batches of 32 in file order, padded to the longest, `no_grad`, hidden states on)
and `Teacher.predict` (what the Beam handler calls) on both of its forward paths: `score_path`,
`--forward` (default auto: for this BERT teacher on CPU the padding-free packed path,
transferset/packed.py; on a GPU auto means padded, so pass --forward packed there to compare) and
`padded_path` (`--forward padded`: length-sorted, dynamically padded batches through the model's own
forward, what every non-BERT teacher gets). All paths alternate for --repeats rounds and the
best round of each is reported, so a busy machine penalises them alike. Teacher cost: 2 × non-embedding
parameters FLOPs per real (unpadded) token, counted over the encoder layers; attention's T² term is left out, which flatters
nothing since SST-2 rows are short.

On a shared machine other processes steal cores and every wall-clock figure drops; the CPU-time
figures (process CPU seconds, for the runs and for the matmul peak alike) are the ones that
measure the code rather than the neighbours.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Optional

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))  # builders
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SST2_TRAIN = REPO.parent / "shared" / "data" / "sst2" / "train.tsv"


class Clock:
    """Wall and process-CPU seconds of a block."""

    def __enter__(self):
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall, self.cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu


def matmul_peak(device: str, n: int = 2048, reps: int = 10, rounds: int = 5) -> tuple[float, float]:
    """Best fp32 matmul FLOP/s of n×n by n×n on this device and thread count: (per wall s, per CPU s).

    On CPU both matmul libraries torch has are timed (MKL behind `@`, and oneDNN, whose linear
    the packed scoring path uses) and the faster one counts, so the peak is not flattered.
    """
    import torch

    from transferset import packed

    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    kernels = [lambda: a @ b]
    if packed.onednn_linear_available(a.device):
        kernels.append(lambda: torch.ops.mkldnn._linear_pointwise(a, b, None, "none", [], ""))
    best_wall = best_cpu = 0.0
    for _ in range(rounds):
        for kernel in kernels:
            kernel()
            sync(device)
            with Clock() as c:
                for _ in range(reps):
                    kernel()
                sync(device)
            best_wall = max(best_wall, 2 * n ** 3 * reps / c.wall)
            best_cpu = max(best_cpu, 2 * n ** 3 * reps / c.cpu)
    return best_wall, best_cpu


def sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def load_rows(n: int) -> list[str]:
    from transferset import sources

    spec = sources.SourceSpec(str(SST2_TRAIN), label_names=("0", "1"), limit=n)
    return [r.text for r in sources.read_source(spec) if isinstance(r, sources.Example)]


def make_teacher(directory: str, layers: Optional[int] = None) -> str:
    """MiniLM with a (seeded, untrained) 2-class head: the cost of scoring does not depend on training.

    `layers`: keep only the first that many of its 6 layers (a cheaper stand-in, benchmarks/scale.py).
    """
    import torch

    from transferset import loading

    torch.manual_seed(0)
    model = loading.load_classifier(loading.resolve_model(loading.DEFAULT_MODEL), label_names=("0", "1"))
    if layers is not None and layers < model.config.num_hidden_layers:
        model.bert.encoder.layer = model.bert.encoder.layer[:layers]
        model.config.num_hidden_layers = layers
    model.save_pretrained(directory)
    loading.load_tokenizer(loading.resolve_model(loading.DEFAULT_MODEL)).save_pretrained(directory)
    return directory


def per_token_params(model) -> int:
    """Parameters every token goes through: the encoder layers (no embeddings, no pooler or head,
    which run once per row and would flatter the figure)."""
    return sum(p.numel() for p in model.base_model.encoder.parameters())


def naive(model, tokenizer, texts, device, max_length, batch_size=32) -> Clock:
    import torch

    sync(device)
    with Clock() as clock, torch.no_grad():
        for start in range(0, len(texts), batch_size):
            enc = tokenizer(texts[start:start + batch_size], padding=True, truncation=True, max_length=max_length,
                            return_tensors="pt").to(device)
            out = model(**enc, output_hidden_states=True)
            out.logits.cpu().numpy()
            out.hidden_states[-1][:, 0].cpu().numpy()
        sync(device)
    return clock


def ours(teacher, texts, device, beam_batch) -> Clock:
    sync(device)
    with Clock() as clock:
        for start in range(0, len(texts), beam_batch):
            teacher.predict(texts[start:start + beam_batch])
        sync(device)
    return clock


def pipeline_run(teacher_dir: str, texts: list[str], workdir: str, extra: list[str]) -> float:
    from transferset import schema
    from transferset.app import cli
    import builders as testing

    src = testing.write_transfer_set(os.path.join(workdir, "transfer"), [testing.transfer_rows(texts)], ("0", "1"))
    out = os.path.join(workdir, "scored")
    t = time.perf_counter()
    rc = cli.main(["score", "--input", src, "--teacher", teacher_dir, "--output", out, "--overwrite", *extra])
    elapsed = time.perf_counter() - t
    if rc != 0:
        raise SystemExit(f"transferset score failed with exit code {rc}")
    stats = json.load(open(os.path.join(out, schema.STATS_FILE)))
    assert stats["scored"] == len(texts), stats
    return elapsed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's, one per core)")
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--beam-batch", type=int, default=1024, help="rows per predict call (the Beam batch)")
    parser.add_argument("--forward-rows", type=int, default=None)
    parser.add_argument("--forward-tokens", type=int, default=None)
    parser.add_argument("--forward", default="auto", choices=("auto", "packed", "padded"),
                        help="forward path of the timed scoring path (the padded path is always timed too)")
    parser.add_argument("--pipeline", action="store_true", help="also time `transferset score` end to end")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args(argv)

    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from transferset.teacher import scoring
    from transferset.threads import set_torch_threads

    set_torch_threads(args.threads)
    texts = load_rows(args.rows)
    workdir = tempfile.mkdtemp(prefix="bench_score_")
    teacher_dir = make_teacher(os.path.join(workdir, "teacher"))

    tokenizer = AutoTokenizer.from_pretrained(teacher_dir)
    model = AutoModelForSequenceClassification.from_pretrained(teacher_dir).eval().to(args.device)
    kwargs = {k: v for k, v in (("forward_rows", args.forward_rows), ("forward_tokens", args.forward_tokens)) if v}
    teacher = scoring.Teacher(model, tokenizer, source=teacher_dir, max_length=args.max_length, forward=args.forward,
                              **kwargs)
    padded = scoring.Teacher(model, tokenizer, source=teacher_dir, max_length=args.max_length, forward="padded",
                             **kwargs)
    real_tokens = sum(len(ids) for ids in tokenizer(texts, truncation=True, max_length=args.max_length)["input_ids"])
    padded_naive = 0
    for start in range(0, len(texts), 32):
        ids = tokenizer(texts[start:start + 32], truncation=True, max_length=args.max_length)["input_ids"]
        padded_naive += len(ids) * max(len(x) for x in ids)
    params = per_token_params(model)

    peak = matmul_peak(args.device)
    # Warm-up: first calls allocate and pick kernels.
    naive(model, tokenizer, texts[:64], args.device, args.max_length)
    ours(teacher, texts[:64], args.device, args.beam_batch)
    ours(padded, texts[:64], args.device, args.beam_batch)
    t_naive, t_ours, t_padded = [], [], []
    for _ in range(args.repeats):
        t_naive.append(naive(model, tokenizer, texts, args.device, args.max_length))
        t_ours.append(ours(teacher, texts, args.device, args.beam_batch))
        t_padded.append(ours(padded, texts, args.device, args.beam_batch))
    again = matmul_peak(args.device)  # measured again after the runs: the best of both
    peak, peak_cpu = max(peak[0], again[0]), max(peak[1], again[1])
    work = 2 * params * real_tokens  # FLOPs of one pass over the rows

    def figures(runs: list) -> dict:
        wall = min(c.wall for c in runs)
        cpu = min(c.cpu for c in runs)
        return {"seconds": round(wall, 3), "rows_per_s": round(len(texts) / wall, 1),
                "real_tokens_per_s": round(real_tokens / wall, 1), "gflop_per_s": round(work / wall / 1e9, 2),
                "fraction_of_matmul_peak": round(work / wall / peak, 3),
                "cpu_seconds": round(cpu, 3),
                "fraction_of_matmul_peak_cpu_time": round(work / cpu / peak_cpu, 3)}

    result = {
        "device": args.device if args.device != "cpu" else f"cpu ({torch.get_num_threads()} threads, "
                                                            f"{os.cpu_count()} cores)",
        "rows": len(texts), "real_tokens": real_tokens, "naive_padded_tokens": padded_naive,
        "per_token_params": params, "matmul_peak_gflop_per_s": round(peak / 1e9, 2),
        "matmul_peak_gflop_per_cpu_s": round(peak_cpu / 1e9, 2),
        "naive": figures(t_naive), "score_path": figures(t_ours), "padded_path": figures(t_padded),
        "speedup": round(min(c.wall for c in t_naive) / min(c.wall for c in t_ours), 2),
        "speedup_cpu_time": round(min(c.cpu for c in t_naive) / min(c.cpu for c in t_ours), 2),
        "speedup_padded_path": round(min(c.wall for c in t_naive) / min(c.wall for c in t_padded), 2),
        "all_rounds_s": {"naive": [round(c.wall, 3) for c in t_naive],
                         "score_path": [round(c.wall, 3) for c in t_ours],
                         "padded_path": [round(c.wall, 3) for c in t_padded]},
        "settings": {"beam_batch": args.beam_batch, "max_length": args.max_length,
                     "score_path": {"forward": teacher.forward_path,
                                    "kernels": getattr(teacher.packed, "kernels", None),
                                    "forward_rows": teacher.forward_rows, "forward_tokens": teacher.forward_tokens},
                     "padded_path": {"forward_rows": padded.forward_rows, "forward_tokens": padded.forward_tokens}},
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }
    # The targets, for the default scoring path.
    result["targets_met"] = {"speedup_at_least_2.5": result["speedup"] >= 2.5,
                             "fraction_of_peak_at_least_0.80": result["score_path"]["fraction_of_matmul_peak"] >= 0.8}
    if args.pipeline:
        seconds = pipeline_run(teacher_dir, texts, workdir, ["--runner", "FnApiRunner", "--forward", args.forward])
        result["pipeline_end_to_end"] = {"seconds": round(seconds, 2), "rows_per_s": round(len(texts) / seconds, 1),
                                         "note": "includes Beam start-up, model load, Parquet writes"}
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
