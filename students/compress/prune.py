"""Head pruning of a BERT teacher or transformer student: rank → remove → recover (Michel et al. 2019).

1. rank: each attention head's importance on the selection split, |∂loss/∂ξ_h| summed over its rows
   (transferset.models.pruning.head_importance), the loss being cross-entropy against the gold labels;
2. remove the least important heads (a count or a fraction; every layer keeps one), slicing their
   weights away (transferset.models.pruning.prune_heads: a PrunedBertForSequenceClassification);
3. recover by distillation from the cached `teacher_logits` of the scored transfer set (MSE or KL),
   with the training recipe every model here trains with (transferset/training/), the pruned model
   as it starts competing with each epoch on the selection split.
With `heads: 0` nothing is ranked or removed and step 3 alone runs: the teacher distilled on its own
cached logits over the transfer set (self-distillation, a born-again teacher: Furlanello et al. 2018).
The output, rank 0, staging, the engine, tracking and prune.json are the job shell's
(transferset/training/job.py).

OUTPUT is the pruned model's directory, in the input's form: a Hugging Face directory for a Hugging
Face classifier (the teacher: `score --teacher OUTPUT` takes it), a student directory (sidecar
included) for a student; plus prune.json (what was removed, the importances, accuracies before and
after). The model's config.json has model_type `transferset_pruned_bert` (see transferset/models/pruning.py
for loading it outside transferset).
"""
from __future__ import annotations

import math
import os
from typing import Optional

import numpy as np
import torch

from students import seeds
from students.data import EvalData, ScoredSet, iter_train_batches, read_eval_data
from students.families import transformer_layers
from students.losses import kd_kl, logits_mse
from students.student import OnnxStudent, Student, accuracy
from students.trainer import require_input
from transferset.config import PruneConfig
from transferset.contract import schema
from transferset.fs.output import MODEL_NAMES
from transferset.models import pruning
from transferset.runtime import typed
from transferset.runtime.errors import UserError
from transferset.runtime.progress import log_line
from transferset.runtime.threads import set_torch_threads
from transferset.training import Engine, PhaseSpec
from transferset.training.job import Job, JobPhase, JobRun, run_job


def prune(cfg: PruneConfig, model_path: str, selection: str, output: str, *, transfer_dir: Optional[str] = None,
          overwrite: bool = False, progress: bool = True) -> dict:
    """Prune `model_path`'s least important heads (ranked on `selection`), recover from `transfer_dir`'s
    teacher_logits when given (and cfg.epochs > 0), write OUTPUT; → the record written as prune.json."""
    require_input(selection, "--selection")
    refuse_exits(model_path)
    if transfer_dir is None and cfg.epochs:
        raise UserError("recovery (--epochs > 0) distils from a scored transfer set: pass --transfer DIR (the "
                        "output of `transferset score`), or --epochs 0 to prune without recovery")
    if cfg.heads == 0 and (transfer_dir is None or not cfg.epochs):
        raise UserError("--heads 0 removes no head, so only the recovery would run, and there is none: pass "
                        "--transfer DIR with --epochs 1 or more to distil the model on the set's cached logits, "
                        "or --heads N to prune")
    return run_job(_Prune(cfg, model_path, selection, transfer_dir, progress), output,
                   inputs=[model_path, selection, transfer_dir], overwrite=overwrite)


def open_transfer(transfer_dir: str, student: Student) -> ScoredSet:
    """The scored set the recovery distils from, checked once (students.data.ScoredSet), of the model's task."""
    scored = ScoredSet.open(transfer_dir)
    if scored.label_names != list(student.label_names):
        raise UserError(f"--transfer {transfer_dir}: label names {scored.label_names} differ from the model's "
                        f"{student.label_names}; recover from the scored set of this model's task")
    return scored


def refuse_exits(model_path: str) -> None:
    """Refuse a model with early exits: each branch reads its layer's states, which removing that layer's heads
    changes, and a pruned model with the old branches beside it is one that evaluate, predict and export refuse."""
    from students.families.exits import has_exits

    if has_exits(schema.model_dir(model_path)):
        raise UserError(f"--model {model_path}: has early exits ({schema.EXITS_FILE}), trained on the states of "
                        "the heads pruning removes: prune the backbone first (the model `transferset exits` was "
                        "given), then train exits on the pruned model with `transferset exits`")


