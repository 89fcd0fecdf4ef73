"""Training FastBERT's exits (`transferset exits`): the branches of students/families/exits.py, self-distilled from
the frozen model over a scored transfer set.

setup → data → loss step → train → save, as the other trainers, with one difference that makes it cheap:
the backbone is frozen, so each row's pooled states of layers 1..L-1 (the branches' inputs: the masked mean
of the layer's tokens, or [CLS]) are computed once (no gradients; the rows streamed from the set CHUNK_ROWS at
a time, each chunk length-sorted into batches) and kept as float16, (N, L-1, H); every epoch then trains the
L-1 small heads on those states alone. The targets are the model's final distribution over the row:
- the teacher's: the scored set's teacher_logits, what `transferset score` cached (no second scoring);
- any other model's (a transformer student): its own head's logits, from that same single pass.
Loss: the sum over branches of KL(softmax(target) ‖ softmax(branch)), mean over rows. Unlabeled rows
are enough; labels are never read. The model and its classifier are never given to the optimizer and
run under inference_mode, so they leave exactly as they came (the saved folder holds them unchanged).

OUT/model/: the model (as `Student.save_pretrained` writes it) with exits.json and exits.safetensors;
OUT/metrics.json; OUT/_COMPLETE. The output, rank 0, staging, the engine, tracking and metrics.json are the
job shell's (transferset/training/job.py).
"""
from __future__ import annotations

import math
import os
import time
from typing import Optional

import numpy as np
import torch

from students.data import ScoredSet
from students.families.exits import Branches, BranchesConfig, check_bert_like, layer_states, save_branches
from students.student import Student
from transferset import fs
from transferset.config import ExitsConfig
from transferset.contract import schema
from transferset.data import transfer
from transferset.fs.remote import local_teacher
from transferset.models.loading import weights_sha256
from transferset.runtime.errors import UserError
from transferset.runtime.progress import Progress
from transferset.runtime.threads import set_torch_threads
from transferset.training import Engine, PhaseSpec, Recipe
from transferset.training.job import Job, JobPhase, JobRun, run_job

EXITS_NAMES = (schema.STUDENT_MODEL_DIR, schema.METRICS_FILE, schema.COMPLETE_MARKER)
# Rows read, length-sorted into batches and run through the frozen model at a time (the texts of one such
# chunk are all the rows held in memory; the pooled states of every row are the cache the branches train on).
CHUNK_ROWS = 65536


def train_exits(model_path: str, scored_dir: str, output: str, cfg: ExitsConfig = ExitsConfig(), *,
                overwrite: bool = False, progress: Optional[bool] = None) -> dict:
    """Train the exits of `model_path` over `scored_dir`; write OUTPUT/model/, OUTPUT/metrics.json,
    OUTPUT/_COMPLETE (transferset.fs.output's protocol); → the metrics."""
    return run_job(_Exits(model_path, scored_dir, cfg, progress), output, inputs=[model_path, scored_dir],
                   overwrite=overwrite)


def choose_targets(how: str, meta: dict, model_dir: str, scored_dir: str) -> str:
    """cached | own, from ExitsConfig.targets: cached only for the set's own teacher (same weights, one teacher)."""
    recorded = meta.get(schema.META_TEACHER_SHA256)
    ensemble = schema.META_ENSEMBLE in meta
    same = recorded is not None and recorded == weights_sha256(model_dir)
    if how == "auto":
        return "cached" if same and not ensemble else "own"
    if how == "cached" and (ensemble or (recorded is not None and not same)):
        what = ("a teacher ensemble's combined logits" if ensemble else
                f"the logits of another teacher (weights sha256 {recorded[:12]}...)")
        raise UserError(f"--targets cached: {scored_dir} holds {what}, not {model_dir}'s final classifier; the "
                        "branches must learn the model's own distribution: use --targets own (or auto)")
    return how


