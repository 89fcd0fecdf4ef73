"""Training FastBERT's exits (`transferset exits`): the branches of students/families/exits.py, self-distilled from
the frozen model over a scored transfer set.

setup → data → loss step → train → save, as the other trainers, with one difference that makes it cheap:
the backbone is frozen, so each row's pooled states of layers 1..L-1 (the branches' inputs: the masked mean
of the layer's tokens, or [CLS]) are computed once (no gradients, rows length-sorted into batches) and kept
as float16, (N, L-1, H); every epoch then trains the L-1 small heads on those states alone. The targets are the model's final distribution over the row:
- the teacher's: the scored set's teacher_logits, what `transferset score` cached (no second scoring);
- any other model's (a transformer student): its own head's logits, from that same single pass.
Loss: the sum over branches of KL(softmax(target) ‖ softmax(branch)), mean over rows. Unlabeled rows
are enough; labels are never read. The model and its classifier are never given to the optimizer and
run under inference_mode, so they leave exactly as they came (the saved folder holds them unchanged).

OUT/model/: the model (as `Student.save_pretrained` writes it) with exits.json and exits.safetensors;
OUT/metrics.json; OUT/_COMPLETE.
"""
from __future__ import annotations

import json
import math
import os
import time
from typing import Optional

import torch

from students.families.exits import Branches, BranchesConfig, check_bert_like, layer_states, save_branches
from students.student import Student
from transferset import fs, schema, transfer
from transferset.config import ExitsConfig
from transferset.errors import UserError
from transferset.fs.output import Output
from transferset.fs.remote import local_teacher
from transferset.loading import weights_sha256
from transferset.progress import Progress
from transferset.threads import set_torch_threads
from transferset.training import TRACK_DIR, TRACK_FILE, Engine, PhaseSpec, Recipe, check_engine, launched_processes

EXITS_NAMES = (schema.STUDENT_MODEL_DIR, schema.METRICS_FILE, TRACK_FILE, TRACK_DIR, schema.COMPLETE_MARKER)


def train_exits(model_path: str, scored_dir: str, output: str, cfg: ExitsConfig = ExitsConfig(), *,
                overwrite: bool = False, progress: Optional[bool] = None) -> dict:
    """Train the exits of `model_path` over `scored_dir`; write OUTPUT/model/, OUTPUT/metrics.json,
    OUTPUT/_COMPLETE (transferset.fs.output's protocol); → the metrics."""
    check_engine(cfg.engine, "exits engine")
    if launched_processes() > 1 and int(os.environ.get("RANK", "0")) != 0:
        return _train(model_path, scored_dir, None, None, cfg, progress)  # torchrun: rank 0 alone writes
    out = Output(output, "exits", names=EXITS_NAMES, inputs=[model_path, scored_dir], overwrite=overwrite)
    with out.writing():
        with out.local() as work:
            metrics = _train(model_path, scored_dir, out, work, cfg, progress)
    return metrics


def model_dir_of(path: str) -> str:
    """The folder holding the weights: a `transferset train` output's model/, else the path."""
    inner = os.path.join(path, schema.STUDENT_MODEL_DIR)
    return inner if os.path.isdir(inner) else path


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


def _train(model_path: str, scored_dir: str, out: Optional[Output], work: Optional[str], cfg: ExitsConfig,
           progress: Optional[bool]) -> dict:
    started = time.time()
    set_torch_threads(cfg.threads)
    # ---- setup: a set whose scoring did not finish, or another task's, is refused before anything runs
    transfer.data_files(scored_dir)
    transfer.require_complete(scored_dir)
    meta = transfer.read_metadata(scored_dir, scored=True)
    local = local_teacher(model_path) if fs.is_remote(model_path) else model_path
    student = Student.from_pretrained(local, max_length=cfg.max_length)
    if not isinstance(student, Student):
        raise UserError(f"--model {model_path}: an ONNX export; train the exits on the PyTorch model it came from")
    check_bert_like(student.model, f"--model {model_path}")
    names = list(meta.get(schema.META_LABEL_NAMES) or [])
    if names != student.label_names:
        raise UserError(f"--scored {scored_dir} names labels {names}, --model {model_path} {student.label_names}: "
                        "a set scored for another task; pass the set this model's teacher scored")
    targets_kind = choose_targets(cfg.targets, meta, model_dir_of(local), scored_dir)

    features, targets = _features_and_targets(student, scored_dir, targets_kind, out, cfg, progress)
    features_s = time.time() - started

    # ---- train the branches alone
    engine = Engine.create(cfg.engine, output=work, log=lambda msg: None, progress_bar=progress)
    engine.start_tracking("transferset-exits", {"epochs": cfg.epochs, "lr": cfg.lr, "batch_size": cfg.batch_size})
    branches, losses = fit_branches(features, targets, cfg, engine)
    engine.end()
    if work is None:
        return {"rank": engine.rank}
    with torch.no_grad():
        branch_logits = torch.cat([branches(features[i:i + 4096].float())
                                   for i in range(0, len(features), 4096)])           # (N, L-1, C)
    agreement = (branch_logits.argmax(-1) == targets.argmax(-1)[:, None]).float().mean(0)

    # ---- save: the model as it came, the branches beside it
    model_out = os.path.join(work, schema.STUDENT_MODEL_DIR)
    Student(student.model, student.tokens, student.label_names, student.family, student.config,
            student.teacher_id).save_pretrained(model_out)
    info = {"model": model_path, "scored": scored_dir, "targets": targets_kind, "rows": len(features),
            "epochs": cfg.epochs, "lr": cfg.lr, "batch_size": cfg.batch_size, "seed": cfg.seed}
    save_branches(model_out, branches, info)
    metrics = {**info, "layers": len(branches) + 1, "branch_width": cfg.width, "processes": engine.world,
               "effective_batch_size": cfg.batch_size * cfg.engine.grad_accum * engine.world,
               "branch_parameters": sum(p.numel() for p in branches.parameters()),
               "train_loss": losses,
               # how often each branch (layer 1..L-1) picks the target's class on the training rows
               "branch_agreement": [round(float(a), 4) for a in agreement],
               "features_s": round(features_s, 1), "elapsed_s": round(time.time() - started, 1)}
    with open(os.path.join(work, schema.METRICS_FILE), "w", encoding="utf-8") as fh:
        json.dump(metrics, fh, indent=2)
    return metrics