def load_prunable(model_path: str, max_length: Optional[int] = None) -> Student:
    student = Student.from_pretrained(model_path, max_length)
    if isinstance(student, OnnxStudent):
        raise UserError(f"--model {model_path}: an ONNX export; prune the PyTorch model it was exported from, "
                        "then export the pruned one")
    reason = pruning.unsupported(student.model)
    if reason:
        raise UserError(f"--model {model_path}: its attention heads cannot be pruned here: {reason}")
    return student


def importance_batches(student: Student, dev: EvalData, batch_size: int):
    """The selection rows as the model's inputs, with their gold labels (-1: none)."""
    for start in range(0, len(dev.texts), batch_size):
        stop = start + batch_size
        ids, mask, types = student.tokens.encode(dev.texts[start:stop],
                                                 dev.texts_b[start:stop] if dev.texts_b is not None else None)
        yield {"input_ids": ids, "attention_mask": mask.long(), "token_type_ids": types,
               "labels": torch.from_numpy(np.asarray(dev.labels[start:stop], dtype=np.int64))}


def rank_heads(student: Student, dev: EvalData, cfg: PruneConfig) -> tuple[np.ndarray, dict[int, list[int]]]:
    """(importance (L, H), {layer: heads to remove})."""
    kept = pruning.kept_heads(student.model)
    have, can = sum(map(len, kept)), sum(len(k) - 1 for k in kept)
    try:  # checked before the (longer) ranking
        count = pruning.heads_to_remove(cfg.heads, have)
    except ValueError as exc:
        raise UserError(f"--heads {cfg.heads:g}: {exc}") from exc
    if not 1 <= count <= can:
        raise UserError(f"--heads {cfg.heads:g}: removes {count} of the model's {have} heads in {len(kept)} layers; "
                        f"each layer keeps at least one, so pass a count from 1 to {can} or a fraction in (0, 1) "
                        "that makes one")
    # 1 and 1.0 are one count (one head), where a user may have meant a fraction (all of them): say which it took.
    took = (f"{count} head{'s' if count != 1 else ''} (a count; a fraction of the heads is written below 1, e.g. 0.5)"
            if cfg.heads >= 1 else f"{count} of the model's {have} heads (a fraction)")
    log_line(f"[transferset] prune: --heads {cfg.heads:g}: removes {took}")
    importance = pruning.head_importance(student.model, importance_batches(student, dev, cfg.batch_size),
                                         loss=cfg.importance_loss)
    return importance, pruning.least_important(importance, count, normalize=cfg.normalize)


