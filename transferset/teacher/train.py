"""Fine-tuning a Hugging Face encoder as the teacher: setup → data → train → evaluate → save.

The loop is `transformers.Trainer`: length-grouped batches (`group_by_length`), linear warm-up
and decay, dynamic padding (`DataCollatorWithPadding`), dev accuracy after each epoch and the
best epoch's weights kept (`load_best_model_at_end`). It replaced a hand-written loop:
benchmarks/teacher.py ran both on the same data and settings (3,000 SST-2 rows, MiniLM, 2 epochs,
one torch thread) and the Trainer took 0.85× the loop's time, the gap its fused AdamW makes
(16 against 118 ms per step), with dev accuracy within seed noise (benchmarks/README.md).
The Trainer's checkpoints live in a scratch folder that is removed: the output directory holds
only the model, its tokenizer, metrics.json and the rejected rows.
"""
from __future__ import annotations

import json
import math
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np

from transferset import typed
from transferset import schema, sources
from transferset.config import TeacherConfig
from transferset.errors import UserError
from transferset.fs.output import MODEL_NAMES, Output
from transferset.progress import Progress
from transferset.sources import Example, Reject, SourceSpec
from transferset import loading


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


def total_steps(cfg: TeacherConfig, train_rows: int) -> int:
    """Optimizer steps of the whole training: `epochs` passes, cut at `max_steps`.

    Computed here because the Trainer lets `max_steps` override `epochs` (it would train past
    the last epoch to reach it); the config means "at most".
    """
    steps = math.ceil(train_rows / cfg.batch_size) * cfg.epochs
    return min(steps, cfg.max_steps) if cfg.max_steps is not None else steps


def training_arguments(cfg: TeacherConfig, work_dir: str, steps: int):
    """The Trainer's settings for `cfg`: every TeacherConfig training setting maps onto one of them."""
    import torch
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=work_dir,
        num_train_epochs=cfg.epochs,
        max_steps=steps,
        learning_rate=cfg.lr,
        lr_scheduler_type="linear",
        # transformers 5 folded warmup_ratio into warmup_steps, where 1.0 would mean one step:
        # pass the step count.
        warmup_steps=int(cfg.warmup * steps),
        weight_decay=cfg.weight_decay,  # AdamW; biases and LayerNorm weights get none
        max_grad_norm=1.0,
        per_device_train_batch_size=cfg.batch_size,
        per_device_eval_batch_size=cfg.eval_batch_size,
        # A batch costs what its longest row costs: rows of similar lengths pad little.
        train_sampling_strategy="group_by_length",
        seed=cfg.seed,
        eval_strategy="epoch",
        # Written only when dev accuracy improves (the first of equal bests is kept), as each
        # checkpoint of a large teacher costs time and disk.
        save_strategy="best",
        save_total_limit=1,
        save_only_model=True,  # no optimizer state: the checkpoints are never resumed
        load_best_model_at_end=True,
        metric_for_best_model="accuracy",
        greater_is_better=True,
        logging_strategy="epoch",  # the logged loss is then the epoch's mean training loss
        report_to=[],
        disable_tqdm=True,  # our own progress (a bar on a terminal, lines off one)
        dataloader_pin_memory=torch.cuda.is_available(),  # pinning only speeds up copies to a GPU
    )


def _accuracy(pred) -> dict:
    return {"accuracy": float((np.argmax(pred.predictions, axis=1) == pred.label_ids).mean())}


def _trainer_class():
    """`Trainer`, evaluating dev rows in the order given (the train rows stay length-grouped).

    With group_by_length the Trainer also groups dev rows by length, but in groups of
    len(dev) // (4 × eval batch) batches (`get_length_grouped_indices`): for SST-2's 872 dev rows
    in batches of 128 that is one batch, so every batch padded to about the longest row (1.9× the
    tokens of sorted batches). Dev is passed sorted by length instead: each batch pads to its own
    longest row.
    """
    from torch.utils.data import SequentialSampler
    from transformers import Trainer

    class TeacherTrainer(Trainer):
        def _get_eval_sampler(self, eval_dataset):
            return SequentialSampler(eval_dataset)

    return TeacherTrainer


