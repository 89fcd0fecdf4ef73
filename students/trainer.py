"""Train a student from a scored transfer set: setup → loss step → train → evaluate → save.

The teacher's logits and hidden states come from the Parquet cache (students/data/__init__.py); it runs
alongside the student only for the token-level layer losses (students/losses/online.py). What differs
between students (the model, its parameter groups, what it is initialised from, how it is saved) is
looked up in the family registry (students/build.py).
Every random stream derives from the run's seed (students/seeds.py).

The loop is the recipe the teacher trains with too (transferset/training/, on Accelerate): each
phase of the phase plan (students/phases.py) is one run of it, with its own optimizer over the
parameter groups that phase trains, and its own learning-rate schedule. The engine section (device,
precision, gradient accumulation, schedule, tracker), checkpoints and `resume` come from the StudentConfig;
the process count from the launcher (`torchrun`), each rank streaming its own rows. The output, rank 0,
staging, the engine, tracking, metrics.json and the model card are the job shell's (transferset/training/job.py).
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict
from typing import Iterable, Iterator, Optional

import numpy as np
import torch

from students import families, seeds
from students.build import Setup, setup
from students.data import NO_LABEL, EvalData, ScoredSet, count_rows, iter_train_batches, read_eval_data
from students.families import project
from students.losses import LossWeights, canonical, combine
from students.losses import online
from students.plots import plot_curves
from students.phases import Phase, phases
from students.student import Student, accuracy
from transferset import fs, sources
from transferset.config import LAYER_TEXTS_REST, StudentConfig
from transferset.contract import schema
from transferset.data import transfer
from transferset.fs.output import STUDENT_NAMES
from transferset.runtime import timing, typed
from transferset.runtime.errors import UserError
from transferset.runtime.progress import log_line
from transferset.training import Engine, PhaseSpec, Recipe
from transferset.training.job import CHECKPOINT_DIR, Job, JobPhase, JobRun, Skipped, run_job
from transferset.training.optimizers import Optimizers


# --------------------------------------------------------------------------- loss step


def set_trainable(s: Setup, phase: Phase) -> list[torch.nn.Parameter]:
    """Apply the phase's freezing (and `freeze_embeddings`); return the parameters that learn."""
    groups = s.family.param_groups(s.model)
    unknown = set(phase.trainable) - set(groups)
    if unknown:
        raise ValueError(f"phase {phase.name!r} names unknown parameter groups {sorted(unknown)}")
    trainable = set(phase.trainable) - ({"embeddings"} if families.frozen_embeddings(s.cfg) else set())
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
    return optimizer_for(s.model, s.family, s.cfg, params)


def optimizer_for(model: torch.nn.Module, family, cfg: StudentConfig, params: list) -> torch.optim.Optimizer:
    """The optimizer of a phase over `params` (the run's calibration times a step with it too)."""
    # A fresh optimiser per phase holding only the trainable parameters: frozen ones then stay
    # bit-identical (AdamW's decoupled weight decay would otherwise still move them).
    opt = cfg.optim
    lr = opt.lr if opt.lr is not None else family.default_lr
    sparse = any(isinstance(m, torch.nn.Embedding) and m.sparse for m in model.modules())
    if opt.embed_lr is None and not sparse:
        return torch.optim.AdamW(params, lr=lr, weight_decay=opt.weight_decay)
    table = {id(p) for p in family.param_groups(model).get("embeddings", [])}
    rows = [p for p in params if id(p) in table]
    rest = [p for p in params if id(p) not in table]
    table_lr = opt.embed_lr if opt.embed_lr is not None else lr  # a pretrained table can learn slower
    if sparse and rows:
        # `model: {sparse: true}`: lazy Adam over the rows a batch used (students/families/bilstm.check_sparse)
        return Optimizers([torch.optim.SparseAdam(rows, lr=table_lr),
                           torch.optim.AdamW(rest, lr=lr, weight_decay=opt.weight_decay)])
    groups = [{"params": rest}, {"params": rows, "lr": table_lr}]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=lr, weight_decay=opt.weight_decay)


