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
    # the done file of earlier versions (a teacher's or student's metrics.json): it counts only in a folder
    # that has no output record (transferset.fs.output), i.e. one finished before stages wrote _COMPLETE
    legacy_done: Optional[str] = None
    # run writes local files only: a remote folder is staged in a local folder, then uploaded
    local: bool = False
    kind: Optional[str] = None  # the name hashed into the key (None: name); every student hashes "student"
    # legacy(settings) → earlier forms of those settings that name the same work: a folder whose key is one of
    # theirs is current too, and its key stands for it downstream
    legacy: Optional[Callable[[Any], list]] = None
    # resumable(folder) → whether the folder holds a killed run of this stage's work that it goes on from
    # (a teacher's checkpoint): the stage then runs with resume, and its own output protocol keeps the checkpoint
    resumable: Optional[Callable[[str], bool]] = None
    # resume(folder): goes on with a run of this very key that began in the folder and was killed, keeping what
    # it wrote (the score stages' whole shards); without it such a run starts over
    resume: Optional[Callable[[str], Any]] = None

    def keys(self, upstream_keys: Sequence[str]) -> tuple[str, tuple[str, ...]]:
        """(its key, the keys of its settings' legacy forms), the settings resolved once."""
        settings = self.settings() if callable(self.settings) else self.settings
        name = self.kind or self.name
        forms = self.legacy(settings) if self.legacy else []
        return stage_key(name, settings, upstream_keys), tuple(stage_key(name, f, upstream_keys) for f in forms)
