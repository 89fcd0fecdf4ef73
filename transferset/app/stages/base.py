"""A run's stages as declarations: `StageDef` (one stage: folder, key settings, upstream stages, what it runs),
`Stage` (one stage at run time: reused when its
record holds its key, else run), `StageKind` (one module's builder of its kind's stages, registered in KINDS) and `RunOutputs`, the typed record
of what the stages make, which each kind fills in as the plan is built and the report and model cards read.
transferset/app/stages/plan.py builds the plan from the kinds in their declared order; runner.run_stages runs it."""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from transferset import fs
from transferset.app.report.outputs import ResultRow, RunOutputs
from transferset.app.stages.costs import Costing, Estimate, Lever, Rows
from transferset.contract import schema
from transferset.fs import remote
from transferset.fs.output import clear as clear_output
from transferset.runtime.registry import Registry, RegistryError


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
    # probe(ready, sample) → what the plan may measure of the stage's work before it runs (None: nothing), `ready`
    # when every stage upstream is reused, `sample` the plan's train texts (the search: its candidates timed
    # untrained, so the plan counts those in budget); estimate.py reads it. A result holding "refuse" (a message)
    # stops the run after the plan is printed, before its first stage (ConfigError: time_budget.plan_time)
    probe: Optional[Callable[[bool, Sequence[str]], Any]] = None
    # estimate(costing) → the stage's rows and seconds on this machine, read from the costing's config (a budget's
    # cut of the config the stage was built with) and rates (None: the plan says "not estimated")
    estimate: Optional[Callable[[Costing], Estimate]] = None
    # under a time budget the stage runs within its share of the minutes left (transferset.runtime.deadline: a
    # trainer ends a phase early rather than run past it); False: a stage whose models must train alike (the search)
    budgeted: bool = True

    def key(self, upstream_keys: Sequence[str]) -> str:
        """Its key: a hash of its settings (resolved now) and its upstream stages' keys."""
        settings = self.settings() if callable(self.settings) else self.settings
        return stage_key(self.kind or self.name, settings, upstream_keys)


@dataclass
class Stage:
    name: str
    directory: str
    key: str
    done_file: str  # relative to directory: exists when the stage finished
    # fn writes local files only: a remote directory is staged in a local folder, then uploaded
    local: bool = False
    resumable: Optional[Callable[[str], bool]] = None  # StageDef.resumable
    resume: Optional[Callable[[str], Any]] = None  # StageDef.resume

    def finished(self) -> bool:
        """Whether the folder holds a finished run of its stage's work (its done file)."""
        return fs.exists(fs.join(self.directory, self.done_file))

    def _record(self) -> dict:
        meta = fs.join(self.directory, schema.STAGE_FILE)
        return fs.read_json(meta) if fs.exists(meta) else {}

    def current_key(self, record: Optional[dict] = None) -> Optional[str]:
        """The key the finished folder holds when it is this stage's, else None.
        A record marked running is a run that began and never finished: nothing is current. `record`: the
        folder's record when already read."""
        record = self._record() if record is None else record
        if not record or record.get("running") or not self.finished():
            return None
        stored = record.get("key")
        return stored if stored == self.key else None

    def run(self, fn: Callable[[str], None], log) -> bool:
        """Run fn(output folder) unless the stage is current; return True when it ran.

        The folder is never deleted: the stage's function, called with overwrite=True, clears what
        transferset wrote there through the output protocol (transferset.fs.output), so others' files
        in it stay. The runner's own record says `running` while the stage runs and holds its key once
        it finished, after any upload, so a stage cut short is redone (or resumed: StageDef.resume).
        """
        record = self._record()
        stored = self.current_key(record)
        if stored is not None:
            log(f"[{self.name}] up to date ({self.directory}, key {stored}): reused")
            return False
        began_here = bool(record.get("running")) and record.get("key") == self.key
        fs.makedirs(self.directory)
        # replaces an earlier run's record before anything else changes here (the output protocol leaves it)
        fs.write_json(fs.join(self.directory, schema.STAGE_FILE), {"key": self.key, "running": True})
        if self.resumable is not None and self.resumable(self.directory):
            log(f"[{self.name}] resuming → {self.directory}")
        elif self.resume is not None and began_here:
            log(f"[{self.name}] resuming the run of key {self.key} killed here → {self.directory}")
            fn = self.resume
        else:
            if self.local and fs.is_remote(self.directory):
                # fn writes a local staging folder, uploaded into this one: what an earlier run wrote here
                # is cleared by the same protocol first, or files it no longer writes would stay beside
                clear_output(self.directory)
            log(f"[{self.name}] running → {self.directory}")
        t0 = time.time()
        if self.local:
            with remote.local_output(self.directory) as work:
                fn(work)
        else:
            fn(self.directory)
        fs.write_json(fs.join(self.directory, schema.STAGE_FILE), {"key": self.key, "seconds": round(time.time() - t0, 1)})
        log(f"[{self.name}] done in {time.time() - t0:.0f}s")
        return True


