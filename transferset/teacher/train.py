"""Fine-tuning a Hugging Face encoder as the teacher: setup → data → train → evaluate → save.

The loop is the recipe the students train with (transferset/training/, on Accelerate): the same
seeding, early stopping on the selection split (`patience`: 1 by default, and the best
dev epoch's weights are kept), progress lines and checkpoints (OUTPUT/checkpoint/, removed once
the model is written; `resume: true` goes on from it after a kill). What is the teacher's own:
length-grouped batches with dynamic padding (`DataCollatorWithPadding`), fused AdamW with linear
warm-up and decay, and the Hugging Face model's own loss (benchmarks/teacher.py times it). The output,
rank 0, staging, the engine, tracking, metrics.json and the model card are the job shell's
(transferset/training/job.py); this module supplies the data, the model, the step, the evaluation and the save.
"""
from __future__ import annotations

import json
import math
import os
import random
import sys
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from transferset import fs
from transferset import sources
from transferset.config import TeacherConfig
from transferset.contract import schema
from transferset.fs.output import MODEL_NAMES
from transferset.models import loading
from transferset.runtime import typed
from transferset.runtime.errors import UserError
from transferset.sources import Example, Reject, SourceSpec
from transferset.training import Checkpoints, Engine, PhaseSpec, Recipe, launched_processes
from transferset.training.job import Job, JobPhase, JobRun, checkpoints_at, run_job
# Settings that change how a fine-tuning runs, never what it learns: in no checkpoint's fingerprint or stage key.
RUNTIME_SETTINGS = ("progress", "resume", "checkpoint_steps")


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


def encode(tokenizer, examples: Sequence[Example], max_length: int) -> list[dict]:
    """Unpadded token ids and the label of each row; the collator pads each batch to its longest row."""
    texts = [e.text for e in examples]
    if any(e.text_b is not None for e in examples):
        enc = tokenizer(texts, [e.text_b or "" for e in examples], truncation=True, max_length=max_length)
    else:
        enc = tokenizer(texts, truncation=True, max_length=max_length)
    keys = [k for k in enc.keys() if k != "attention_mask"]
    return [dict({k: enc[k][i] for k in keys}, labels=e.label) for i, e in enumerate(examples)]


