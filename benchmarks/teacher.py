"""Benchmark: the teacher's fine-tuning (`trainer`: transferset.teacher.train, on transformers.Trainer until
the shared recipe of transferset/training/ replaced it) against the hand-written loop it replaced.

Same data, same settings, same run, interleaved (loop, Trainer, Trainer, loop, ... so a machine
that gets busier or quieter during the run shifts both alike): each round is a whole
`train(...)` call (data reading, model load, epochs, dev evaluation, save), timed on the wall
clock and in process CPU time. Prints both, the best dev accuracy of each, and the Trainer / loop
ratios. On a shared machine compare CPU times with `--threads 1` (see `cpu_seconds`).

    .venv/bin/python benchmarks/teacher.py                      # 3,000 SST-2 rows, 2 epochs, 2 rounds each
    .venv/bin/python benchmarks/teacher.py --threads 1 --rounds 1

The baseline is the hand-written loop transferset/teacher/train.py held before transformers.Trainer, copied
below with its helpers (`pad_batch` then lived in teacher/scoring.py) and one change: the evaluation result no
longer rebinds the `dev` argument (the bug that wrote {accuracy, loss} as metrics.json's "dev").
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import random
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from transferset import sources  # noqa: E402
from transferset.config import TeacherConfig, TrainerOptimConfig  # noqa: E402
from transferset.contract import schema  # noqa: E402
from transferset.fs.output import Output  # noqa: E402
from transferset.models import loading  # noqa: E402
from transferset.runtime import typed  # noqa: E402
from transferset.runtime.threads import set_torch_threads  # noqa: E402
from transferset.teacher import train as trainer_version  # noqa: E402
from transferset.teacher.train import encode, read_split  # noqa: E402

SST2 = ROOT.parent / "shared" / "data" / "sst2"


# --- the baseline: the hand-written loop -----------------------------------------------------

def pad_batch(features: Sequence[dict[str, list[int]]], pad_values: dict[str, int], padding_side: str = "right"):
    """Pad token-id lists to the longest in this batch; returns torch tensors (B, T)."""
    import torch

    longest = max(len(f["input_ids"]) for f in features)
    out = {}
    for key in features[0]:
        arr = np.full((len(features), longest), pad_values.get(key, 0), dtype=np.int64)
        for i, f in enumerate(features):
            seq = f[key]
            if padding_side == "left":
                arr[i, longest - len(seq):] = seq
            else:
                arr[i, :len(seq)] = seq
        out[key] = torch.from_numpy(arr)
    mask = np.zeros((len(features), longest), dtype=np.int64)
    for i, f in enumerate(features):
        n = len(f["input_ids"])
        if padding_side == "left":
            mask[i, longest - n:] = 1
        else:
            mask[i, :n] = 1
    out["attention_mask"] = torch.from_numpy(mask)
    return out


def length_bucketed_batches(lengths: Sequence[int], batch_size: int, gen, bucket_batches: int = 32) -> list[list[int]]:
    import torch

    perm = torch.randperm(len(lengths), generator=gen).tolist()
    chunk = batch_size * bucket_batches
    batches = []
    for start in range(0, len(perm), chunk):
        part = sorted(perm[start:start + chunk], key=lambda i: lengths[i])
        batches += [part[i:i + batch_size] for i in range(0, len(part), batch_size)]
    order = torch.randperm(len(batches), generator=gen).tolist()
    return [batches[j] for j in order]


def pad_values(tokenizer) -> dict[str, int]:
    return {"input_ids": tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0,
            "token_type_ids": getattr(tokenizer, "pad_token_type_id", 0) or 0}


def evaluate(model, tokenizer, feats: Sequence[dict], labels: Sequence[int], batch_size: int) -> dict:
    import torch

    model.eval()
    order = sorted(range(len(feats)), key=lambda i: len(feats[i]["input_ids"]))
    correct, loss_sum = 0, 0.0
    pads, side = pad_values(tokenizer), getattr(tokenizer, "padding_side", "right")
    with torch.inference_mode():
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            batch = pad_batch([feats[i] for i in idx], pads, side)
            y = torch.tensor([labels[i] for i in idx])
            logits = model(**batch).logits.float()  # (B, C)
            loss_sum += float(torch.nn.functional.cross_entropy(logits, y, reduction="sum"))
            correct += int((logits.argmax(dim=1) == y).sum())
    n = max(len(feats), 1)
    return {"accuracy": correct / n, "loss": loss_sum / n}


def loop_train(cfg: TeacherConfig, *, train: str, dev: str, output: str, log=None) -> dict:
    import torch
    from transformers import get_linear_schedule_with_warmup

    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    os.makedirs(output, exist_ok=True)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    model_path = loading.resolve_model(cfg.model)
    label_names = cfg.labels or sources.infer_label_names(train, cfg.label_column)
    train_data = read_split(train, cfg, label_names)
    dev_data = read_split(dev, cfg, label_names)
    for name, d in (("train", train_data), ("dev", dev_data)):
        if d.rejects:
            Output(output, "teacher").write_rejects(d.rejects, f"{name}.jsonl")
    tokenizer = loading.load_tokenizer(model_path, trust_remote_code=cfg.trust_remote_code)
    model = loading.load_classifier(model_path, allow_pickle=cfg.allow_pickle,
                                    trust_remote_code=cfg.trust_remote_code, label_names=label_names)
    # encode() now also carries each row's label; the loop pads what it is given, so drop it.
    def unlabeled(examples):
        return [{k: v for k, v in f.items() if k != "labels"} for f in encode(tokenizer, examples, cfg.max_length)]

    train_feats = unlabeled(train_data.examples)
    train_labels = [e.label for e in train_data.examples]
    dev_feats = unlabeled(dev_data.examples)
    dev_labels = [e.label for e in dev_data.examples]

    steps_per_epoch = math.ceil(len(train_feats) / cfg.batch_size)
    total_steps = steps_per_epoch * cfg.epochs
    if cfg.max_steps is not None:
        total_steps = min(total_steps, cfg.max_steps)
    no_decay = ("bias", "LayerNorm.weight", "layer_norm.weight", "norm.weight")
    groups = [
        {"params": [p for n, p in model.named_parameters() if not any(s in n for s in no_decay)],
         "weight_decay": cfg.optim.weight_decay},
        {"params": [p for n, p in model.named_parameters() if any(s in n for s in no_decay)], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=cfg.optim.lr)
    scheduler = get_linear_schedule_with_warmup(optimizer, int(cfg.engine.warmup * total_steps), total_steps)
    pads, side = pad_values(tokenizer), getattr(tokenizer, "padding_side", "right")
    gen = torch.Generator().manual_seed(cfg.seed)

    history: list[dict] = []
    best = {"dev_accuracy": -1.0}
    step = 0
    started = time.time()
    for epoch in range(1, cfg.epochs + 1):
        if step >= total_steps:
            break
        model.train()
        losses = []
        for idx in length_bucketed_batches([len(f["input_ids"]) for f in train_feats], cfg.batch_size, gen):
            if step >= total_steps:
                break
            batch = pad_batch([train_feats[i] for i in idx], pads, side)
            y = torch.tensor([train_labels[i] for i in idx])
            logits = model(**batch).logits
            loss = torch.nn.functional.cross_entropy(logits.float(), y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            losses.append(loss.item())
        result = evaluate(model, tokenizer, dev_feats, dev_labels, cfg.eval_batch_size)
        record = {"epoch": epoch, "step": step, "train_loss": float(np.mean(losses)) if losses else None,
                  "dev_accuracy": result["accuracy"], "dev_loss": result["loss"],
                  "elapsed_s": round(time.time() - started, 2)}
        history.append(record)
        improved = result["accuracy"] > best["dev_accuracy"]
        log(f"epoch {epoch}: train loss {record['train_loss']:.4f}, dev accuracy {result['accuracy']:.4f}")
        if improved:
            best = dict(record)
            model.save_pretrained(output)
            tokenizer.save_pretrained(output)
    metrics = {"best_dev_accuracy": best["dev_accuracy"], "best_epoch": best.get("epoch"), "history": history,
               "train_rows": len(train_data.examples), "dev_rows": len(dev_data.examples), "train": train, "dev": dev,
               "config": {k: v for k, v in typed.to_dict(cfg).items() if k != "progress"}}
    with open(os.path.join(output, schema.METRICS_FILE), "w", encoding="utf-8") as fh:
        json.dump(metrics, fh, indent=2, sort_keys=True, default=list)
    return metrics


# --- the run -----------------------------------------------------------------------------------

def cpu_seconds() -> float:
    """CPU time of this process, all threads: on a shared machine it moves far less than the wall
    clock (other processes take cores, not work), most of all with one torch thread, where no
    thread spins waiting for a descheduled sibling."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def head_tsv(src: Path, dst: Path, rows: int) -> str:
    with open(src, encoding="utf-8") as fh, open(dst, "w", encoding="utf-8") as out:
        out.writelines(itertools.islice(fh, rows + 1))  # the header and `rows` rows
    return str(dst)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(SST2), help="directory with train.tsv and dev.tsv")
    ap.add_argument("--rows", type=int, default=3000, help="the first N rows of train.tsv")
    ap.add_argument("--rounds", type=int, default=2, help="runs of each version, interleaved loop/Trainer/Trainer/loop")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--max-length", type=int, default=64)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--seed", type=int, default=0, help="TeacherConfig.seed (head initialisation, batch order)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's, one per core)")
    ap.add_argument("--output", default=None, help="also write the figures to this JSON file")
    args = ap.parse_args(argv)

    import torch

    if args.threads:
        set_torch_threads(args.threads)

    cfg = TeacherConfig(epochs=args.epochs, batch_size=args.batch_size, max_length=args.max_length,
                        optim=TrainerOptimConfig(lr=args.lr), seed=args.seed, progress=False)
    quiet = lambda msg: None  # noqa: E731
    versions = {
        "loop": lambda out: loop_train(cfg, train=train, dev=dev, output=out, log=quiet),
        "trainer": lambda out: trainer_version.train(cfg, train=train, dev=dev, output=out, log=quiet),
    }
    # ABBA order: a drift in the machine's load over the run falls on both versions alike.
    order = [name for r in range(args.rounds) for name in (("loop", "trainer") if r % 2 == 0 else ("trainer", "loop"))]
    runs: dict[str, list[dict]] = {name: [] for name in versions}
    with tempfile.TemporaryDirectory() as tmp:
        train = head_tsv(Path(args.data) / "train.tsv", Path(tmp) / "train.tsv", args.rows)
        dev = str(Path(args.data) / "dev.tsv")
        for i, name in enumerate(order):
            out = os.path.join(tmp, f"{name}-{i}")
            load = os.getloadavg()[0]
            t0, c0 = time.perf_counter(), cpu_seconds()
            metrics = versions[name](out)
            wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
            leftovers = sorted(n for n in os.listdir(out) if n.startswith((".trainer-", "checkpoint-")))
            run = {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "best_dev_accuracy": metrics["best_dev_accuracy"],
                   "dev_accuracy_per_epoch": [h["dev_accuracy"] for h in metrics["history"]],
                   "load_before": round(load, 2), "leftover_checkpoints": leftovers}
            runs[name].append(run)
            print(f"{name:8s} round {len(runs[name])}: {run['wall_s']:7.1f} s wall, {run['cpu_s']:7.1f} s CPU, "
                  f"best dev accuracy {run['best_dev_accuracy']:.4f} (per epoch {run['dev_accuracy_per_epoch']}), "
                  f"load average before {load:.2f}", file=sys.stderr, flush=True)

    def summary(name):
        walls, cpus = [r["wall_s"] for r in runs[name]], [r["cpu_s"] for r in runs[name]]
        return {"wall_s_median": statistics.median(walls), "wall_s": walls,
                "cpu_s_median": statistics.median(cpus), "cpu_s": cpus,
                "best_dev_accuracy": [r["best_dev_accuracy"] for r in runs[name]]}

    res = {
        "rows": args.rows, "epochs": args.epochs, "batch_size": args.batch_size, "max_length": args.max_length,
        "lr": args.lr, "seed": args.seed, "model": cfg.model, "torch_threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "loop": summary("loop"), "trainer": summary("trainer"), "runs": runs,
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
    }
    res["ratio_trainer_over_loop"] = round(res["trainer"]["wall_s_median"] / res["loop"]["wall_s_median"], 3)
    res["cpu_ratio_trainer_over_loop"] = round(res["trainer"]["cpu_s_median"] / res["loop"]["cpu_s_median"], 3)
    print(json.dumps(res, indent=2))
    if args.output:
        with open(args.output, "w", encoding="utf-8") as fh:
            json.dump(res, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