class _Exits(Job):
    """The branches' training as a job of the shell (transferset.training.job): features once, then one phase."""

    command, names, project, where = "exits", EXITS_NAMES, "transferset-exits", "exits engine"

    def __init__(self, model_path: str, scored_dir: str, cfg: ExitsConfig, progress: Optional[bool]):
        super().__init__(cfg.engine, lambda msg: None)
        self.model_path, self.scored_dir, self.cfg, self.progress_bar = model_path, scored_dir, cfg, progress

    def check(self) -> None:
        """A set whose scoring did not finish, or another task's, is refused before anything runs."""
        self.started = time.time()
        set_torch_threads(self.cfg.threads)
        self.scored = scored = ScoredSet.open(self.scored_dir)
        model_path = self.model_path
        local = local_teacher(model_path) if fs.is_remote(model_path) else model_path
        student = Student.from_pretrained(local, max_length=self.cfg.max_length)
        if not isinstance(student, Student):
            raise UserError(f"--model {model_path}: an ONNX export; train the exits on the PyTorch model it came from")
        check_bert_like(student.model, f"--model {model_path}")
        if scored.label_names != student.label_names:
            raise UserError(f"--scored {self.scored_dir} names labels {scored.label_names}, --model {model_path} "
                            f"{student.label_names}: a set scored for another task; pass the set this model's teacher "
                            "scored")
        self.student = student
        self.targets_kind = choose_targets(self.cfg.targets, scored.meta, schema.model_dir(local), self.scored_dir)

    def prepare(self, run: JobRun) -> None:
        self.features, self.targets = features_and_targets(self.student, self.scored, self.targets_kind, self.cfg,
                                                           self.progress_bar)
        self.features_s = time.time() - self.started

    def tracked(self) -> dict:
        return {"epochs": self.cfg.epochs, "lr": self.cfg.optim.lr, "batch_size": self.cfg.batch_size}

    def phases(self, engine: Engine):
        phase, self.branches, self.losses = branch_phase(self.features, self.targets, self.cfg, engine)
        yield phase

    def trained(self, run: JobRun) -> None:
        totals = run.engine.sum(*self.losses)
        self.train_loss = [round(t / len(self.features), 6) for t in totals]
        self.branches = self.branches.cpu().eval()

    def evaluate(self, run: JobRun) -> dict:
        cfg, features, branches = self.cfg, self.features, self.branches
        with torch.no_grad():
            branch_logits = torch.cat([branches(features[i:i + 4096].float())
                                       for i in range(0, len(features), 4096)])           # (N, L-1, C)
        agreement = (branch_logits.argmax(-1) == self.targets.argmax(-1)[:, None]).float().mean(0)
        self.info = {"model": self.model_path, "scored": self.scored_dir, "targets": self.targets_kind,
                     "rows": len(features), "epochs": cfg.epochs, "lr": cfg.optim.lr, "batch_size": cfg.batch_size,
                     "seed": cfg.seed}
        return {**self.info, "layers": len(branches) + 1, "branch_width": cfg.width, "processes": run.engine.world,
                "effective_batch_size": run.recipe.effective_batch_size,  # as it ran (recipe.py)
                "branch_parameters": sum(p.numel() for p in branches.parameters()),
                "train_loss": self.train_loss,
                # how often each branch (layer 1..L-1) picks the target's class on the training rows
                "branch_agreement": [round(float(a), 4) for a in agreement],
                "features_s": round(self.features_s, 1)}

    def save(self, run: JobRun, metrics: dict) -> None:
        """The model as it came, the branches beside it."""
        s = self.student
        model_out = os.path.join(run.work, schema.STUDENT_MODEL_DIR)
        Student(s.model, s.tokens, s.label_names, s.family, s.config, s.teacher_id).save_pretrained(model_out)
        save_branches(model_out, self.branches, self.info)
        metrics["elapsed_s"] = round(time.time() - self.started, 1)


def features_and_targets(student: Student, scored: ScoredSet, targets_kind: str, cfg: ExitsConfig,
                         progress: Optional[bool]) -> tuple[torch.Tensor, torch.Tensor]:
    """The data, streamed from the set (labels never read): each row's pooled states once, and the targets."""
    n = scored.num_rows if cfg.max_rows is None else min(cfg.max_rows, scored.num_rows)
    model = student.model.eval()
    features = torch.empty(n, len(model.base_model.encoder.layer) - 1, int(model.config.hidden_size),
                           dtype=torch.float16)
    own = torch.empty(n, len(student.label_names))
    cached = np.empty((n, len(scored.label_names)), dtype=np.float32) if targets_kind == "cached" else None
    bar = Progress("rows through the frozen model", total=n, bar=progress)
    try:
        start = 0
        for texts, texts_b, logits in _chunks(scored.path, n, cached is not None):
            rows = slice(start, start + len(texts))
            branch_inputs(student, texts, texts_b, cfg.pool, cfg.batch_size, features[rows], own[rows], bar)
            if cached is not None:
                cached[rows] = logits
            start += len(texts)
    finally:
        bar.close()
    return features, (torch.from_numpy(cached) if cached is not None else own)