def phase_spec(cfg: TeacherConfig, train_rows: int, world: int = 1) -> PhaseSpec:
    """The teacher's one phase: it stops after `patience` epochs without a better dev accuracy (None: every epoch
    runs), the best dev epoch is kept. With several processes each rank trains on its share of the batches (an
    epoch ends with the first rank's last)."""
    batches = max(1, math.ceil(train_rows / cfg.batch_size) // world)
    return PhaseSpec("fine-tuning", cfg.epochs, keep_best=True, patience=cfg.patience, start_competes=False,
                     max_steps=cfg.max_steps, grad_clip=cfg.optim.grad_clip, steps_per_epoch=batches)


def optimizer(cfg: TeacherConfig, model):
    """AdamW without weight decay on biases and LayerNorm weights (the 1-d parameters); the learning rate
    follows the engine's schedule (the teacher's default: linear warm-up over 10 % of the steps, then linear
    decay to 0, the schedule BERT was fine-tuned with)."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.ndim > 1], "weight_decay": cfg.optim.weight_decay},
              {"params": [p for p in params if p.ndim <= 1], "weight_decay": 0.0}]
    # The fused kernel: 16 against 118 ms per MiniLM step on one CPU thread (benchmarks/README.md).
    return torch.optim.AdamW(groups, lr=cfg.optim.lr, fused=True)


def length_grouped(lengths: Sequence[int], batch_size: int, rng: np.random.Generator) -> list[list[int]]:
    """Batches of rows of similar lengths (a batch costs what its longest row costs): a random order,
    cut into groups of 50 batches, each group sorted by length (transformers' group_by_length)."""
    order = rng.permutation(len(lengths))
    group = batch_size * 50
    batches = []
    for start in range(0, len(order), group):
        part = sorted(order[start:start + group].tolist(), key=lambda i: -lengths[i])
        batches += [part[i:i + batch_size] for i in range(0, len(part), batch_size)]
    return batches


def _checkpoints(cfg: TeacherConfig, train: str, dev: str, output: str) -> Checkpoints:
    """OUTPUT/checkpoint/, fingerprinted by the settings that decide the weights and the input paths."""
    return checkpoints_at(output, _fingerprint(cfg, train, dev), cfg.checkpoint_steps)


def _fingerprint(cfg: TeacherConfig, train: str, dev: str) -> dict:
    settings = {k: v for k, v in typed.to_dict(cfg).items() if k not in RUNTIME_SETTINGS}
    settings["engine"] = {k: v for k, v in settings["engine"].items() if k != "tracker"}  # logs, not weights
    processes = launched_processes()
    return {"settings": json.dumps(settings, sort_keys=True, default=str), "train": train, "dev": dev,
            **({"processes": processes} if processes > 1 else {})}


def can_resume(cfg: TeacherConfig, *, train: str, dev: str, output: str) -> bool:
    """Whether `output` holds the checkpoint of a killed fine-tuning with these settings and inputs."""
    return not fs.is_remote(output) and _checkpoints(cfg, train, dev, output).matches()


def train(cfg: TeacherConfig, *, train: str, dev: str, output: str, overwrite: bool = False, log=None) -> dict:
    """Fine-tune on `train`; keep the best `dev` checkpoint in `output`; return the metrics written to metrics.json.

    `train` and `dev` are local files; `output` a local folder or a URL (trained in a local staging folder,
    then uploaded), written as transferset.fs.output says: owned while written, _COMPLETE last.
    Under `torchrun` every process trains on its own batches and rank 0 alone owns the output and writes;
    the other ranks return {"rank": r}.
    """
    job = _Teacher(cfg, train, dev, log or (lambda msg: print(msg, file=sys.stderr, flush=True)))
    return run_job(job, output, inputs=[train, dev, cfg.model if os.path.exists(cfg.model) else None],
                   overwrite=overwrite)


@dataclass
class _Run:
    """What the fine-tuning works on, read and encoded once (each rank reads the same files)."""

    train: Data
    dev: Data
    label_names: Sequence[str]
    model_path: str
    tokenizer: object
    model: object
    train_feats: list
    dev_feats: list
    collate: object


def _prepare(cfg: TeacherConfig, train: str, dev: str) -> _Run:
    """setup → data: the splits, the model, the encoded rows."""
    import torch
    from transformers import DataCollatorWithPadding

    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)  # the new classification head is initialised from this, the same on every rank
    model_path = loading.resolve_model(cfg.model)
    label_names = cfg.labels or sources.infer_label_names(train, cfg.label_column)
    splits = {"train": read_split(train, cfg, label_names), "dev": read_split(dev, cfg, label_names)}
    tokenizer = loading.load_tokenizer(model_path, trust_remote_code=cfg.trust_remote_code)
    model = loading.load_classifier(model_path, allow_pickle=cfg.allow_pickle,
                                    trust_remote_code=cfg.trust_remote_code, label_names=label_names)
    # Dev in length order: each batch pads to its own longest row.
    dev_feats = sorted(encode(tokenizer, splits["dev"].examples, cfg.max_length), key=lambda f: len(f["input_ids"]))
    return _Run(splits["train"], splits["dev"], label_names, model_path, tokenizer, model,
                encode(tokenizer, splits["train"].examples, cfg.max_length), dev_feats,
                DataCollatorWithPadding(tokenizer))


class _Teacher(Job):
    """The fine-tuning as a job of the shell (transferset.training.job): one phase, the model's own loss."""

    command, names, project, card, where = "teacher", MODEL_NAMES, "transferset-teacher", True, "teacher.engine"

    def __init__(self, cfg: TeacherConfig, train: str, dev: str, log):
        super().__init__(cfg.engine, log)
        self.cfg, self.train, self.dev = cfg, train, dev
        self.resume, self.checkpoint_steps, self.seed, self.progress_bar = (cfg.resume, cfg.checkpoint_steps,
                                                                            cfg.seed, cfg.progress)
        self.run: Optional[_Run] = None

    def check(self) -> None:
        for flag, path in (("--train", self.train), ("--dev", self.dev)):
            if not path.startswith(sources.HF_PREFIX) and not os.path.isfile(path):
                raise UserError(f"{flag} {path}: no such file")
            sources.check_readable(path)  # a broken header, an hf: split that does not load: before any output
        self.run = _prepare(self.cfg, self.train, self.dev)

    def prepare(self, run: JobRun) -> None:
        r = self.run
        for name, d in (("train", r.train), ("dev", r.dev)):
            if d.rejects and run.out is not None:
                first = d.rejects[0]
                self.log(f"{name}: {len(d.rejects)} row(s) rejected, see "
                         f"{run.out.write_rejects(d.rejects, f'{name}.jsonl')} (first: line {first.line}: {first.reason})")
        self.log(f"train rows {len(r.train.examples)}, dev rows {len(r.dev.examples)}, labels {list(r.label_names)}")

    def fingerprint(self, engine: Engine) -> dict:
        return _fingerprint(self.cfg, self.train, self.dev)

    def tracked(self) -> dict:
        return typed.to_dict(self.cfg)

    def phases(self, engine: Engine):
        cfg, r = self.cfg, self.run
        yield JobPhase(phase_spec(cfg, len(r.train_feats), engine.world), r.model,
                    lambda net, batch: (net(**batch).loss, {}), _batches(cfg, r, engine), _evaluator(cfg, r, engine),
                    lambda: optimizer(cfg, r.model))

    def module(self):
        return self.run.model

    def evaluate(self, run: JobRun) -> dict:
        return _metrics(self.cfg, self.run, run.recipe, run.engine, train=self.train, dev=self.dev)

    def save(self, run: JobRun, metrics: dict) -> None:
        with loading.quiet_transformers():  # no "Writing model shards" bar
            self.run.model.cpu().save_pretrained(run.work)  # the best epoch's weights; id2label travels in config.json
        self.run.tokenizer.save_pretrained(run.work)
        metrics["weights_sha256"] = loading.weights_sha256(run.work)


def _batches(cfg: TeacherConfig, run: _Run, engine: Engine):
    """An epoch's batches on this rank: every rank draws the same length-grouped batches, and takes its share."""
    lengths = [len(f["input_ids"]) for f in run.train_feats]

    def batches(epoch: int):
        rng = np.random.default_rng([cfg.seed, epoch])
        for idx in length_grouped(lengths, cfg.batch_size, rng)[engine.rank::engine.world]:
            yield run.collate([run.train_feats[i] for i in idx])

    return batches


def _evaluator(cfg: TeacherConfig, run: _Run, engine: Engine):
    import torch

    @torch.inference_mode()
    def evaluate() -> dict:
        run.model.eval()
        right, loss_sum = 0, 0.0
        for start in range(0, len(run.dev_feats), cfg.eval_batch_size):
            batch = engine.to_device(run.collate(run.dev_feats[start:start + cfg.eval_batch_size]))
            with engine.autocast():
                out = run.model(**batch)
            right += int((out.logits.argmax(-1) == batch["labels"]).sum())
            loss_sum += float(out.loss) * len(batch["labels"])
        return {"accuracy": right / len(run.dev_feats), "loss": loss_sum / len(run.dev_feats)}

    return evaluate


def _metrics(cfg: TeacherConfig, run: _Run, recipe: Recipe, engine: Engine, *, train: str, dev: str) -> dict:
    """metrics.json, but the saved weights' hash (added once they are written)."""
    history = recipe.history
    best = max(history, key=lambda r: r["dev_accuracy"])  # max keeps the first of equal bests, as the recipe
    return {
        "best_dev_accuracy": best["dev_accuracy"],
        "best_epoch": best["epoch"],
        "best_step": best["step"],
        "history": history,
        "label_names": list(run.label_names),
        "train_rows": len(run.train.examples),
        "dev_rows": len(run.dev.examples),
        "rejected": {"train": len(run.train.rejects), "dev": len(run.dev.rejects)},
        "base_model": cfg.model,
        "base_model_path": run.model_path,
        "max_length": cfg.max_length,
        "train": train,
        "dev": dev,
        "processes": engine.world,
        "device": str(engine.device),
        "precision": engine.precision,  # as it ran (engine.precision auto: bf16 where the device has it)
        "effective_batch_size": recipe.effective_batch_size,  # as it ran: never more rows than the data held
        "config": {k: v for k, v in typed.to_dict(cfg).items() if k != "progress"},
    }


def trained_max_length(teacher_dir: str) -> Optional[int]:
    """The max_length a `transferset teacher` run used, from its metrics.json (None if absent)."""
    path = os.path.join(teacher_dir, schema.METRICS_FILE)
    try:
        with open(path, encoding="utf-8") as fh:
            value = json.load(fh).get("max_length")
        return int(value) if value else None
    except (OSError, ValueError, TypeError):
        return None
