"""Train a student from a scored transfer set: setup → loss step → train → evaluate → save.

The teacher's logits and hidden states come from the Parquet cache (students/data.py); it runs
alongside the student only for the token-level layer losses (students/online.py). What differs
between students (the model, its parameter groups, what it is initialised from, how it is saved) is
looked up in the family registry (students/build.py).
Every random stream derives from the run's seed (students/seeds.py).
"""
from __future__ import annotations

import copy
import json
import math
import os
import time
from dataclasses import asdict

import numpy as np
import torch
from tqdm import tqdm

from students import online, seeds
from students.build import Setup, setup
from students.data import EvalData, iter_train_batches, read_eval_data
from students.family import project
from students.losses import NO_LABEL, LossWeights, combine
from students.plots import plot_curves
from students.schedules import Phase, phases
from students.student import Student, accuracy
from transferset import fs, schema, sources, timing, transfer, typed
from transferset.config import DEFAULT_LR, StudentConfig
from transferset.errors import UserError
from transferset.fs.output import STUDENT_NAMES, Output


# --------------------------------------------------------------------------- loss step


def set_trainable(s: Setup, phase: Phase) -> list[torch.nn.Parameter]:
    """Apply the phase's freezing (and `freeze_embeddings`); return the parameters that learn."""
    groups = s.family.param_groups(s.model)
    unknown = set(phase.trainable) - set(groups)
    if unknown:
        raise ValueError(f"phase {phase.name!r} names unknown parameter groups {sorted(unknown)}")
    trainable = set(phase.trainable) - ({"embeddings"} if s.cfg.frozen_embeddings() else set())
    learn = []
    for name, params in groups.items():
        for p in params:
            p.requires_grad_(name in trainable)
            if name in trainable:
                learn.append(p)
    if s.projection is not None:
        # It learns in every phase; only a repr / pkd loss gives it a gradient (AdamW skips the rest).
        learn += list(s.projection.parameters())
    return learn + online.parameters(s)  # W_h of the layer losses, likewise


