"""The one training recipe of the teacher and the students, on Hugging Face Accelerate.

    engine = Engine.create(device="auto", bf16=False, report_to="none", log=print)
    with engine.seeded(seed):
        recipe = Recipe(engine, checkpoint=Checkpoints(folder, fingerprint), resume=False)
        for i, phase in enumerate(phases):
            recipe.run(i, phase, module, loss_step, batches, evaluate, make_optimizer)

Accelerate gives the device, bf16 autocast, the process group (`torchrun` / `accelerate launch`:
DDP, gloo on CPU) and the trackers (TensorBoard, MLflow, W&B); the loop itself stays here, short
and readable, because what it must do is ours: phases that freeze parameter groups (DDP is
re-wrapped per phase, since it records which parameters learn when it is built), early stopping on
the selection split where the model a phase starts from competes too, data that each rank streams
from its own rows of the Parquet cache (never through a sampler that would load the set), and
checkpoints that a killed run resumes from at the exact step, with the same dropout draws.

What a caller provides per phase: the module to train (its forward takes a batch), a loss step
`(module, batch) → (loss, {name: value})`, the epoch's batches, and an evaluation
`() → {"accuracy": ..., ...}` on the selection split.

With several processes the caller gives each rank disjoint rows; an epoch ends for every rank when
the first one has run out of batches (at most a batch per rank is left out, as DistributedSampler's
drop_last), so that no rank waits forever in an all-reduce. A loss that is not finite on any rank
stops every rank with a UserError that names the phase, epoch and step.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Optional

import torch

from transferset.errors import UserError
from transferset.progress import Progress

DEVICES = ("auto", "cpu", "cuda")
TRACKERS = ("none", "tensorboard", "mlflow", "wandb")
CHECKPOINT_FILE = "state.pt"
CHECKPOINT_FINGERPRINT = "fingerprint.json"  # the checkpoint's fingerprint, beside it

Batch = dict
LossStep = Callable[[torch.nn.Module, Batch], "tuple[torch.Tensor, dict[str, float]]"]


@dataclass
class PhaseSpec:
    """One run of the loop: a fresh optimizer over the parameters that learn in it."""

    name: str                         # in progress lines, epoch lines, history and checkpoints
    epochs: int                       # at most this many epochs
    keep_best: bool = True            # end the phase on the epoch with the best selection accuracy
    patience: Optional[int] = None    # stop after this many epochs without a better accuracy (None: never)
    start_competes: bool = False      # the model as the phase starts is a candidate too (evaluated first)
    max_steps: Optional[int] = None   # stop after this many optimizer steps in the phase
    grad_clip: float = 0.0            # max gradient norm (0: none)
    steps_per_epoch: Optional[int] = None  # for the progress line's total and ETA


class Engine:
    """The Accelerator and what it decides: device, precision, processes, trackers, logging."""

    def __init__(self, accelerator, log: Callable[[str], None], progress_bar: Optional[bool]):
        self.acc = accelerator
        self.log = log if accelerator.is_main_process else (lambda msg: None)
        self.progress_bar = progress_bar if accelerator.is_main_process else False
        self.tracking = False

    @classmethod
    def create(cls, *, device: str = "auto", bf16: bool = False, report_to: str = "none",
               project_dir: Optional[str] = None, log: Optional[Callable[[str], None]] = None,
               progress_bar: Optional[bool] = None, find_unused_parameters: bool = True) -> "Engine":
        from accelerate import Accelerator
        from accelerate.utils import DistributedDataParallelKwargs

        if device not in DEVICES:
            raise UserError(f"device {device!r}: expected one of {', '.join(DEVICES)}")
        if report_to not in TRACKERS:
            raise UserError(f"report_to {report_to!r}: expected one of {', '.join(TRACKERS)}")
        if device == "cuda" and not torch.cuda.is_available():
            raise UserError("device cuda: no CUDA device is visible to torch here; use device: cpu or auto")
        if report_to != "none":
            from accelerate.utils import is_mlflow_available, is_tensorboard_available, is_wandb_available

            available = {"tensorboard": is_tensorboard_available, "mlflow": is_mlflow_available,
                         "wandb": is_wandb_available}[report_to]()
            if not available:
                raise UserError(f"report_to {report_to}: the {report_to} package is not installed; "
                                f"pip install {report_to}, or set report_to: none")
        # Parameters that a phase's loss leaves without a gradient (the width projection outside a
        # repr / pkd loss, the classifier under the repr loss) would stall DDP's reducer otherwise.
        ddp = DistributedDataParallelKwargs(find_unused_parameters=find_unused_parameters)
        # Accelerate keeps its settings in process-wide singletons that refuse a change ("already
        # initialized"): `run` trains several models in one process, each with its own device and
        # precision. Reset them; under a launcher the process group (PartialState) stays.
        from accelerate.state import AcceleratorState, GradientState

        AcceleratorState._reset_state(reset_partial_state=not torch.distributed.is_initialized())
        GradientState._reset_state()
        # `cpu` also decides the process group: Accelerate starts gloo for N CPU processes only when told
        # the run is on the CPU, so `auto` without a GPU says so.
        on_cpu = device == "cpu" or (device == "auto" and not torch.cuda.is_available())
        acc = Accelerator(cpu=on_cpu, mixed_precision="bf16" if bf16 else "no",
                          log_with=None if report_to == "none" else report_to, project_dir=project_dir,
                          kwargs_handlers=[ddp])
        return cls(acc, log or (lambda msg: print(msg, file=sys.stderr, flush=True)), progress_bar)

    @property
    def device(self) -> torch.device:
        return self.acc.device

    @property
    def rank(self) -> int:
        return self.acc.process_index

    @property
    def world(self) -> int:
        return self.acc.num_processes

    @property
    def is_main(self) -> bool:
        return self.acc.is_main_process

    def start_tracking(self, project: str, config: dict) -> None:
        if self.acc.log_with:
            self.acc.init_trackers(project, config=_flat(config))
            self.tracking = True

    def track(self, values: dict, step: int) -> None:
        if self.tracking:
            self.acc.log({k: v for k, v in values.items() if isinstance(v, (int, float))}, step=step)

    def end(self) -> None:
        if self.tracking:
            self.acc.end_training()
            self.tracking = False

    @contextlib.contextmanager
    def seeded(self, seed: int):
        """Dropout and every other draw from torch's global generator start from `seed`; the caller's
        random state is given back afterwards. Checkpoints carry the generator's state on from here."""
        devices = [torch.cuda.current_device()] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            yield

    def to_device(self, batch: Batch) -> Batch:
        if self.device.type == "cpu":
            return batch
        return {k: v.to(self.device, non_blocking=True) if isinstance(v, torch.Tensor) else v
                for k, v in batch.items()}

    def all_true(self, flag: bool) -> bool:
        """Whether `flag` holds on every rank (one all-reduce; no communication on one process)."""
        if self.world == 1:
            return flag
        t = torch.tensor([1.0 if flag else 0.0], device=self.device)
        return bool(self.acc.reduce(t, reduction="sum").item() == self.world)

    def sum(self, *values: float) -> list[float]:
        if self.world == 1:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        return self.acc.reduce(t, reduction="sum").tolist()

    def from_main(self, value: Any) -> Any:
        """Rank 0's `value` on every rank: decisions (early stopping) must agree everywhere."""
        if self.world == 1:
            return value
        from accelerate.utils import broadcast_object_list

        return broadcast_object_list([value], from_process=0)[0]

    def barrier(self) -> None:
        self.acc.wait_for_everyone()