def _callbacks(cfg: TeacherConfig, log: Callable[[str], None], started: float):
    """(epoch history recorder, progress driver): Trainer callbacks, built here so that transformers
    is imported only when training."""
    from transformers import TrainerCallback

    class History(TrainerCallback):
        """One record per dev evaluation (one per epoch), with the epoch's mean training loss."""

        def __init__(self):
            self.records: list[dict] = []
            self.best: Optional[float] = None
            self._train_loss: Optional[float] = None

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:  # the epoch's training log; eval and summary logs use other keys
                self._train_loss = float(logs["loss"])

        def on_evaluate(self, args, state, control, metrics=None, **kwargs):
            record = {"epoch": len(self.records) + 1, "step": state.global_step, "train_loss": self._train_loss,
                      "dev_accuracy": float(metrics["eval_accuracy"]), "dev_loss": float(metrics["eval_loss"]),
                      "elapsed_s": round(time.time() - started, 2)}
            self.records.append(record)
            improved = self.best is None or record["dev_accuracy"] > self.best  # the Trainer's rule too
            if improved:
                self.best = record["dev_accuracy"]
            loss = "n/a" if record["train_loss"] is None else f"{record['train_loss']:.4f}"
            log(f"epoch {record['epoch']}: train loss {loss}, dev accuracy {record['dev_accuracy']:.4f}"
                + (" (best so far)" if improved else ""))

    class ProgressDriver(TrainerCallback):
        """Optimizer steps into `Progress`: a bar on a terminal, a line every 30 s off one."""

        def __init__(self):
            self.progress: Optional[Progress] = None

        def on_train_begin(self, args, state, control, **kwargs):
            self.progress = Progress("fine-tuning", unit="steps", total=state.max_steps, bar=cfg.progress, log=log)

        def on_step_end(self, args, state, control, **kwargs):
            self.progress.update(state.global_step - self.progress.n)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                self.progress.set_postfix(loss=f"{logs['loss']:.4f}", epoch=round(state.epoch or 0))

        def on_train_end(self, args, state, control, **kwargs):
            self.progress.close()

    return History(), ProgressDriver()


def train(cfg: TeacherConfig, *, train: str, dev: str, output: str, overwrite: bool = False, log=None) -> dict:
    """Fine-tune on `train`; keep the best `dev` checkpoint in `output`; return the metrics written to metrics.json.

    `train` and `dev` are local files; `output` a local folder or a URL (trained in a local staging folder,
    then uploaded), written as transferset.fs.output says: owned while written, _COMPLETE last.
    """
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    out = Output(output, "teacher", names=MODEL_NAMES, overwrite=overwrite,
                 inputs=[train, dev, cfg.model if os.path.exists(cfg.model) else None])
    with out.open():
        out.check()
        for flag, path in (("--train", train), ("--dev", dev)):
            if not path.startswith(sources.HF_PREFIX) and not os.path.isfile(path):
                raise UserError(f"{flag} {path}: no such file")
            sources.check_readable(path)  # a broken header, an hf: split that does not load: before any output
        out.prepare()
        with out.local() as work:
            metrics = _fine_tune(cfg, train=train, dev=dev, out=out, output=work, log=log)
        out.finish()
    return metrics


def _fine_tune(cfg: TeacherConfig, *, train: str, dev: str, out: Output, output: str, log) -> dict:
    """The fine-tuning itself: rejects through `out`, the model and metrics.json into the local folder `output`."""
    import torch
    from transformers import DataCollatorWithPadding, PrinterCallback

    # --- setup ---------------------------------------------------------------------------
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)  # the new classification head is initialised from this
    model_path = loading.resolve_model(cfg.model)
    label_names = cfg.labels or sources.infer_label_names(train, cfg.label_column)

    # --- data ------------------------------------------------------------------------------
    train_data = read_split(train, cfg, label_names)
    dev_data = read_split(dev, cfg, label_names)
    reject_files = {name: out.write_rejects(d.rejects, f"{name}.jsonl") if d.rejects else None
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
    dev_feats = sorted(encode(tokenizer, dev_data.examples, cfg.max_length), key=lambda f: len(f["input_ids"]))

    # --- train, evaluate -----------------------------------------------------------------------
    started = time.time()
    history, progress = _callbacks(cfg, log, started)
    # Checkpoints go to a scratch folder beside the output (same disk, which the user chose for
    # model-sized files) and are removed whatever happens.
    work_dir = tempfile.mkdtemp(prefix=".trainer-", dir=output)
    try:
        args = training_arguments(cfg, work_dir, total_steps(cfg, len(train_feats)))
        trainer = _trainer_class()(model=model, args=args, train_dataset=train_feats, eval_dataset=dev_feats,
                                   data_collator=DataCollatorWithPadding(tokenizer), compute_metrics=_accuracy,
                                   callbacks=[history, progress])
        trainer.remove_callback(PrinterCallback)  # it prints every log dict on stdout, where the CLI writes JSON
        with loading.quiet_transformers(warnings=False):  # a "Writing model shards" bar per checkpoint
            trainer.train()
        best_step = trainer.state.best_global_step
        # --- save ---
        with loading.quiet_transformers():
            trainer.model.save_pretrained(output)  # the best epoch's weights; id2label travels in config.json
        tokenizer.save_pretrained(output)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    best = next(r for r in history.records if r["step"] == best_step)

    metrics = {
        "best_dev_accuracy": best["dev_accuracy"],
        "best_epoch": best["epoch"],
        "best_step": best["step"],
        "history": history.records,
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
    with open(os.path.join(output, schema.METRICS_FILE), "w", encoding="utf-8") as fh:
        json.dump(metrics, fh, indent=2, sort_keys=True, default=list)
        fh.write("\n")
    return metrics


def trained_max_length(teacher_dir: str) -> Optional[int]:
    """The max_length a `transferset teacher` run used, from its metrics.json (None if absent)."""
    path = os.path.join(teacher_dir, schema.METRICS_FILE)
    try:
        with open(path, encoding="utf-8") as fh:
            value = json.load(fh).get("max_length")
        return int(value) if value else None
    except (OSError, ValueError, TypeError):
        return None
