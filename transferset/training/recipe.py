"""The Recipe: setup → train one epoch → evaluate → save / resume, as methods on one object.

What a run is at any moment is data: `RecipeState` (history, phase log, optimizer steps) and, for the phase
in progress, `PhaseState` (epoch, position in it, best epoch so far, the epoch's sums). A checkpoint is those
two dataclasses with the weights, the optimizer, the scheduler and every rank's random state; resuming
rebuilds them and skips the batches each rank had trained on, so the run goes on at the exact step.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Optional

import torch

from transferset.runtime import deadline
from transferset.runtime.errors import UserError
from transferset.runtime.progress import Progress
from transferset.training.average import WeightAverage
from transferset.training.checkpoints import Checkpoints, cpu_state, rng_state, set_rng_state
from transferset.training.engine import Engine, Sums
from transferset.training.schedules import end_sooner, scheduler as make_scheduler

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
    steps_per_epoch: Optional[int] = None  # batches per epoch on each rank: the schedule's length, the ETA
    ema: float = 0.0                  # the trained weights' moving average: its decay per step (0: none)

    def optimizer_steps(self, grad_accum: int) -> Optional[int]:
        """Optimizer steps of the whole phase as planned (the schedule's T), or None when unknown."""
        if not self.steps_per_epoch:
            return self.max_steps
        steps = self.epochs * math.ceil(self.steps_per_epoch / grad_accum)
        return min(steps, self.max_steps) if self.max_steps else steps


@dataclass
class PhaseState:
    """Where a phase stands: what a checkpoint written during it holds besides weights and optimizer."""

    index: int
    epoch: int = 0                # the epoch under way (from 0)
    batches: int = 0              # batches of it this rank has trained on
    phase_step: int = 0           # optimizer steps in the phase
    best_acc: float = -1.0
    best_state: Optional[dict] = None
    bad: int = 0                  # epochs since the best one
    start_acc: Optional[float] = None
    partial: Optional[dict] = None  # the epoch's sums over every rank when the checkpoint was written
    step_rows: int = 0            # the most rows one optimizer step of the phase took on this rank


@dataclass
class RecipeState:
    history: list = field(default_factory=list)    # one record per epoch, every phase
    phase_log: list = field(default_factory=list)  # one record per phase
    global_step: int = 0                           # optimizer steps, every phase
    step_rows: int = 0                             # the most rows one optimizer step took, over every rank


@dataclass
class _Phase:
    """What `setup` builds for one phase: the spec, the state, and the objects that train."""

    spec: PhaseSpec
    state: PhaseState
    module: torch.nn.Module
    net: torch.nn.Module  # the module, or DDP around it
    optimizer: torch.optim.Optimizer
    scheduler: Any
    progress: Progress
    describe: dict
    stopped: bool = False  # max_steps reached
    lr: float = 0.0        # the learning rate of the last optimizer step (of the first parameter group)
    epochs_run: int = 0
    out_of_time: bool = False  # ended before its epochs by the budget's deadline (transferset.runtime.deadline)
    limit: Optional[int] = None  # the batches of a last epoch the deadline cut short (deadline.part_of_epoch)
    sched_end: int = 0  # the optimizer step at which the schedule ends (the planned total, or the deadline's)
    average: Optional[WeightAverage] = None  # spec.ema: the moving average of each trained parameter

    def params(self) -> list:
        return [p for g in self.optimizer.param_groups for p in g["params"]]


class Recipe:
    """Runs phases in order; keeps the history, the phase log and the checkpoints of one training."""

    def __init__(self, engine: Engine, checkpoint: Optional[Checkpoints] = None, resume: bool = False):
        self.engine, self.checkpoint = engine, checkpoint
        self.state = RecipeState()
        self.resumed: Optional[dict] = self.resume() if resume and checkpoint is not None else None

    @property
    def history(self) -> list:
        return self.state.history

    @property
    def phase_log(self) -> list:
        return self.state.phase_log

    @property
    def global_step(self) -> int:
        return self.state.global_step

    @property
    def effective_batch_size(self) -> Optional[int]:
        """The most rows one optimizer step took, summed over the ranks: the batch as it ran (batch_size × grad_accum
        × processes only when the data holds that many), None before a step. What metrics.json records."""
        return self.state.step_rows or None

    # ------------------------------------------------------------------ resume
    def resume(self) -> Optional[dict]:
        """The checkpoint's content (None when there is none); the run's state taken from it."""
        ck, log = self.checkpoint, self.engine.log
        if not ck.exists():
            log(f"[transferset] resume: no checkpoint at {ck.path}; starting from the beginning")
            return None
        saved = ck.load()
        self.state = RecipeState(**saved["recipe"])
        self.engine.resumed_lines = saved.get("tracked")  # None: a checkpoint from before it was recorded
        p = saved["phase"]
        log(f"[transferset] resuming from {ck.path}: phase {p['index'] + 1}, epoch {p['epoch'] + 1}, "
            f"{p['batches']} batch(es) into it, step {self.state.global_step}")
        return saved

    def _restore(self, phase: _Phase) -> bool:
        """Phase `phase` goes on from the checkpoint: its model, this rank's random state, and (for the
        phase the checkpoint was written in) the optimizer, the scheduler and the phase's state; → whether
        it goes on inside the phase (False: it starts afresh from the checkpoint's model)."""
        r, eng = self.resumed, self.engine
        self.resumed = None
        phase.module.load_state_dict(r["model"])
        rngs = r["rng"]
        set_rng_state(rngs[eng.rank] if len(rngs) == eng.world else rngs[0], eng.device)
        if r["optimizer"] is None or phase.state.index > r["phase"]["index"]:
            return False  # saved as an earlier phase ended: this one starts afresh from that model
        phase.optimizer.load_state_dict(r["optimizer"])
        if phase.scheduler is not None and r.get("scheduler") is not None:
            phase.scheduler.load_state_dict(r["scheduler"])
        phase.state = PhaseState(**r["phase"])
        # The epoch's sums so far (over every rank) go on from rank 0 alone.
        if not eng.is_main:
            phase.state.partial = None
        phase.progress.resumed(phase.state.phase_step)
        return True

    # ------------------------------------------------------------------ setup
    def skip(self, index: int, record: dict) -> bool:
        """Log a phase that does not run; False when a resumed run already logged it."""
        if self.resumed is not None and index < self.resumed["phase"]["index"]:
            return False
        self.state.phase_log.append(record)
        return True

    def setup(self, index: int, spec: PhaseSpec, module: torch.nn.Module,
              make_optimizer: Callable[[], torch.optim.Optimizer], evaluate: Optional[Callable[[], dict]],
              describe: Optional[dict] = None) -> _Phase:
        eng = self.engine
        if spec.steps_per_epoch and eng.cfg.grad_accum > spec.steps_per_epoch:
            # one optimizer step per epoch, and an effective batch the epoch does not hold
            raise UserError(f"grad_accum {eng.cfg.grad_accum} exceeds the {spec.steps_per_epoch} batches of an "
                            f"epoch (phase {spec.name!r}): lower engine.grad_accum to {spec.steps_per_epoch} or "
                            "less, or batch_size")
        optimizer = make_optimizer()
        optimizer.zero_grad(set_to_none=True)  # gradients start from zero, whatever an earlier phase left
        total = spec.optimizer_steps(eng.cfg.grad_accum)
        sched = None
        if eng.cfg.schedule != "constant" or eng.cfg.warmup:
            if total is None:
                raise ValueError(f"phase {spec.name!r}: schedule {eng.cfg.schedule} needs the phase's length "
                                 "(steps_per_epoch or max_steps)")
            sched = make_scheduler(optimizer, eng.cfg.schedule, total, eng.cfg.warmup)
        net = eng.acc.prepare_model(module) if eng.world > 1 else module
        if eng.device.type != "cpu" and eng.world == 1:
            module.to(eng.device)
        progress = Progress(spec.name, unit="steps", total=total, bar=eng.progress_bar, log=eng.log)
        phase = _Phase(spec, PhaseState(index), module, net, optimizer, sched, progress, describe or {})
        phase.sched_end = total or 0
        # index >= the checkpoint's: phases skipped by the caller may lie in between
        resumed = self.resumed
        going_on = resumed is not None and self._restore(phase)
        if going_on:
            phase.epochs_run = phase.state.epoch
        elif spec.start_competes and evaluate is not None:
            phase.state.start_acc = float(eng.from_main(evaluate()["accuracy"]))
            phase.state.best_acc, phase.state.best_state = phase.state.start_acc, cpu_state(module)
        if spec.ema:
            phase.average = WeightAverage(phase.params(), spec.ema, resumed.get("average") if going_on else None)
        return phase

    # ------------------------------------------------------------------ train
    def run(self, index: int, spec: PhaseSpec, module: torch.nn.Module, loss_step: LossStep,
            batches: Callable[[int], Iterable[Batch]], evaluate: Optional[Callable[[], dict]],
            make_optimizer: Callable[[], torch.optim.Optimizer], describe: Optional[dict] = None) -> Optional[dict]:
        """Train phase `index`; → its log entry (None when a resumed run had finished it already).

        `module` is trained in place: on return it holds the phase's best weights when `spec.keep_best`.
        `make_optimizer()` → the optimizer over the parameters that learn in this phase, called after the
        caller has frozen the others; the learning-rate schedule is the engine's. `evaluate` (None: no
        selection split, every epoch counts) → {"accuracy": ...}. `describe` adds entries to each history
        record and to the phase's log entry (e.g. the trainable groups).
        """
        if self.resumed is not None and index < self.resumed["phase"]["index"]:
            return None  # finished before the kill: its weights are in the checkpoint's model state
        phase = self.setup(index, spec, module, make_optimizer, evaluate, describe)
        for epoch in range(phase.state.epoch, spec.epochs):
            phase.state.epoch, last = epoch, phase.limit is not None
            started = time.perf_counter()
            sums = self.train_epoch(phase, loss_step, batches(epoch))
            trained = time.perf_counter() - started
            stop = self.evaluate(phase, sums, evaluate, time.perf_counter() - started) or last
            if not stop:
                self._fit_schedule(phase, trained, time.perf_counter() - started - trained)
            phase.epochs_run = epoch + 1
            if not stop and epoch + 1 < spec.epochs and not self.engine.from_main(
                    deadline.room_for(time.perf_counter() - started)):
                stop = self._out_of_time(phase, trained, time.perf_counter() - started - trained)
            if stop:
                break
            phase.state.epoch, phase.state.batches, phase.state.partial = epoch + 1, 0, None
            if self.checkpoint is not None and epoch + 1 < spec.epochs:
                self.save(phase)
        return self.end_phase(phase)

    def _fit_schedule(self, phase: _Phase, epoch_s: float, evaluated: float, rest: float = 0.0) -> None:
        """The schedule ends where the budget's deadline will end the phase (deadline.end_step, as run() decides),
        so a phase cut short decays its rate all the same; `rest`: the part of this epoch still to train."""
        spec, accum, left = phase.spec, self.engine.cfg.grad_accum, deadline.seconds_left()
        if phase.scheduler is not None and spec.steps_per_epoch and left is not None:
            end = deadline.end_step(math.ceil(spec.steps_per_epoch / accum), phase.state.epoch + 1, spec.epochs,
                                    left - rest * epoch_s, epoch_s, evaluated)
            before, phase.sched_end = phase.sched_end, end_sooner(phase.scheduler, int(self.engine.from_main(end)),
                                                                  phase.sched_end)
            if phase.sched_end < before:
                self.engine.log(f"{spec.name}: the learning-rate schedule now ends at step {phase.sched_end} of "
                                f"{before}, where the time the budget gives this stage will end the phase")

    def _out_of_time(self, phase: _Phase, trained: float, evaluated: float) -> bool:
        """Another epoch as long as the last would end past the deadline: the phase trains on the part of one that
        the time left holds (deadline.part_of_epoch: none under half) and ends; → whether it ends now."""
        spec, st, phase.out_of_time = phase.spec, phase.state, True
        part = self.engine.from_main(deadline.part_of_epoch(trained, evaluated))
        if part:
            phase.limit = int(self.engine.from_main(max(1, int(part * st.batches))))
            self.engine.log(f"{spec.name}: a whole epoch more would end past the time the budget gives this stage: "
                            f"epoch {st.epoch + 2}, its last, trains on {phase.limit} of its {st.batches} batches")
            return False
        self.engine.log(f"{spec.name}: another epoch would end past the time the budget gives this stage: "
                        f"the phase ends after {st.epoch + 1} of {spec.epochs} epochs")
        return True

    def train_epoch(self, phase: _Phase, loss_step: LossStep, batches: Iterable[Batch]) -> Sums:
        """One epoch (from where a resumed one stopped) → this rank's sums. With `grad_accum` N, an optimizer
        step follows every N batches and the epoch's last, each batch's loss divided by N (an epoch's tail of
        k < N batches is scaled by N / k); DDP syncs gradients on the step's last batch only."""
        eng, st, accum = self.engine, phase.state, self.engine.cfg.grad_accum
        sums = Sums(**(st.partial or {}))
        st.partial = None
        it: Iterator[Batch] = iter(batches)
        for _ in range(st.batches):  # the batches a resumed epoch had trained on before the kill
            next(it, None)
        phase.module.train()
        began, probe = time.perf_counter(), max(1, (phase.spec.steps_per_epoch or 0) // 10)
        batch = next(it, None)
        more, pending, pending_rows = eng.all_true(batch is not None), 0, 0
        while more and not phase.stopped and (phase.limit is None or st.batches < phase.limit):
            following = next(it, None)
            more = eng.all_true(following is not None)
            pending += 1
            last = pending == accum or not more
            t0 = time.perf_counter()
            value, parts, rows = self._backward(phase, loss_step, batch, accum, sync=last)
            pending_rows += rows
            if last:
                self._optimizer_step(phase, pending, accum)
                st.step_rows, pending, pending_rows = max(st.step_rows, pending_rows), 0, 0
            st.batches += 1
            if st.epoch == 0 and st.batches == probe and phase.spec.steps_per_epoch:
                # this epoch's time projected, a tenth short: a schedule ended too soon would waste the steps after it
                per_epoch = 0.9 * (time.perf_counter() - began) * phase.spec.steps_per_epoch / st.batches
                self._fit_schedule(phase, per_epoch, 0.0, rest=1 - st.batches / phase.spec.steps_per_epoch)
            sums.add(value, parts, rows, time.perf_counter() - t0)
            if last:
                sums = self._after_step(phase, sums, value, parts)
            batch = following
        return sums

    def _backward(self, phase: _Phase, loss_step: LossStep, batch: Batch, accum: int, sync: bool):
        eng, spec, st = self.engine, phase.spec, phase.state
        batch = eng.to_device(batch)
        no_sync = eng.acc.no_sync(phase.net) if eng.world > 1 and not sync else contextlib.nullcontext()
        with no_sync:
            with eng.autocast():
                loss, parts = loss_step(phase.net, batch)
            value = float(loss.detach())
            if not eng.all_true(math.isfinite(value)):
                where = f"phase {spec.name!r}, epoch {st.epoch + 1}, step {st.phase_step + 1} of the phase"
                terms = ", ".join(f"{k} {v:.4g}" for k, v in parts.items())
                raise UserError(
                    f"the training loss is not finite ({value} on this rank{'; ' + terms if terms else ''}) "
                    f"at {where}: nothing was saved. Check the scored set's teacher_logits / teacher_hidden "
                    "for NaN or inf (transferset inspect), or lower lr")
            eng.backward(loss / accum if accum > 1 else loss)
        return value, parts, _rows(batch)

    def _optimizer_step(self, phase: _Phase, pending: int, accum: int) -> None:
        if pending < accum:  # an epoch's tail: its gradients are the mean over the batches it had
            for p in phase.params():
                if p.grad is not None:
                    p.grad.mul_(accum / pending)
        phase.lr = float(phase.optimizer.param_groups[0]["lr"])
        self.engine.step(phase.optimizer, phase.params(), phase.spec.grad_clip)
        if phase.scheduler is not None:
            phase.scheduler.step()
        phase.optimizer.zero_grad(set_to_none=True)
        if phase.average is not None:
            phase.average.step(phase.state.phase_step)

    def _after_step(self, phase: _Phase, sums: Sums, value: float, parts: dict) -> Sums:
        """Count the optimizer step, log it, and write the checkpoint when one is due; → the sums to go on with."""
        eng, st, spec = self.engine, phase.state, phase.spec
        st.phase_step += 1
        self.state.global_step += 1
        # max_steps ends the phase after this step's epoch is evaluated, never past it
        phase.stopped = spec.max_steps is not None and st.phase_step >= spec.max_steps
        phase.progress.update(1)
        if sums.n % 10 == 0:
            phase.progress.set_postfix(loss=f"{sums.loss / max(1, sums.n):.4f}")
        eng.track({"train/loss": value, "train/lr": phase.lr, **{f"train/{k}": v for k, v in parts.items()}},
                  self.state.global_step)
        every = self.checkpoint.every_steps if self.checkpoint is not None else None
        if not every or self.state.global_step % every:
            return sums
        total = sums.over_ranks(eng)
        st.partial = dataclasses.asdict(total)
        self.save(phase)
        st.partial = None
        # The sums over every rank go on from rank 0, as they would after a resume.
        return total if eng.is_main else Sums(seconds=sums.seconds, parts={k: 0.0 for k in sums.parts})

    # ------------------------------------------------------------------ evaluate
    def evaluate(self, phase: _Phase, sums: Sums, evaluate: Optional[Callable[[], dict]], seconds: float) -> bool:
        """The epoch's record (sums over the ranks, then the selection split); → whether the phase stops."""
        eng, st, spec = self.engine, phase.state, phase.spec
        total = sums.over_ranks(eng)
        # with spec.ema, the weights' average is what is evaluated and kept
        with phase.average.swapped_in() if phase.average is not None else contextlib.nullcontext():
            metrics = evaluate() if evaluate is not None else {}
            dev_acc = float(eng.from_main(metrics["accuracy"])) if evaluate is not None else None
            improved = dev_acc is not None and dev_acc > st.best_acc
            if improved and spec.keep_best:
                st.best_state = cpu_state(phase.module)
        describe = phase.describe
        record = {"phase": spec.name, **{k: v for k, v in describe.items() if k != "trainable"},
                  "epoch": st.epoch + 1, "step": self.state.global_step,
                  "train_loss": total.loss / total.n if total.n else None,
                  "losses": {k: v / max(1, total.n) for k, v in total.parts.items()},
                  "dev_accuracy": dev_acc,
                  **{f"dev_{k}": v for k, v in metrics.items() if k != "accuracy"},
                  "seconds": seconds, "rows": total.rows,
                  "rows_per_second": total.rows / max(total.seconds, 1e-9),
                  **({"trainable": describe["trainable"]} if "trainable" in describe else {})}
        self.state.history.append(record)
        if improved:
            st.best_acc, st.bad = dev_acc, 0
        else:
            st.bad += 1
        loss_text = "n/a" if record["train_loss"] is None else f"{record['train_loss']:.4f}"
        dev_text = "" if dev_acc is None else f", dev accuracy {dev_acc:.4f}" + (" (best so far)" if improved else "")
        eng.log(f"{spec.name} epoch {st.epoch + 1}: train loss {loss_text}{dev_text} ({seconds:.1f}s)")
        eng.track({"dev/accuracy": dev_acc, "train/epoch_loss": record["train_loss"]}, self.state.global_step)
        return phase.stopped or (spec.patience is not None and st.bad >= spec.patience)

    def end_phase(self, phase: _Phase) -> dict:
        spec, st = phase.spec, phase.state
        phase.progress.close()
        self.state.step_rows = max(self.state.step_rows, int(self.engine.sum(st.step_rows)[0]))  # every rank's rows
        if spec.keep_best and st.best_state is not None:
            phase.module.load_state_dict(st.best_state)  # each phase ends on its best checkpoint
        elif phase.average is not None:
            phase.average.load()
        entry = {"phase": spec.name, **phase.describe, "epochs_run": phase.epochs_run,
                 **({"out_of_time": True} if phase.out_of_time else {}),
                 "start_dev_accuracy": st.start_acc, "best_dev_accuracy": st.best_acc if spec.keep_best else None}
        self.state.phase_log.append(entry)
        if self.checkpoint is not None:
            # The next phase starts from here: a kill during it resumes with this phase done.
            done = _Phase(spec, PhaseState(st.index + 1), phase.module, phase.net, None, None, phase.progress, {})
            self.save(done)
        return entry

    # ------------------------------------------------------------------ save
    def save(self, phase: _Phase) -> None:
        """The checkpoint (rank 0 writes it), with every rank's random state; every rank waits for it."""
        eng = self.engine
        rngs = eng.gather(rng_state(eng.device))
        if eng.is_main:
            self.checkpoint.save({
                "phase": dataclasses.asdict(phase.state), "recipe": dataclasses.asdict(self.state),
                "model": cpu_state(phase.module),
                "optimizer": phase.optimizer.state_dict() if phase.optimizer is not None else None,
                "scheduler": phase.scheduler.state_dict() if phase.scheduler is not None else None,
                "average": phase.average.state() if phase.average is not None else None,
                "rng": rngs, "tracked": eng.tracked,
            })
        eng.barrier()

    def restore_finished(self, module: torch.nn.Module) -> None:
        """A resumed run whose checkpoint lies past every phase (killed while saving): its model."""
        if self.resumed is not None:
            module.load_state_dict(self.resumed["model"])
            rngs, eng = self.resumed["rng"], self.engine
            set_rng_state(rngs[eng.rank] if len(rngs) == eng.world else rngs[0], eng.device)
            self.resumed = None

    def finish(self) -> None:
        """The run completed: its checkpoint is no longer needed."""
        if self.checkpoint is not None and self.engine.is_main:
            self.checkpoint.remove()
        self.engine.barrier()
        self.engine.end()


def _rows(batch: Batch) -> int:
    for key in ("labels", "label", "ids", "input_ids", "idx"):
        v = batch.get(key)
        if isinstance(v, torch.Tensor):
            return int(v.shape[0])
    return 0