class _Logits(torch.nn.Module):
    """The model being recovered as the recipe trains it: batch → logits."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, batch) -> torch.Tensor:
        return transformer_layers.forward(self.model, batch["ids"], batch["mask"], batch["type_ids"])["logits"]


def recovery_phase(cfg: PruneConfig, student: Student, scored: ScoredSet, dev: EvalData, engine: Engine) -> JobPhase:
    """Distil the pruned model towards the scored set's teacher_logits; keeps the best epoch on `dev`
    (the pruned model as it starts competes)."""
    transfer_dir, rows = scored.path, scored.num_rows
    spec = PhaseSpec("recover", cfg.epochs, keep_best=True, start_competes=True, max_steps=cfg.max_steps,
                     grad_clip=cfg.optim.grad_clip,
                     steps_per_epoch=max(1, math.ceil(rows / cfg.batch_size) // engine.world))

    def loss_step(module, batch):
        logits, target = module(batch), batch[schema.TEACHER_LOGITS].to(torch.float32)
        if cfg.loss == "kd":
            loss = kd_kl(logits, target, cfg.temperature)
        else:
            loss = logits_mse(logits, target)
        return loss, {cfg.loss: float(loss.detach())}

    def batches(epoch: int):
        return iter_train_batches(transfer_dir, student.tokens, seeds.stream(cfg.seed, seeds.SHUFFLE, 0, epoch),
                                  batch_size=cfg.batch_size, shuffle_rows=cfg.shuffle_rows,
                                  rank=engine.rank, world=engine.world)

    def evaluate() -> dict:
        return {"accuracy": accuracy(student.predict_ids(dev.texts, dev.texts_b), dev.labels)}

    def new_optimizer():
        for p in student.model.parameters():
            p.requires_grad_(True)
        return torch.optim.AdamW(student.model.parameters(), lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay)

    return JobPhase(spec, _Logits(student.model), loss_step, batches, evaluate, new_optimizer)


class _Prune(Job):
    """rank → remove → recover as a job of the shell (transferset.training.job); prune.json is its metrics."""

    command, names, project, where = "prune", MODEL_NAMES, "transferset-prune", "prune engine"
    metrics_file = schema.PRUNE_FILE

    def __init__(self, cfg: PruneConfig, model_path: str, selection: str, transfer_dir: Optional[str],
                 progress: bool):
        super().__init__(cfg.engine, log_line)
        self.cfg, self.model_path, self.selection, self.transfer_dir = cfg, model_path, selection, transfer_dir
        self.progress_bar = None if progress else False
        self.seed = seeds.torch_seed(seeds.stream(cfg.seed, seeds.DROPOUT))
        self.recovery: Optional[dict] = None

    def check(self) -> None:
        set_torch_threads(self.cfg.threads)
        self.student = load_prunable(self.model_path, self.cfg.max_length)
        self.dev = read_eval_data(self.selection, self.student.label_names)
        self.scored = open_transfer(self.transfer_dir, self.student) if self.cfg.epochs else None

    def prepare(self, run: JobRun) -> None:
        """rank and remove (every rank removes the same heads)."""
        cfg, student, dev = self.cfg, self.student, self.dev
        self.before = accuracy(student.predict_ids(dev.texts, dev.texts_b), dev.labels)
        self.params_before = student.num_parameters()
        self.kept_before = pruning.kept_heads(student.model)
        if cfg.heads:
            log_line(f"[transferset] prune: ranking {sum(map(len, self.kept_before))} heads on {len(dev.texts)} "
                     "selection rows")
            self.importance, self.remove = rank_heads(student, dev, cfg)
            student.model = pruning.prune_heads(student.model, self.remove).eval()
            self.pruned_acc = accuracy(student.predict_ids(dev.texts, dev.texts_b), dev.labels)
            log_line(f"[transferset] prune: removed {sum(map(len, self.remove.values()))} heads {self.remove}; "
                     f"selection accuracy {self.before:.4f} -> {self.pruned_acc:.4f} before recovery")
        else:  # --heads 0: no ranking, no head removed; the recovery alone (self-distillation)
            self.importance, self.remove, self.pruned_acc = None, {}, self.before

    def trains(self) -> bool:
        return self.scored is not None

    def tracked(self) -> dict:
        return typed.to_dict(self.cfg)

    def phases(self, engine: Engine):
        yield recovery_phase(self.cfg, self.student, self.scored, self.dev, engine)

    def trained(self, run: JobRun) -> None:
        self.student.model.cpu().eval()
        if run.engine is not None:
            cfg, engine = self.cfg, run.engine
            self.recovery = {"transfer": self.scored.path, "rows": self.scored.num_rows, "loss": cfg.loss,
                             "seconds": run.seconds, "processes": engine.world,
                             "effective_batch_size": run.recipe.effective_batch_size,  # as it ran
                             "phase": run.entries[0], "history": run.recipe.history}

    def evaluate(self, run: JobRun) -> dict:
        student, dev = self.student, self.dev
        final = accuracy(student.predict_ids(dev.texts, dev.texts_b), dev.labels)
        importance = self.importance
        return {
            "model": self.model_path,
            "removed": {str(k): v for k, v in self.remove.items()},
            "kept_heads": pruning.kept_heads(student.model),
            "heads": {"before": sum(map(len, self.kept_before)),
                      "after": sum(map(len, pruning.kept_heads(student.model)))},
            "parameters": {"before": self.params_before, "after": student.num_parameters()},
            # (L, H) in original head indices; null for a head removed before this run
            "importance": None if importance is None else [[None if not np.isfinite(v) else float(v) for v in row]
                                                           for row in importance],
            "selection": {"path": dev.path, "rows": len(dev.texts), "accuracy_before": self.before,
                          "accuracy_pruned": self.pruned_acc, "accuracy_final": final},
            "recovery": self.recovery,
            "config": typed.to_dict(self.cfg),
        }

    def save(self, run: JobRun, metrics: dict) -> None:
        save(self.student, self.model_path, run.work)


def save(student: Student, model_path: str, work: str) -> None:
    """In the input's form: a student directory stays one (sidecar and all), a Hugging Face classifier
    directory stays a plain one (its tokenizer as it was)."""
    if os.path.isfile(os.path.join(schema.model_dir(model_path), schema.STUDENT_SIDECAR_FILE)):
        student.save_pretrained(work)
        return
    from transferset.models.loading import quiet_transformers

    with quiet_transformers():
        student.model.save_pretrained(work)
    student.tokens.tokenizer.save_pretrained(work)
