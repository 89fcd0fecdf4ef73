"""The Engine: the Accelerator and what an EngineConfig decides (device, precision, processes, trackers).

Accelerate keeps its device and precision in process-wide state that refuses a change, and `run` trains
several models in one process, each with its own settings. So the Accelerator is always created with the
same `mixed_precision="no"` (the process group, DDP, backward, gradient clipping and trackers are its), and
the precision is the engine's: autocast to bf16 / fp16 around each forward, and for fp16 Accelerate's own
gradient scaler (`accelerate.utils.get_grad_scaler`, the one `mixed_precision="fp16"` would make).
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

from transferset.config import DEVICES, PRECISIONS, TRACKERS, EngineConfig
from transferset.runtime.errors import ConfigError, UserError
from transferset.training.optimizers import clip_grad_norm, has_sparse_grad

TRACK_FILE = "metrics.jsonl"  # OUTPUT/metrics.jsonl: one line per logged step, whatever the tracker
TRACK_DIR = "logs"  # OUTPUT/logs/: the tracker's files (TensorBoard's event files, MLflow's mlruns/)
# one question to an MLflow server before any step: a reachable one answers in well under a second, and
# MLflow's own client retries an unreachable one for minutes once the training has begun
TRACKING_TIMEOUT_S = 3.0


def launch_help(processes: object = "N") -> str:
    return f"torchrun --nproc_per_node {processes} -m transferset.app.cli COMMAND ..."


def launched_processes() -> int:
    """The processes a launcher (torchrun, accelerate launch) started; 1 without one."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def has_bf16(device: torch.device) -> bool:
    """Whether `device` has bfloat16 arithmetic (a CUDA device that supports it; a CPU with AVX512-BF16 or AMX:
    elsewhere bf16 runs emulated, slower than fp32)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device.type == "cpu" and (torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def resolved_precision(precision: str, device: torch.device) -> str:
    """The precision a trainer runs at on `device`: `auto` is bf16 where it has bfloat16 arithmetic, else fp32."""
    if precision != "auto":
        return precision
    return "bf16" if has_bf16(device) else "fp32"


def check_engine(cfg: EngineConfig, where: str = "engine") -> None:
    """Refuse settings this machine or launch cannot honour, before anything runs; `where` names the section."""
    if cfg.device not in DEVICES:
        raise UserError(f"{where}.device {cfg.device!r}: expected one of {', '.join(DEVICES)}")
    if cfg.precision not in PRECISIONS:
        raise UserError(f"{where}.precision {cfg.precision!r}: expected one of {', '.join(PRECISIONS)}")
    if cfg.tracker not in TRACKERS:
        raise UserError(f"{where}.tracker {cfg.tracker!r}: expected one of {', '.join(TRACKERS)}")
    cuda = torch.cuda.is_available()
    if cfg.device == "cuda" and not cuda:
        raise UserError(f"{where}.device cuda: no CUDA device is visible to torch here; use device cpu or auto")
    if cfg.precision == "fp16" and (cfg.device == "cpu" or not cuda):
        raise UserError(f"{where}.precision fp16: float16 training needs a CUDA device (its gradient scaler is "
                        "CUDA's), and this run is on the CPU; use precision bf16 or fp32")
    if cfg.processes is not None and cfg.processes != launched_processes():
        raise UserError(f"{where}.processes {cfg.processes}: this is one of {launched_processes()} process(es); "
                        f"start the command with `{launch_help(cfg.processes)}`, or leave "
                        "processes unset")
    if cfg.tracker != "none":
        from accelerate.utils import is_mlflow_available, is_tensorboard_available, is_wandb_available

        available = {"tensorboard": is_tensorboard_available, "mlflow": is_mlflow_available,
                     "wandb": is_wandb_available}[cfg.tracker]()
        if not available:
            extra = " (pip install 'transferset[tracking]')" if cfg.tracker in ("tensorboard", "mlflow") else ""
            package = "mlflow-skinny" if cfg.tracker == "mlflow" else cfg.tracker
            raise UserError(f"{where}.tracker {cfg.tracker}: the {cfg.tracker} package is not installed; "
                            f"pip install {package}{extra}, or set tracker: none")
        if cfg.tracker == "mlflow":
            check_tracking_server(where)


def check_tracking_server(where: str = "engine") -> None:
    """The MLflow server MLFLOW_TRACKING_URI names (http or https) answers within TRACKING_TIMEOUT_S; any HTTP
    answer will do (a 404 too: the server is there). Another store (a folder, a database) is MLflow's to open."""
    import urllib.error
    import urllib.request

    uri = os.environ.get("MLFLOW_TRACKING_URI", "")
    if not uri.lower().startswith(("http://", "https://")):
        return
    try:
        urllib.request.urlopen(uri, timeout=TRACKING_TIMEOUT_S).close()
    except urllib.error.HTTPError:
        return
    except (OSError, ValueError) as exc:  # refused, no route, DNS, a timeout, a malformed URL
        reason = " ".join(str(getattr(exc, "reason", exc) or type(exc).__name__).split())[:200]
        raise ConfigError(f"{where}.tracker mlflow: MLFLOW_TRACKING_URI={uri} does not answer within "
                          f"{TRACKING_TIMEOUT_S:g} s ({reason}): start the server or correct the URI, or unset "
                          "MLFLOW_TRACKING_URI to log to OUTPUT/logs/mlruns") from None


