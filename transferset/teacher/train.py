"""Fine-tuning a Hugging Face encoder as the teacher: setup → data → loss step → train → evaluate → save."""
from __future__ import annotations

import json
import math
import os
import random
import sys
import time
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from transferset import typed
from transferset import schema, sources
from transferset.config import TeacherConfig
from transferset.errors import UserError
from transferset.sources import Example, Reject, SourceSpec
from transferset import loading
from transferset.teacher.scoring import pad_batch

METRICS_FILE = schema.METRICS_FILE  # kept: tests and callers import it from here


@dataclass
class Data:
    examples: list[Example]
    rejects: list[Reject] = field(default_factory=list)


def read_split(path: str, cfg: TeacherConfig, label_names: Sequence[str]) -> Data:
    spec = SourceSpec(path=path, text_column=cfg.text_column, label_column=cfg.label_column,
                      text_b_column=cfg.text_b_column, limit=cfg.limit, label_names=tuple(label_names))
    data = Data([])
    for rec in sources.read_source(spec):
        (data.rejects if isinstance(rec, Reject) else data.examples).append(rec)
    if not data.examples:
        if data.rejects:
            raise UserError(sources.summarize_rejects(path, data.rejects))
        raise UserError(f"{path}: no rows")
    return data


def write_rejects(out_dir: str, name: str, rejects: Sequence[Reject]) -> Optional[str]:
    if not rejects:
        return None
    os.makedirs(os.path.join(out_dir, schema.REJECTS_DIR), exist_ok=True)
    path = os.path.join(out_dir, schema.REJECTS_DIR, f"{name}.jsonl")
    with open(path, "w", encoding="utf-8") as fh:
        for r in rejects:
            fh.write(json.dumps(r.to_dict(), ensure_ascii=False) + "\n")
    return path


def encode(tokenizer, examples: Sequence[Example], max_length: int) -> list[dict]:
    texts = [e.text for e in examples]
    if any(e.text_b is not None for e in examples):
        enc = tokenizer(texts, [e.text_b or "" for e in examples], truncation=True, max_length=max_length)
    else:
        enc = tokenizer(texts, truncation=True, max_length=max_length)
    keys = [k for k in enc.keys() if k != "attention_mask"]
    return [{k: enc[k][i] for k in keys} for i in range(len(texts))]


def length_bucketed_batches(lengths: Sequence[int], batch_size: int, gen, bucket_batches: int = 32) -> list[list[int]]:
    """One epoch of shuffled batches whose rows have similar lengths.

    Rows are shuffled, then sorted by length within chunks of `bucket_batches` batches, cut into
    batches, and the batch order is shuffled again: each batch pads little (a batch costs what its
    longest row costs), and what a batch holds still changes from epoch to epoch.
    """
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
    """Dev accuracy and mean cross-entropy; rows sorted by length so padding stays small."""
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


