"""A run's stages as declarations (transferset/app/plan.py makes them; runner.run_stages runs them)."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from transferset import schema


def stage_key(name: str, settings: Any, upstream: Sequence[str]) -> str:
    payload = json.dumps({"stage": name, "settings": settings, "upstream": list(upstream)}, sort_keys=True,
                         default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class StageDef:
    """One stage of a run, declared once: its key is derived from `settings` and its upstream stages' keys.

    A stage whose key is unchanged and whose folder holds `done_file` is reused, not run again.
    """

    name: str  # as logged, e.g. students.distilled
    folder: Optional[str]  # where `run` writes (None: a stage with nothing to run and no folder)
    # what the stage's output depends on besides its upstream stages (JSON values); a callable is
    # called when the stage is reached: settings that read files an upstream stage writes (the
    # carved validation split's content, the transfer set's labels) must be one
    settings: Any
    upstream: tuple[str, ...] = ()  # names of earlier stages whose keys enter this one's
    run: Optional[Callable[[str], Any]] = None  # run(output folder); None: an input, only its key counts
    done_file: str = schema.COMPLETE_MARKER  # relative to folder: exists when the stage finished
    # run writes local files only: a remote folder is staged in a local folder, then uploaded
    local: bool = False
    kind: Optional[str] = None  # the name hashed into the key (None: name); every student hashes "student"
    # resumable(folder) → whether the folder holds a killed run of this stage's work that it goes on from
    # (a teacher's checkpoint): the stage then runs with resume, and its own output protocol keeps the checkpoint
    resumable: Optional[Callable[[str], bool]] = None
    # resume(folder): goes on with a run of this very key that began in the folder and was killed, keeping what
    # it wrote (the score stages' whole shards); without it such a run starts over
    resume: Optional[Callable[[str], Any]] = None

    def key(self, upstream_keys: Sequence[str]) -> str:
        """Its key: a hash of its settings (resolved now) and its upstream stages' keys."""
        settings = self.settings() if callable(self.settings) else self.settings
        return stage_key(self.kind or self.name, settings, upstream_keys)