def _flat(config: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in config.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        elif isinstance(v, (int, float, str, bool)) or v is None:
            out[f"{prefix}{k}"] = "None" if v is None else v
        else:
            out[f"{prefix}{k}"] = str(v)
    return out


class Checkpoints:
    """`folder/state.pt`: everything a killed run needs to go on at the exact step.

    Written by rank 0 (a temporary file renamed over the last one: a kill while writing leaves
    the previous checkpoint whole), read by every rank. `fingerprint` (the settings and inputs that
    decide the run) must match on resume: a checkpoint of other settings is refused, not mixed in.
    Loaded with `weights_only=True`: tensors and plain values only, never pickled code.
    """

    def __init__(self, folder: str, fingerprint: dict, every_steps: Optional[int] = None):
        self.folder, self.fingerprint, self.every_steps = folder, fingerprint, every_steps
        self.path = os.path.join(folder, CHECKPOINT_FILE)

    def exists(self) -> bool:
        return os.path.exists(self.path)

    def save(self, state: dict) -> None:
        os.makedirs(self.folder, exist_ok=True)
        tmp = self.path + ".partial"
        torch.save({"fingerprint": self.fingerprint, **state}, tmp)
        os.replace(tmp, self.path)
        # beside it, readable without loading the weights: whether a run may resume from it (matches)
        with open(self._fingerprint_path() + ".partial", "w", encoding="utf-8") as fh:
            json.dump(self.fingerprint, fh, sort_keys=True, default=str)
        os.replace(self._fingerprint_path() + ".partial", self._fingerprint_path())

    def _fingerprint_path(self) -> str:
        return os.path.join(self.folder, CHECKPOINT_FINGERPRINT)

    def matches(self) -> bool:
        """Whether a checkpoint is there and was written with this run's settings and inputs (read from
        its fingerprint file, not from the weights)."""
        if not (self.exists() and os.path.exists(self._fingerprint_path())):
            return False
        try:
            with open(self._fingerprint_path(), encoding="utf-8") as fh:
                theirs = json.load(fh)
        except (OSError, ValueError):
            return False
        return theirs == json.loads(json.dumps(self.fingerprint, sort_keys=True, default=str))

    def load(self) -> dict:
        try:
            state = torch.load(self.path, map_location="cpu", weights_only=True)
        except Exception as exc:  # a truncated or foreign file: say which, and what to do
            raise UserError(f"{self.path}: cannot read the checkpoint ({type(exc).__name__}: {exc}); "
                            "delete it to start over") from exc
        theirs = state.get("fingerprint")
        if theirs != self.fingerprint:
            diff = sorted(k for k in set(self.fingerprint) | set(theirs or {})
                          if (theirs or {}).get(k) != self.fingerprint.get(k))
            raise UserError(f"{self.path}: the checkpoint was written with other settings ({', '.join(diff)} "
                            "differ); resume with the same settings, or delete it to start over")
        return state

    def remove(self) -> None:
        for name in (CHECKPOINT_FILE, CHECKPOINT_FILE + ".partial", CHECKPOINT_FINGERPRINT,
                     CHECKPOINT_FINGERPRINT + ".partial"):
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(self.folder, name))
        with contextlib.suppress(OSError):
            os.rmdir(self.folder)