class Trained(torch.nn.Module):
    """The student, its width projection and the online teacher's W_h (students/losses/online.py) as one module:
    what DDP wraps, what a batch goes through."""

    def __init__(self, s: Setup):
        super().__init__()
        self.model, self.projection, self.family = s.model, s.projection, s.family
        self.online = getattr(s, "online", None)  # holds the teacher outside its parameters

    def forward(self, batch, weights: Optional[LossWeights] = None) -> dict:
        # students.losses.online.forward decides: the family's forward, or with a layer loss active the
        # token-level states (the teacher's added to `batch`); `self` has the Setup's model/family/online.
        return project(online.forward(self, batch, weights), self.projection)


def loss_step(net: torch.nn.Module, batch, weights: LossWeights) -> tuple[torch.Tensor, dict]:
    """batch → (loss, {term: value}): the one place a student's training loss is computed.

    `net` is `Trained` (or DDP around it). Losses that need more than the cached teacher columns
    (a teacher run alongside, token-level targets) plug in here.
    """
    return combine(net(batch, weights), batch, weights)


def fit(s: Setup, phase: Phase, batches: Iterable[dict], engine: Optional[Engine] = None) -> list[tuple[float, dict]]:
    """`phase` trained on `batches` through the recipe, as `train` trains it (one epoch, no selection split,
    one optimizer for them all, the engine of `s.cfg` unless given); → each batch's (loss, {term: value}).
    What benchmarks/train.py times, and what the tests step a student with."""
    engine = engine or Engine.create(families.settled(s.cfg).engine, log=lambda msg: None, progress_bar=False)
    seen: list[tuple[float, dict]] = []

    def recorded(net, batch):
        loss, parts = loss_step(net, batch, phase.weights)
        seen.append((float(loss.detach()), parts))
        return loss, parts

    spec = PhaseSpec(phase.name, 1, keep_best=False, grad_clip=s.cfg.optim.grad_clip)
    if engine.cfg.schedule != "constant" or engine.cfg.warmup:
        batches = list(batches)
        spec.steps_per_epoch = len(batches)
    Recipe(engine).run(0, spec, Trained(s), recorded, lambda epoch: iter(batches), None,
                       lambda: make_optimizer(s, set_trainable(s, phase)))
    return seen


def train_batches(s: Setup, transfer_dir: str, seed, labeled_only: bool = False, rank: int = 0, world: int = 1,
                  text_only: bool = False, needs=None):
    """One epoch of the run's minibatches (students.data.iter_train_batches with its settings): with
    several processes, this rank's rows of it; `needs`: what the phase's losses read (None: every cached column)."""
    return iter_train_batches(transfer_dir, s.tokens, seed, batch_size=s.cfg.batch_size,
                              shuffle_rows=s.cfg.data.shuffle_rows, pkd_columns=s.pkd_columns,
                              labeled_only=labeled_only, rank=rank, world=world, text_only=text_only, needs=needs)


def reads_layer_texts(phase: Phase) -> bool:
    """Whether a phase trains on layer losses alone (the teacher online, no cached column): the phases
    StudentConfig.layer_texts feeds."""
    active = phase.weights.active()
    return bool(active) and set(active) <= set(phase.weights.layer_active())


def check_layer_texts(cfg: StudentConfig, plan: list[Phase]) -> Optional[int]:
    """Refuse `layer_texts` where no phase reads it, or a set that is not there or not complete; → its rows."""
    if cfg.layer_texts is None:
        return None
    if not any(reads_layer_texts(p) for p in plan):
        raise UserError(f"layer_texts {cfg.layer_texts}: only the phases that train on layer losses alone read it "
                        "(two-step's intermediate step, pkt's layer stages), and this student's plan "
                        f"({cfg.phases}) has none; use phases: two-step or pkt with a layer loss, or drop layer_texts")
    if cfg.layer_texts == LAYER_TEXTS_REST:
        raise UserError(f"layer_texts {LAYER_TEXTS_REST}: a run config's setting (`transferset run` makes that set "
                        "from its train file's rows no pool took); here give a transfer set's directory")
    require_input(cfg.layer_texts, "layer_texts")
    transfer.data_files(cfg.layer_texts)
    transfer.require_complete(cfg.layer_texts)
    rows, _ = count_rows(cfg.layer_texts)
    if rows == 0:
        raise UserError(f"layer_texts {cfg.layer_texts}: the set has no rows")
    return rows