def mlflow_store(logs: Optional[str]) -> Optional[str]:
    """Where the mlflow tracker logs: the server or store MLFLOW_TRACKING_URI names when it is set, else a
    local file store in `logs`/mlruns (read it with `mlflow ui --backend-store-uri THAT` or MlflowClient);
    → the local store's URI (None: the user's). MLflow 3 keeps the file store in maintenance and refuses it
    unless MLFLOW_ALLOW_FILE_STORE is set, which this does for the process when it chooses one."""
    if os.environ.get("MLFLOW_TRACKING_URI") or logs is None:
        return None
    import mlflow

    uri = "file:" + os.path.abspath(os.path.join(logs, "mlruns"))
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    mlflow.set_tracking_uri(uri)
    return uri


class Engine:
    """The Accelerator and what it decides: device, precision, processes, trackers, logging."""

    def __init__(self, accelerator, cfg: EngineConfig, log: Callable[[str], None], progress_bar: Optional[bool],
                 track_dir: Optional[str]):
        self.acc, self.cfg = accelerator, cfg
        self.log = log if accelerator.is_main_process else (lambda msg: None)
        self.progress_bar = progress_bar if accelerator.is_main_process else False
        self.track_dir = track_dir if accelerator.is_main_process else None
        self.tracking = False
        self.tracked = 0  # lines written to metrics.jsonl: a checkpoint records how many were written by then
        self.resumed_lines: Optional[int] = None  # the checkpoint's count of them, when a run resumes from one
        self.precision = resolved_precision(cfg.precision, self.device)  # as it runs: `auto` decided here
        amp = self.precision != "fp32" and self.device.type in ("cpu", "cuda")
        self.autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.precision) if amp else None
        self.scaler = None
        if cfg.precision == "fp16":
            from accelerate.utils import get_grad_scaler

            self.scaler = get_grad_scaler(accelerator.distributed_type)

    @classmethod
    def create(cls, cfg: EngineConfig = EngineConfig(), *, output: Optional[str] = None,
               log: Optional[Callable[[str], None]] = None, progress_bar: Optional[bool] = None,
               find_unused_parameters: bool = True) -> "Engine":
        """`output`: the training's local folder: metrics.jsonl there, a tracker's files in OUTPUT/logs/."""
        from accelerate import Accelerator
        from accelerate.utils import DistributedDataParallelKwargs

        check_engine(cfg)
        if cfg.schedule is None or cfg.warmup is None:
            raise ValueError("a student's engine is trained settled: students.families.settled(cfg) fills in its "
                             "family's schedule and warm-up")
        # Parameters that a phase's loss leaves without a gradient (the width projection outside a
        # repr / pkd loss, the classifier under the repr loss) would stall DDP's reducer otherwise.
        ddp = DistributedDataParallelKwargs(find_unused_parameters=find_unused_parameters)
        # `cpu` also decides the process group: Accelerate starts gloo for N CPU processes only when told
        # the run is on the CPU, so `auto` without a GPU says so.
        on_cpu = cfg.device == "cpu" or (cfg.device == "auto" and not torch.cuda.is_available())
        tracker = None if cfg.tracker == "none" else cfg.tracker
        logs = os.path.join(output, TRACK_DIR) if output else None
        if tracker == "mlflow":
            mlflow_store(logs)
        try:
            acc = Accelerator(cpu=on_cpu, mixed_precision="no", log_with=tracker, project_dir=logs,
                              kwargs_handlers=[ddp])
        except ValueError as exc:  # a CUDA training earlier in this process: Accelerate keeps its device
            raise UserError(f"engine.device {cfg.device}: {exc}; run this training in a process of its own") from exc
        return cls(acc, cfg, log or (lambda msg: print(msg, file=sys.stderr, flush=True)), progress_bar, output)

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

    # ------------------------------------------------------------------ precision
    def autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)

    def backward(self, loss: torch.Tensor) -> None:
        self.acc.backward(self.scaler.scale(loss) if self.scaler is not None else loss)

    def step(self, optimizer, params: list, max_norm: float) -> None:
        """The optimizer step over the gradients so far: unscaled (fp16), clipped through Accelerate."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)
        if max_norm and has_sparse_grad(params):
            clip_grad_norm(params, max_norm)  # a sparse word table's gradient (training/optimizers.py)
        elif max_norm:
            self.acc.clip_grad_norm_(params, max_norm)
        if self.scaler is not None:
            self.scaler.step(optimizer)  # skipped when a gradient overflowed: the scale goes down instead
            self.scaler.update()
        else:
            optimizer.step()

    # ------------------------------------------------------------------ trackers
    def start_tracking(self, project: str, config: dict) -> None:
        if self.track_dir is not None:
            os.makedirs(self.track_dir, exist_ok=True)
            path = os.path.join(self.track_dir, TRACK_FILE)
            # a resumed run keeps the lines written up to its checkpoint and writes the rest again
            kept = _first_lines(path, self.resumed_lines) if self.resumed_lines else []
            with open(path, "w", encoding="utf-8") as fh:
                fh.writelines(kept)
            self.tracked = len(kept)
        if self.acc.log_with:
            self.acc.init_trackers(project, config=_flat(config))
            self.tracking = True

    def track(self, values: dict, step: int) -> None:
        values = {k: v for k, v in values.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if self.track_dir is not None:
            with open(os.path.join(self.track_dir, TRACK_FILE), "a", encoding="utf-8") as fh:
                fh.write(json.dumps({"step": step, **values}) + "\n")
            self.tracked += 1
        if self.tracking:
            self.acc.log(values, step=step)

    def end(self) -> None:
        if self.tracking:
            self.acc.end_training()
            self.tracking = False

    # ------------------------------------------------------------------ processes
    @contextlib.contextmanager
    def seeded(self, seed: int):
        """Dropout and every other draw from torch's global generator start from `seed`; the caller's
        random state is given back afterwards. Checkpoints carry the generator's state on from here."""
        devices = [torch.cuda.current_device()] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            yield

    def to_device(self, batch: dict) -> dict:
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

    def gather(self, value: Any) -> list:
        """Every rank's `value`, in rank order, on every rank."""
        if self.world == 1:
            return [value]
        from accelerate.utils import gather_object

        return gather_object([value])

    def barrier(self) -> None:
        self.acc.wait_for_everyone()


def _first_lines(path: str, n: int) -> list[str]:
    """The first `n` whole lines of `path` (fewer when it has fewer; none when it is missing)."""
    if not os.path.exists(path):
        return []
    kept = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if len(kept) == n or not line.endswith("\n"):
                break
            kept.append(line)
    return kept


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


@dataclass
class Sums:
    """An epoch's figures so far (on one rank, or over every rank after `Engine.sum`): what a Recipe's epoch record
    sums."""

    loss: float = 0.0
    n: int = 0            # batches: the epoch's loss is the mean of theirs
    rows: int = 0
    seconds: float = 0.0  # in training steps alone (no evaluation)
    parts: dict = field(default_factory=dict)

    def add(self, value: float, parts: dict, rows: int, seconds: float) -> None:
        self.loss, self.n, self.rows, self.seconds = self.loss + value, self.n + 1, self.rows + rows, self.seconds + seconds
        for k, v in parts.items():
            self.parts[k] = self.parts.get(k, 0.0) + v

    def over_ranks(self, engine: Engine) -> "Sums":
        loss, n, rows, *parts = engine.sum(self.loss, self.n, self.rows, *self.parts.values())
        return Sums(loss, int(n), int(rows), self.seconds, dict(zip(self.parts, parts)))