def train(cfg: TeacherConfig, *, train: str, dev: str, output: str, overwrite: bool = False, log=None) -> dict:
    """Fine-tune on `train`; keep the best `dev` checkpoint in `output`; return the metrics written to metrics.json."""
    import torch
    from transformers import get_linear_schedule_with_warmup
    from tqdm.auto import tqdm

    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    if os.path.exists(os.path.join(output, "config.json")) and not overwrite:
        raise UserError(f"{output} already holds a model (config.json present); "
                        "pass --overwrite to replace it or choose another --output")
    for flag, path in (("--train", train), ("--dev", dev)):
        if not path.startswith(sources.HF_PREFIX) and not os.path.isfile(path):
            raise UserError(f"{flag} {path}: no such file")
    os.makedirs(output, exist_ok=True)

    # --- setup ---------------------------------------------------------------------------
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)  # the new classification head is initialised from this
    model_path = loading.resolve_model(cfg.model)
    label_names = cfg.labels or sources.infer_label_names(train, cfg.label_column)

    # --- data ------------------------------------------------------------------------------
    train_data = read_split(train, cfg, label_names)
    dev_data = read_split(dev, cfg, label_names)
    reject_files = {name: write_rejects(output, name, d.rejects)
                    for name, d in (("train", train_data), ("dev", dev_data))}
    for name, d in (("train", train_data), ("dev", dev_data)):
        if d.rejects:
            first = d.rejects[0]
            log(f"{name}: {len(d.rejects)} row(s) rejected, see {reject_files[name]} "
                f"(first: line {first.line}: {first.reason})")
    log(f"train rows {len(train_data.examples)}, dev rows {len(dev_data.examples)}, labels {list(label_names)}")

    tokenizer = loading.load_tokenizer(model_path, trust_remote_code=cfg.trust_remote_code)
    model = loading.load_classifier(model_path, allow_pickle=cfg.allow_pickle,
                                    trust_remote_code=cfg.trust_remote_code, label_names=label_names)
    train_feats = encode(tokenizer, train_data.examples, cfg.max_length)
    train_labels = [e.label for e in train_data.examples]
    dev_feats = encode(tokenizer, dev_data.examples, cfg.max_length)
    dev_labels = [e.label for e in dev_data.examples]

    steps_per_epoch = math.ceil(len(train_feats) / cfg.batch_size)
    total_steps = steps_per_epoch * cfg.epochs
    if cfg.max_steps is not None:
        total_steps = min(total_steps, cfg.max_steps)
    no_decay = ("bias", "LayerNorm.weight", "layer_norm.weight", "norm.weight")
    groups = [
        {"params": [p for n, p in model.named_parameters() if not any(s in n for s in no_decay)],
         "weight_decay": cfg.weight_decay},
        {"params": [p for n, p in model.named_parameters() if any(s in n for s in no_decay)], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=cfg.lr)
    scheduler = get_linear_schedule_with_warmup(optimizer, int(cfg.warmup * total_steps), total_steps)
    pads, side = pad_values(tokenizer), getattr(tokenizer, "padding_side", "right")
    gen = torch.Generator().manual_seed(cfg.seed)

    # --- train -----------------------------------------------------------------------------
    history: list[dict] = []
    best = {"dev_accuracy": -1.0}
    step = 0
    started = time.time()
    show = cfg.progress if cfg.progress is not None else None  # tqdm: None = only on a terminal
    bar = tqdm(total=total_steps, desc="fine-tuning", unit="step", disable=None if show is None else not show)
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
            # --- loss step ---
            logits = model(**batch).logits
            loss = torch.nn.functional.cross_entropy(logits.float(), y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            losses.append(loss.item())
            bar.update(1)
            bar.set_postfix(loss=f"{losses[-1]:.4f}", epoch=epoch)
        # --- evaluate ---
        dev = evaluate(model, tokenizer, dev_feats, dev_labels, cfg.eval_batch_size)
        record = {"epoch": epoch, "step": step, "train_loss": float(np.mean(losses)) if losses else None,
                  "dev_accuracy": dev["accuracy"], "dev_loss": dev["loss"],
                  "elapsed_s": round(time.time() - started, 2)}
        history.append(record)
        improved = dev["accuracy"] > best["dev_accuracy"]
        log(f"epoch {epoch}: train loss {record['train_loss']:.4f}, dev accuracy {dev['accuracy']:.4f}"
            + (" (best so far, saved)" if improved else ""))
        # --- save ---
        if improved:
            best = dict(record)
            model.save_pretrained(output)  # safetensors; id2label travels in config.json
            tokenizer.save_pretrained(output)
    bar.close()

    metrics = {
        "best_dev_accuracy": best["dev_accuracy"],
        "best_epoch": best.get("epoch"),
        "best_step": best.get("step"),
        "history": history,
        "label_names": list(label_names),
        "train_rows": len(train_data.examples),
        "dev_rows": len(dev_data.examples),
        "rejected": {"train": len(train_data.rejects), "dev": len(dev_data.rejects)},
        "base_model": cfg.model,
        "base_model_path": model_path,
        "max_length": cfg.max_length,
        "weights_sha256": loading.weights_sha256(output),
        "train": train,
        "dev": dev,
        "config": {k: v for k, v in typed.to_dict(cfg).items() if k != "progress"},
    }
    with open(os.path.join(output, METRICS_FILE), "w", encoding="utf-8") as fh:
        json.dump(metrics, fh, indent=2, sort_keys=True, default=list)
        fh.write("\n")
    return metrics


def trained_max_length(teacher_dir: str) -> Optional[int]:
    """The max_length a `transferset teacher` run used, from its metrics.json (None if absent)."""
    path = os.path.join(teacher_dir, METRICS_FILE)
    try:
        with open(path, encoding="utf-8") as fh:
            value = json.load(fh).get("max_length")
        return int(value) if value else None
    except (OSError, ValueError, TypeError):
        return None
