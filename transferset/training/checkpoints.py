"""Checkpoints: everything a killed training needs to go on at the exact step, every rank's random state included."""
from __future__ import annotations

import contextlib
import json
import os
from typing import Optional

import torch

from transferset.runtime.errors import UserError

CHECKPOINT_FILE = "state.pt"
CHECKPOINT_FINGERPRINT = "fingerprint.json"  # the checkpoint's fingerprint, beside it


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


def cpu_state(module: torch.nn.Module) -> dict:
    return {k: v.detach().to("cpu", copy=True) for k, v in module.state_dict().items()}


def rng_state(device: torch.device) -> dict:
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)