def _features_and_targets(student: Student, scored_dir: str, targets_kind: str, out: Optional[Output],
                          cfg: ExitsConfig, progress: Optional[bool]) -> tuple[torch.Tensor, torch.Tensor]:
    """The data: the rows (labels never read), the targets, each row's pooled states once."""
    columns = [schema.ID, schema.TEXT, schema.TEXT_B] + ([schema.TEACHER_LOGITS] if targets_kind == "cached" else [])
    table = transfer.read_table(scored_dir, columns)
    if cfg.max_rows is not None:
        table = table.slice(0, cfg.max_rows)
    if table.num_rows == 0:
        raise UserError(f"--scored {scored_dir}: the transfer set has no rows")
    texts = table.column(schema.TEXT).to_pylist()
    texts_b = table.column(schema.TEXT_B).to_pylist()
    pairs = any(b is not None for b in texts_b)
    if out is not None:
        out.prepare()
    features, own = branch_inputs(student, texts, texts_b if pairs else None, cfg.pool, cfg.batch_size, progress)
    if targets_kind == "cached":
        targets = torch.from_numpy(transfer.fixed_list_to_numpy(table.column(schema.TEACHER_LOGITS)).copy())
    else:
        targets = own
    return features, targets


def branch_inputs(student: Student, texts: list, texts_b: Optional[list], how: str, batch_size: int,
                  progress: Optional[bool]) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row through the frozen model once → (its pooled states of layers 1..L-1, float16 (N, L-1, H), the
    model's own logits (N, C)), in row order; rows length-sorted into batches (less padding)."""
    model = student.model.eval()
    n_layers = len(model.base_model.encoder.layer)
    hidden = int(model.config.hidden_size)
    features = torch.empty(len(texts), n_layers - 1, hidden, dtype=torch.float16)
    own = torch.empty(len(texts), len(student.label_names))
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]) + len((texts_b[i] or "") if texts_b else ""))
    bar = Progress("rows through the frozen model", total=len(texts), bar=progress)
    try:
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            b = student._batch([texts[i] for i in idx], [texts_b[i] for i in idx] if texts_b is not None else None)
            pooled, logits = layer_states(model, b["ids"], b["mask"], b["type_ids"], how)
            features[idx] = pooled.to(torch.float16).cpu()
            own[idx] = logits.float().cpu()
            bar.update(len(idx))
    finally:
        bar.close()
    return features, own


def fit_branches(features: torch.Tensor, targets: torch.Tensor, cfg: ExitsConfig,
                 engine: Optional[Engine] = None) -> tuple[Branches, list[float]]:
    """The branches trained by KL to softmax(targets) on the cached states, through the recipe every model here
    trains with (each rank its share of each epoch's batches); → (branches, mean loss per row and epoch)."""
    n, layers, hidden = features.shape
    engine = engine or Engine.create(cfg.engine, log=lambda msg: None, progress_bar=False)
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

    spec = PhaseSpec("exits", cfg.epochs, keep_best=False,
                     steps_per_epoch=max(1, math.ceil(n / cfg.batch_size) // engine.world))
    recipe = Recipe(engine)
    recipe.run(0, spec, branches, loss_step, batches, None, lambda: torch.optim.AdamW(branches.parameters(), lr=cfg.lr))
    totals = engine.sum(*losses)
    return branches.cpu().eval(), [round(t / n, 6) for t in totals]


def exit_loss(branch_logits: torch.Tensor, target_logp: torch.Tensor) -> torch.Tensor:
    """Σ over branches of KL(p_target ‖ p_branch), mean over rows: (B, L-1, C), (B, C) → ()."""
    logq = torch.log_softmax(branch_logits, dim=-1)
    p = target_logp.exp()[:, None]
    return (p * (target_logp[:, None] - logq)).sum(-1).sum(-1).mean()