def _chunks(directory: str, n: int, logits: bool):
    """The set's first `n` rows in order, CHUNK_ROWS at a time (across shards): (texts, texts_b, logits or None)."""
    columns = [schema.TEXT, schema.TEXT_B] + ([schema.TEACHER_LOGITS] if logits else [])
    texts: list = []
    texts_b: list = []
    parts: list = []
    left = n
    for rb in transfer.iter_batches(directory, columns, batch_size=CHUNK_ROWS):
        rb = rb.slice(0, left)
        left -= rb.num_rows
        texts += rb.column(0).to_pylist()
        texts_b += rb.column(1).to_pylist()
        if logits:
            parts.append(transfer.fixed_list_to_numpy(rb.column(2)))
        while len(texts) >= CHUNK_ROWS or (texts and left == 0):
            block = np.concatenate(parts) if logits else None
            yield texts[:CHUNK_ROWS], texts_b[:CHUNK_ROWS], (block[:CHUNK_ROWS] if logits else None)
            texts, texts_b = texts[CHUNK_ROWS:], texts_b[CHUNK_ROWS:]
            parts = [block[CHUNK_ROWS:]] if logits else []
        if left == 0:
            return
    if left:
        raise UserError(f"--scored {directory}: {left} of the {n} rows it counted could not be read again; "
                        "was the set changed while it was read?")


def branch_inputs(student: Student, texts: list, texts_b: list, how: str, batch_size: int, features: torch.Tensor,
                  own: torch.Tensor, bar: Progress) -> None:
    """Each row through the frozen model once, into `features` (its pooled states of layers 1..L-1, float16
    (n, L-1, H)) and `own` (the model's own logits (n, C)), in row order; rows length-sorted into batches
    (less padding)."""
    model = student.model
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]) + len(texts_b[i] or ""))
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        b = student._batch([texts[i] for i in idx], [texts_b[i] for i in idx])
        pooled, logits = layer_states(model, b["ids"], b["mask"], b["type_ids"], how)
        features[idx] = pooled.to(torch.float16).cpu()
        own[idx] = logits.float().cpu()
        bar.update(len(idx))


def branch_phase(features: torch.Tensor, targets: torch.Tensor, cfg: ExitsConfig,
                 engine: Engine) -> tuple[JobPhase, Branches, list[float]]:
    """The branches' one phase: KL to softmax(targets) on the cached states (each rank its share of each epoch's
    batches); → (the phase, the branches it trains, each epoch's loss summed over this rank's rows)."""
    n, layers, hidden = features.shape
    with torch.random.fork_rng(devices=[]):  # the caller's random state is left as it was
        torch.manual_seed(cfg.seed)
        branches = Branches(BranchesConfig(layers=layers, hidden=hidden, classes=targets.shape[1], width=cfg.width,
                                           pool=cfg.pool))
    target_logp = torch.log_softmax(targets.float(), dim=-1)                    # (N, C)
    losses = [0.0] * cfg.epochs

    def batches(epoch: int):
        order = torch.Generator().manual_seed(cfg.seed)
        for _ in range(epoch):  # the epochs before this one drew their orders from the same generator
            torch.randperm(n, generator=order)
        for idx in torch.randperm(n, generator=order).split(cfg.batch_size)[engine.rank::engine.world]:
            yield {"idx": idx, "features": features[idx].float(), "targets": target_logp[idx], "epoch": epoch}

    def loss_step(net, batch):
        loss = exit_loss(net(batch["features"]), batch["targets"])
        losses[batch["epoch"]] += float(loss.detach()) * len(batch["idx"])
        return loss, {}

    spec = PhaseSpec("exits", cfg.epochs, keep_best=False, grad_clip=cfg.optim.grad_clip,
                     steps_per_epoch=max(1, math.ceil(n / cfg.batch_size) // engine.world))

    def optimizer():
        return torch.optim.AdamW(branches.parameters(), lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay)

    return JobPhase(spec, branches, loss_step, batches, None, optimizer), branches, losses


def fit_branches(features: torch.Tensor, targets: torch.Tensor, cfg: ExitsConfig,
                 engine: Optional[Engine] = None) -> tuple[Branches, list[float]]:
    """The branches trained alone through the recipe, outside a job (`train_exits` runs the same phase in the
    shell); → (branches, mean loss per row and epoch)."""
    engine = engine or Engine.create(cfg.engine, log=lambda msg: None, progress_bar=False)
    phase, branches, losses = branch_phase(features, targets, cfg, engine)
    Recipe(engine).run(0, phase.spec, phase.module, phase.loss_step, phase.batches, None, phase.make_optimizer)
    totals = engine.sum(*losses)
    return branches.cpu().eval(), [round(t / len(features), 6) for t in totals]


def exit_loss(branch_logits: torch.Tensor, target_logp: torch.Tensor) -> torch.Tensor:
    """Σ over branches of KL(p_target ‖ p_branch), mean over rows: (B, L-1, C), (B, C) → ()."""
    logq = torch.log_softmax(branch_logits, dim=-1)
    p = target_logp.exp()[:, None]
    return (p * (target_logp[:, None] - logq)).sum(-1).sum(-1).mean()