@dataclass(frozen=True)
class StageKind:
    """A kind of stage, one module each under transferset/app/stages/ (or a package's, by the entry point group
    transferset.stages): `build(run, outputs)` declares its stages for the run (transferset.app.stages.context.Run)
    and records what they make in `outputs`. The plan places a kind after the kinds it names in `after` (whose
    outputs it reads) and before those in `before`. `levers(cfg, stages, rows)`: the settings of its work a time
    budget may cut (transferset/app/planning/time_budget.py), with what a step of each costs.
    `measures(cfg, will_run)`: what the calibration (transferset/app/planning/calibrate.py) times for its stages among
    `will_run` (stage names): "teacher" (the fine-tuning's step), "score" (the scoring rate), "augment" (the ops'
    rate), "students" ({rates key: its StudentConfig}: each one's step). `report_rows(timed)`: its models' rows of
    the report (transferset/app/report/), in the kinds' order."""

    name: str
    build: Callable[[Any, RunOutputs], list[StageDef]]
    after: tuple[str, ...] = ()
    before: tuple[str, ...] = ()
    levers: Optional[Callable[[Any, Sequence[StageDef], Rows], list[Lever]]] = None
    measures: Optional[Callable[[Any, set[str]], dict[str, Any]]] = None
    report_rows: Optional[Callable[[Any], list[ResultRow]]] = None  # its models' rows of the report (report.Timed)


KINDS: Registry[StageKind] = Registry("run stage kind", "transferset.stages", "transferset.app.stages",
                                      skip=("base", "context"))


def register(kind: StageKind) -> StageKind:
    return KINDS.add(kind.name, kind, by=kind.build.__module__)


def in_order(kinds: Sequence[StageKind]) -> list[StageKind]:
    """The kinds in an order that keeps every `after` and `before`; among those free to go next, the first by
    name goes first (whatever order their modules were imported in)."""
    names = sorted(k.name for k in kinds)
    deps: dict[str, set[str]] = {n: set() for n in names}
    for k in kinds:
        for other in (*k.after, *k.before):
            if other not in deps:
                raise RegistryError(f"run stage kind {k.name}: no stage kind {other!r} to follow or precede; "
                                    f"known: {', '.join(names)}")
        deps[k.name].update(k.after)
        for other in k.before:
            deps[other].add(k.name)
    ordered: list[StageKind] = []
    by_name = {k.name: k for k in kinds}
    while deps:
        free = [n for n in names if n in deps and not deps[n]]
        if not free:
            raise RegistryError(f"run stage kinds {', '.join(sorted(deps))} follow each other in a circle")
        ordered.append(by_name[free[0]])
        del deps[free[0]]
        for waiting in deps.values():
            waiting.discard(free[0])
    return ordered