# --------------------------------------------------------------------------- train


def phase_run(s: Setup, engine: Engine, phase: Phase, p_index: int, transfer_dir: str, evaluate,
              layer_rows: Optional[int] = None) -> JobPhase:
    """One phase of the phase plan as one run of the recipe (students.phases decides what learns).
    `layer_rows`: the rows of StudentConfig.layer_texts, which a phase on layer losses alone reads instead."""
    cfg = s.cfg
    text_only = layer_rows is not None and reads_layer_texts(phase)
    if text_only:
        transfer_dir = cfg.layer_texts
    rows = s.num_labeled if phase.labeled_only else layer_rows if text_only else s.num_rows
    spec = PhaseSpec(phase.name, phase.epochs, keep_best=phase.early_stop,
                     patience=cfg.patience if phase.early_stop else None, start_competes=phase.early_stop,
                     grad_clip=cfg.optim.grad_clip, ema=cfg.optim.ema,
                     steps_per_epoch=max(1, math.ceil(rows / cfg.batch_size) // engine.world))

    def batches(epoch: int):
        return train_batches(s, transfer_dir, seeds.stream(cfg.seed, seeds.SHUFFLE, p_index, epoch),
                             labeled_only=phase.labeled_only, rank=engine.rank, world=engine.world,
                             text_only=text_only, needs=phase.weights.needs())

    def new_optimizer():
        return make_optimizer(s, set_trainable(s, phase))

    return JobPhase(spec, Trained(s), lambda net, batch: loss_step(net, batch, phase.weights), batches, evaluate,
                       new_optimizer, describe={"stage": phase.stage, "trainable": list(phase.trainable),
                                                **({"rows_from": transfer_dir} if text_only else {})},
                       logged={"losses": phase.weights.active()})


def plan_phases(s: Setup, engine: Engine, plan: list[Phase], transfer_dir: str, evaluate,
                layer_rows: Optional[int]) -> Iterator[JobPhase | Skipped]:
    """Every phase of the plan, as the shell runs them (a phase on gold labels alone skipped without any)."""
    for p_index, phase in enumerate(plan):
        if phase.labeled_only and s.num_labeled == 0:
            yield Skipped({"phase": phase.name, "stage": phase.stage,
                           "skipped": "the transfer set has no row with a gold label"})
        else:
            yield phase_run(s, engine, phase, p_index, transfer_dir, evaluate, layer_rows)


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
    timed = timing.measure({"student": student.logits}, dev.texts[:cfg.report.latency_examples])
    dev_pred = student.predict_ids(dev.texts, dev.texts_b)
    if dev.teacher_labels is not None:
        agreement, agreement_on = float((dev_pred == dev.teacher_labels).mean()), f"dev ({len(dev.texts)} rows)"
    else:
        agreement, n_rows = teacher_agreement_on_transfer(student, transfer_dir, cfg.report.agreement_rows)
        agreement_on = f"transfer set, first {n_rows} rows (training rows: dev has no teacher columns)"
    dev_counts = np.bincount(dev.labels[dev.labels != NO_LABEL], minlength=len(s.label_names))
    return {
        "student": s.family.name,
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
    return the metrics. `progress`: a bar on a terminal; False, never a bar, a line every 30 s instead
    (the epoch lines print either way). OUTPUT (local or a URL) is written as transferset.fs.output says: owned while the
    run lasts, refused when complete (without `overwrite`) or holding others' files; what an earlier run
    wrote is cleared once every check passed, just before training (a resumed run keeps its checkpoint/).

    Under `torchrun` / `accelerate launch` every process trains on its own rows and rank 0 alone owns
    the output, evaluates and writes; the other ranks return {"rank": r}.
    """
    return run_job(StudentJob(cfg, transfer_dir, dev_path, progress), output, inputs=[transfer_dir, dev_path],
                   overwrite=overwrite)


class StudentJob(Job):
    """A student's training as a job of the shell (transferset.training.job): the phase plan's phases."""

    command, project, card, where = "train", "transferset-train", True, "student engine"
    names = (*STUDENT_NAMES, CHECKPOINT_DIR)

    def __init__(self, cfg: StudentConfig, transfer_dir: str, dev_path: str, progress: bool):
        cfg = families.settled(cfg)  # the family's engine where the settings leave it unset
        super().__init__(cfg.engine, log_line)
        self.cfg, self.transfer_dir, self.dev_path = cfg, transfer_dir, dev_path
        self.resume, self.checkpoint_steps = cfg.resume, cfg.checkpoint_steps
        self.progress_bar = None if progress else False
        # Dropout draws from torch's global generator: seeded from the run's stream, carried on by checkpoints.
        self.seed = seeds.torch_seed(seeds.stream(cfg.seed, seeds.DROPOUT))

    def check(self) -> None:
        """setup: a set whose scoring did not finish is refused; the dev data is checked against the set's
        label names before the (longer) setup."""
        cfg = self.cfg
        transfer.data_files(self.transfer_dir)  # a folder holding no transfer set at all says so first
        require_input(self.dev_path, "--dev")
        scored = ScoredSet.open(self.transfer_dir, allow_incomplete=cfg.data.allow_incomplete)  # the one check of the set
        self.dev = read_eval_data(self.dev_path, scored.label_names, text_b_column=cfg.data.dev_text_b_column)
        self.s = s = setup(cfg, scored)
        self.student = Student.from_setup(s)
        try:
            self.plan = phases(cfg.phases, LossWeights.of(cfg), cfg.epochs, s.family.param_groups(s.model).keys(),
                               cfg.layer_epochs)
        except ValueError as exc:
            raise UserError(str(exc)) from exc
        self.layer_rows = check_layer_texts(cfg, self.plan)

    def fingerprint(self, engine: Engine) -> dict:
        return fingerprint(self.cfg, self.transfer_dir, self.dev_path, engine)

    def tracked(self) -> dict:
        return typed.to_dict(self.cfg)

    def selection_accuracy(self) -> dict:
        return {"accuracy": accuracy(self.student.predict_ids(self.dev.texts, self.dev.texts_b), self.dev.labels)}

    def phases(self, engine: Engine):
        return plan_phases(self.s, engine, self.plan, self.transfer_dir, self.selection_accuracy, self.layer_rows)

    def module(self):
        return Trained(self.s)

    def trained(self, run: JobRun) -> None:
        """The model ends on the CPU with every parameter learning again, as it is saved and served."""
        for p in self.s.model.parameters():
            p.requires_grad_(True)
        self.s.model.cpu()

    def evaluate(self, run: JobRun) -> dict:
        return evaluate_run(self.s, self.student, self.transfer_dir, self.dev)

    def save(self, run: JobRun, metrics: dict) -> None:
        """model/ and curves.png; the metrics gain the training's figures."""
        history, engine = run.recipe.history, run.engine
        trained = sum(h["rows"] for h in history)
        # Rows per second of the training steps alone (dev evaluation after each epoch excluded).
        step_seconds = sum(h["rows"] / h["rows_per_second"] for h in history if h["rows"])
        metrics.update(train_seconds=run.seconds, train_rows=trained,
                       train_rows_per_second=trained / step_seconds if step_seconds else None,
                       processes=engine.world, device=str(engine.device),
                       effective_batch_size=run.recipe.effective_batch_size,  # as it ran (recipe.py)
                       phases=run.recipe.phase_log, history=history)
        self.student.save_pretrained(os.path.join(run.work, schema.STUDENT_MODEL_DIR))
        if history:
            plot_curves(history, os.path.join(run.work, schema.CURVES_FILE))


def fingerprint(cfg: StudentConfig, transfer_dir: str, dev_path: str, engine: Engine) -> dict:
    """What a checkpoint must share with the run resuming it: the settings that decide the steps, the
    inputs, and the process count (each rank's rows depend on it)."""
    ignored = {"resume", "checkpoint_steps", "threads", "report"}  # report: the figures after training
    settings = {k: v for k, v in typed.to_dict(cfg).items() if k not in ignored}
    settings["losses"] = canonical(cfg.losses)  # one form whatever its spelling
    # where and how it is logged decide no step; the precision and the schedule do
    settings["engine"] = {k: v for k, v in settings["engine"].items() if k not in ("device", "tracker")}
    return {"settings": json.dumps(settings, sort_keys=True, default=str), "transfer": transfer_dir, "dev": dev_path,
            "processes": engine.world}