def _cpu_state(module: torch.nn.Module) -> dict:
    return {k: v.detach().to("cpu", copy=True) for k, v in module.state_dict().items()}


def _rng_state(device: torch.device) -> dict:
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


class Recipe:
    """Runs phases in order; keeps the history, the phase log and the checkpoints of one training."""

    def __init__(self, engine: Engine, checkpoint: Optional[Checkpoints] = None, resume: bool = False):
        self.engine = engine
        self.checkpoint = checkpoint
        self.history: list[dict] = []     # one record per epoch, every phase
        self.phase_log: list[dict] = []   # one record per phase
        self.global_step = 0
        self.resumed: Optional[dict] = None
        if resume and checkpoint is not None:
            if checkpoint.exists():
                self.resumed = checkpoint.load()
                self.history = self.resumed["history"]
                self.phase_log = self.resumed["phase_log"]
                self.global_step = self.resumed["global_step"]
                engine.log(f"[transferset] resuming from {checkpoint.path}: phase {self.resumed['phase'] + 1}, "
                           f"epoch {self.resumed['epoch'] + 1}, {self.resumed['batches']} batch(es) into it, "
                           f"step {self.global_step}")
            else:
                engine.log(f"[transferset] resume: no checkpoint at {checkpoint.path}; starting from the beginning")

    # ------------------------------------------------------------------ one phase

    def skip(self, index: int, record: dict) -> bool:
        """Log a phase that does not run; False when a resumed run already logged it."""
        if self.resumed is not None and index < self.resumed["phase"]:
            return False
        self.phase_log.append(record)
        return True

    def run(self, index: int, spec: PhaseSpec, module: torch.nn.Module, loss_step: LossStep,
            batches: Callable[[int], Iterable[Batch]], evaluate: Callable[[], dict],
            make_optimizer: Callable[[], tuple[torch.optim.Optimizer, Any]],
            describe: Optional[dict] = None) -> Optional[dict]:
        """Train phase `index`; → its log entry (None when a resumed run had finished it already).

        `module` is trained in place: on return it holds the phase's best weights when
        `spec.keep_best`. `make_optimizer()` → (optimizer, scheduler or None) over the parameters
        that learn in this phase, called after the caller has frozen the others. `describe` adds
        entries to each history record and to the phase's log entry (e.g. the trainable groups).
        """
        eng, describe = self.engine, describe or {}
        r = self.resumed
        if r is not None and index < r["phase"]:
            return None  # finished before the kill: its weights are in the checkpoint's model state
        optimizer, scheduler = make_optimizer()
        net = eng.acc.prepare_model(module) if eng.world > 1 else module
        if eng.device.type != "cpu" and eng.world == 1:
            module.to(eng.device)
        best_acc, best_state, bad, start_acc = -1.0, None, 0, None
        first_epoch, skip_batches, partial, phase_step = 0, 0, None, 0
        if r is not None:  # index >= r["phase"]: phases skipped by the caller may lie in between
            module.load_state_dict(r["model"])
            _set_rng_state(r["rng"], eng.device)
            self.resumed = None
            if r["optimizer"] is None or index > r["phase"]:
                r = None  # saved as an earlier phase ended: this one starts afresh from that model
        if r is not None:
            optimizer.load_state_dict(r["optimizer"])
            if scheduler is not None and r.get("scheduler") is not None:
                scheduler.load_state_dict(r["scheduler"])
            best_acc, best_state, bad, start_acc = r["best_acc"], r["best_state"], r["bad"], r["start_acc"]
            first_epoch, skip_batches, phase_step = r["epoch"], r["batches"], r["phase_step"]
            # The epoch's sums so far (over every rank) go on from rank 0 alone.
            partial = r["partial"] if eng.is_main else None
        elif spec.start_competes:
            start_acc = float(eng.from_main(evaluate()["accuracy"]))
            best_acc, best_state = start_acc, _cpu_state(module)
        total_steps = spec.epochs * spec.steps_per_epoch if spec.steps_per_epoch else None
        if spec.max_steps and total_steps:
            total_steps = min(total_steps, spec.max_steps)
        progress = Progress(spec.name, unit="steps", total=total_steps, bar=eng.progress_bar, log=eng.log)
        if phase_step:  # a resumed phase: the steps before the kill
            progress.update(phase_step)
        epochs_run = first_epoch
        stopped = False
        for epoch in range(first_epoch, spec.epochs):
            t0 = time.perf_counter()
            acc_loss, acc_parts, n, rows, step_s = (partial or {}).get("loss", 0.0), dict((partial or {}).get("parts", {})), \
                (partial or {}).get("n", 0), (partial or {}).get("rows", 0), (partial or {}).get("seconds", 0.0)
            done_batches = skip_batches
            it: Iterator[Batch] = iter(batches(epoch))
            for _ in range(skip_batches):  # the batches a resumed epoch had trained on before the kill
                next(it, None)
            skip_batches, partial = 0, None
            module.train()
            while not stopped:
                batch = next(it, None)
                if not eng.all_true(batch is not None):
                    break
                t1 = time.perf_counter()
                batch = eng.to_device(batch)
                with eng.acc.autocast():
                    loss, parts = loss_step(net, batch)
                value = float(loss.detach())
                if not eng.all_true(math.isfinite(value)):
                    where = f"phase {spec.name!r}, epoch {epoch + 1}, step {phase_step + 1} of the phase"
                    terms = ", ".join(f"{k} {v:.4g}" for k, v in parts.items())
                    raise UserError(
                        f"the training loss is not finite ({value} on this rank{'; ' + terms if terms else ''}) "
                        f"at {where}: nothing was saved. Check the scored set's teacher_logits / teacher_hidden "
                        "for NaN or inf (transferset inspect), or lower lr")
                optimizer.zero_grad(set_to_none=True)
                eng.acc.backward(loss)
                if spec.grad_clip:
                    torch.nn.utils.clip_grad_norm_([p for g in optimizer.param_groups for p in g["params"]],
                                                   spec.grad_clip)
                optimizer.step()
                if scheduler is not None:
                    scheduler.step()
                step_s += time.perf_counter() - t1
                phase_step += 1
                self.global_step += 1
                done_batches += 1
                # max_steps ends the phase after this step's epoch is evaluated, never past it
                stopped = spec.max_steps is not None and phase_step >= spec.max_steps
                acc_loss, n, rows = acc_loss + value, n + 1, rows + _rows(batch)
                for k, v in parts.items():
                    acc_parts[k] = acc_parts.get(k, 0.0) + v
                progress.update(1)
                if n % 10 == 0:
                    progress.set_postfix(loss=f"{acc_loss / n:.4f}")
                eng.track({"train/loss": value, **{f"train/{k}": v for k, v in parts.items()}}, self.global_step)
                if self.checkpoint is not None and self.checkpoint.every_steps and \
                        self.global_step % self.checkpoint.every_steps == 0:
                    loss_sum, n_sum, rows_sum, *part_sums = eng.sum(acc_loss, n, rows, *acc_parts.values())
                    self._save(index, epoch, done_batches, phase_step, module, optimizer, scheduler,
                               best_acc, best_state, bad, start_acc,
                               partial={"loss": loss_sum, "n": n_sum, "rows": rows_sum, "seconds": step_s,
                                        "parts": dict(zip(acc_parts, part_sums))})
                    # The sums over every rank go on from rank 0, as they would after a resume.
                    if eng.is_main:
                        acc_loss, n, rows = loss_sum, int(n_sum), int(rows_sum)
                        acc_parts = dict(zip(acc_parts, part_sums))
                    else:
                        acc_loss, n, rows, acc_parts = 0.0, 0, 0, {k: 0.0 for k in acc_parts}
            # ---- the epoch's record: sums over the ranks, then the selection split
            loss_sum, n_sum, rows_sum, *part_sums = eng.sum(acc_loss, n, rows, *acc_parts.values())
            metrics = evaluate()
            dev_acc = float(eng.from_main(metrics["accuracy"]))
            epochs_run = epoch + 1
            record = {"phase": spec.name, **{k: v for k, v in describe.items() if k != "trainable"},
                      "epoch": epoch + 1, "step": self.global_step,
                      "train_loss": loss_sum / max(1, n_sum) if n_sum else None,
                      "losses": {k: v / max(1, n_sum) for k, v in zip(acc_parts, part_sums)},
                      "dev_accuracy": dev_acc,
                      **{f"dev_{k}": v for k, v in metrics.items() if k != "accuracy"},
                      "seconds": time.perf_counter() - t0, "rows": int(rows_sum),
                      "rows_per_second": rows_sum / max(step_s, 1e-9),
                      **({"trainable": describe["trainable"]} if "trainable" in describe else {})}
            self.history.append(record)
            improved = dev_acc > best_acc
            if improved:
                best_acc, bad = dev_acc, 0
                if spec.keep_best:
                    best_state = _cpu_state(module)
            else:
                bad += 1
            loss_text = "n/a" if record["train_loss"] is None else f"{record['train_loss']:.4f}"
            eng.log(f"{spec.name} epoch {epoch + 1}: "
                    f"train loss {loss_text}, dev accuracy {dev_acc:.4f}"
                    + (" (best so far)" if improved else "") + f" ({record['seconds']:.1f}s)")
            eng.track({"dev/accuracy": dev_acc, "train/epoch_loss": record["train_loss"] or 0.0}, self.global_step)
            if stopped or (spec.patience is not None and bad >= spec.patience):
                break
            if self.checkpoint is not None and epoch + 1 < spec.epochs:
                self._save(index, epoch + 1, 0, phase_step, module, optimizer, scheduler,
                           best_acc, best_state, bad, start_acc, partial=None)
        progress.close()
        if spec.keep_best and best_state is not None:
            module.load_state_dict(best_state)  # each phase ends on its best checkpoint
        entry = {"phase": spec.name, **describe, "epochs_run": epochs_run, "start_dev_accuracy": start_acc,
                 "best_dev_accuracy": best_acc if spec.keep_best else None}
        self.phase_log.append(entry)
        if self.checkpoint is not None:
            # The next phase starts from here: a kill during it resumes with this phase done.
            self._save(index + 1, 0, 0, 0, module, None, None, -1.0, None, 0, None, partial=None)
        return entry

    def _save(self, phase, epoch, batches, phase_step, module, optimizer, scheduler, best_acc, best_state, bad,
              start_acc, partial) -> None:
        eng = self.engine
        if eng.is_main:
            self.checkpoint.save({
                "phase": phase, "epoch": epoch, "batches": batches, "phase_step": phase_step,
                "global_step": self.global_step, "model": _cpu_state(module),
                "optimizer": optimizer.state_dict() if optimizer is not None else None,
                "scheduler": scheduler.state_dict() if scheduler is not None else None,
                "best_acc": best_acc, "best_state": best_state, "bad": bad, "start_acc": start_acc,
                "partial": partial, "rng": _rng_state(eng.device),
                "history": self.history, "phase_log": self.phase_log,
            })
        eng.barrier()

    def restore_finished(self, module: torch.nn.Module) -> None:
        """A resumed run whose checkpoint lies past every phase (killed while saving): its model."""
        if self.resumed is not None:
            module.load_state_dict(self.resumed["model"])
            _set_rng_state(self.resumed["rng"], self.engine.device)
            self.resumed = None

    def finish(self) -> None:
        """The run completed: its checkpoint is no longer needed."""
        if self.checkpoint is not None and self.engine.is_main:
            self.checkpoint.remove()
        self.engine.barrier()
        self.engine.end()


def _rows(batch: Batch) -> int:
    for key in ("labels", "label", "ids", "input_ids"):
        v = batch.get(key)
        if isinstance(v, torch.Tensor):
            return int(v.shape[0])
    return 0