def make_optimizer(s: Setup, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    # A fresh optimiser per phase holding only the trainable parameters: frozen ones then stay
    # bit-identical (AdamW's decoupled weight decay would otherwise still move them).
    lr = s.cfg.lr if s.cfg.lr is not None else DEFAULT_LR[s.family.name]
    return torch.optim.AdamW(params, lr=lr, weight_decay=s.cfg.weight_decay)


def train_step(s: Setup, optimizer, batch, weights: LossWeights) -> tuple[float, dict]:
    s.model.train()
    # With a layer loss active, the student's token-level states and the online teacher's (students/online.py).
    loss, parts = combine(project(online.forward(s, batch, weights), s.projection), batch, weights)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if s.cfg.grad_clip:
        torch.nn.utils.clip_grad_norm_([p for g in optimizer.param_groups for p in g["params"]], s.cfg.grad_clip)
    optimizer.step()
    return float(loss.detach()), parts


def train_batches(s: Setup, transfer_dir: str, seed, labeled_only: bool = False):
    """One epoch of the run's minibatches (students.data.iter_train_batches with its settings)."""
    return iter_train_batches(transfer_dir, s.tokens, seed, batch_size=s.cfg.batch_size,
                              shuffle_rows=s.cfg.shuffle_rows, pkd_columns=s.pkd_columns,
                              labeled_only=labeled_only)


# --------------------------------------------------------------------------- train


def train_phase(s: Setup, student: Student, phase: Phase, p_index: int, transfer_dir: str, dev: EvalData,
                history: list[dict], progress: bool) -> dict:
    """Train one phase (epochs, early stopping on dev); append its epochs to `history`; → its log entry."""
    cfg = s.cfg
    optimizer = make_optimizer(s, set_trainable(s, phase))
    best_acc, best_state, bad, run, start_acc = -1.0, None, 0, 0, None
    if phase.early_stop:
        # The model as it enters the step competes too: a step that never beats it on dev
        # leaves it unchanged rather than keep its least bad epoch.
        start_acc = accuracy(student.predict_ids(dev.texts, dev.texts_b), dev.labels)
        best_acc, best_state = start_acc, copy.deepcopy(s.model.state_dict())
    rows = s.num_labeled if phase.labeled_only else s.num_rows
    for epoch in range(phase.epochs):
        t0 = time.perf_counter()
        total, parts_sum, n, seen = 0.0, {}, 0, 0
        batches = train_batches(s, transfer_dir, seeds.stream(cfg.seed, seeds.SHUFFLE, p_index, epoch),
                                labeled_only=phase.labeled_only)
        bar = tqdm(batches, total=math.ceil(rows / cfg.batch_size), desc=f"{phase.name} ep {epoch + 1}/{phase.epochs}",
                   disable=None if progress else True, leave=False, dynamic_ncols=True)  # None: no bar off a terminal
        for batch in bar:
            loss, parts = train_step(s, optimizer, batch, phase.weights)
            total, n, seen = total + loss, n + 1, seen + len(batch[schema.LABEL])
            for k, v in parts.items():
                parts_sum[k] = parts_sum.get(k, 0.0) + v
            if n % 10 == 0:
                bar.set_postfix(loss=f"{total / n:.4f}")
        bar.close()
        train_seconds = time.perf_counter() - t0
        dev_acc = accuracy(student.predict_ids(dev.texts, dev.texts_b), dev.labels)
        run += 1
        record = {"phase": phase.name, "stage": phase.stage, "epoch": epoch + 1,
                  "train_loss": total / max(1, n), "losses": {k: v / max(1, n) for k, v in parts_sum.items()},
                  "dev_accuracy": dev_acc, "seconds": time.perf_counter() - t0, "rows": seen,
                  "rows_per_second": seen / max(train_seconds, 1e-9), "trainable": list(phase.trainable)}
        history.append(record)
        if progress:
            tqdm.write(f"{phase.name} epoch {epoch + 1}: loss {record['train_loss']:.4f} "
                       f"dev acc {dev_acc:.4f} ({record['seconds']:.1f}s)")
        if not phase.early_stop:
            continue
        if dev_acc > best_acc:
            best_acc, bad, best_state = dev_acc, 0, copy.deepcopy(s.model.state_dict())
        else:
            bad += 1
            if bad >= cfg.patience:
                break
    if best_state is not None:
        s.model.load_state_dict(best_state)  # each step keeps its best dev checkpoint
    return {"phase": phase.name, "stage": phase.stage, "epochs_run": run, "start_dev_accuracy": start_acc,
            "best_dev_accuracy": best_acc if phase.early_stop else None,
            "trainable": list(phase.trainable), "losses": phase.weights.active()}


# --------------------------------------------------------------------------- evaluate


def teacher_agreement_on_transfer(student: Student, transfer_dir: str, limit: int) -> tuple[float, int]:
    texts, texts_b, teacher = [], [], []
    for rb in transfer.iter_batches(transfer_dir, [schema.TEXT, schema.TEXT_B, schema.TEACHER_LABEL]):
        texts += rb.column(0).to_pylist()
        texts_b += rb.column(1).to_pylist()
        teacher += rb.column(2).to_pylist()
        if len(texts) >= limit:
            break
    texts, texts_b, teacher = texts[:limit], texts_b[:limit], teacher[:limit]
    pred = student.predict_ids(texts, texts_b if any(t is not None for t in texts_b) else None)
    return float((pred == np.asarray(teacher)).mean()), len(texts)


TRAINING_LATENCY_NOTE = ("CPU ms per example, tokenization included, this student alone at training time; "
                         "compare models with the run report (report.html, results.json): it times them together")


def evaluate_run(s: Setup, student: Student, transfer_dir: str, dev: EvalData) -> dict:
    cfg = s.cfg
    timed = timing.measure({"student": student.logits}, dev.texts[:cfg.latency_examples])
    dev_pred = student.predict_ids(dev.texts, dev.texts_b)
    if dev.teacher_labels is not None:
        agreement, agreement_on = float((dev_pred == dev.teacher_labels).mean()), f"dev ({len(dev.texts)} rows)"
    else:
        agreement, n_rows = teacher_agreement_on_transfer(student, transfer_dir, cfg.agreement_rows)
        agreement_on = f"transfer set, first {n_rows} rows (training rows: dev has no teacher columns)"
    dev_counts = np.bincount(dev.labels[dev.labels != NO_LABEL], minlength=len(s.label_names))
    return {
        "student": s.family.name,
        "schedule": cfg.schedule,
        "dev": dev.path,
        "dev_rows": int(len(dev.texts)),
        "dev_accuracy": accuracy(dev_pred, dev.labels),
        "dev_majority_baseline": float(dev_counts.max() / max(1, dev_counts.sum())),
        "teacher_agreement": agreement,
        "teacher_agreement_on": agreement_on,
        "parameters": student.num_parameters(),
        # This student alone, at training time, with the load it ran under: not a figure to set against
        # another model's taken at another time (the run report times every model together).
        "latency_ms_per_example": {key: cell["median"] for key, cell in timed["latency"]["student"].items()},
        "latency_conditions": {**timed["conditions"], "note": TRAINING_LATENCY_NOTE},
        "transfer": {"dir": transfer_dir, "rows": s.num_rows, "labeled_rows": s.num_labeled,
                     "teacher_id": s.meta.get(schema.META_TEACHER_ID)},
        "config": typed.to_dict(cfg),
        "model_config": asdict(s.model_config),
    }


# --------------------------------------------------------------------------- the whole run


def require_input(path: str, flag: str) -> None:
    """A missing data file is the user's to fix: say which flag points where."""
    if not path.startswith(sources.HF_PREFIX) and not fs.exists(path):
        raise UserError(f"{flag} {path}: no such file or directory; check the path (a labeled "
                        ".tsv/.csv/.jsonl/.parquet file or a scored transfer-set directory)")


def train(cfg: StudentConfig, transfer_dir: str, dev_path: str, output: str, *, overwrite: bool = False,
          progress: bool = True) -> dict:
    """Train a student; write OUTPUT/model/, OUTPUT/metrics.json, OUTPUT/curves.png, then OUTPUT/_COMPLETE;
    return the metrics. OUTPUT (local or a URL) is written as transferset.fs.output says: owned while the
    run lasts, refused when complete (without `overwrite`) or holding others' files, touched only at save."""
    out = Output(output, "train", names=STUDENT_NAMES, overwrite=overwrite, inputs=[transfer_dir, dev_path])
    with out.open():
        out.check()
        return _train(cfg, transfer_dir, dev_path, out, progress)


def _train(cfg: StudentConfig, transfer_dir: str, dev_path: str, out: Output, progress: bool) -> dict:
    # ---- setup: a set whose scoring did not finish is refused; the dev data is checked against
    # the set's label names before the (longer) setup.
    transfer.data_files(transfer_dir)  # a folder holding no transfer set at all says so first
    require_input(dev_path, "--dev")
    transfer.require_complete(transfer_dir, allow_incomplete=cfg.allow_incomplete)
    dev = read_eval_data(dev_path, transfer.label_names(transfer_dir, scored=True),
                         text_b_column=cfg.dev_text_b_column)
    s = setup(cfg, transfer_dir)
    student = Student.from_setup(s)
    try:
        plan = phases(cfg.schedule, LossWeights.of(cfg), cfg.epochs, s.family.param_groups(s.model).keys())
    except ValueError as exc:
        raise UserError(str(exc)) from exc

    # ---- train
    history: list[dict] = []
    phase_log: list[dict] = []
    started = time.perf_counter()
    # Dropout draws from torch's global generator: seed it from the run's stream, and give the
    # caller's random state back afterwards.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seeds.torch_seed(seeds.stream(cfg.seed, seeds.DROPOUT)))
        for p_index, phase in enumerate(plan):
            if phase.labeled_only and s.num_labeled == 0:
                phase_log.append({"phase": phase.name, "stage": phase.stage,
                                  "skipped": "the transfer set has no row with a gold label"})
                continue
            phase_log.append(train_phase(s, student, phase, p_index, transfer_dir, dev, history, progress))
    train_seconds = time.perf_counter() - started
    for p in s.model.parameters():
        p.requires_grad_(True)

    # ---- evaluate
    metrics = evaluate_run(s, student, transfer_dir, dev)
    trained = sum(h["rows"] for h in history)
    # Rows per second of the training steps alone (dev evaluation after each epoch excluded).
    step_seconds = sum(h["rows"] / h["rows_per_second"] for h in history if h["rows"])
    metrics.update(train_seconds=train_seconds, train_rows=trained,
                   train_rows_per_second=trained / step_seconds if step_seconds else None,
                   phases=phase_log, history=history)

    # ---- save: only now is anything under the output changed (transferset.fs.output)
    out.prepare()
    with out.local() as output:
        student.save_pretrained(os.path.join(output, schema.STUDENT_MODEL_DIR))
        with open(os.path.join(output, schema.METRICS_FILE), "w", encoding="utf-8") as fh:
            json.dump(metrics, fh, indent=2)
        if history:
            plot_curves(history, os.path.join(output, schema.CURVES_FILE))
    out.finish()
    return metrics
