"""`transferset run`'s plan: the stages of every stage kind (one module each under transferset/app/stages/),
in the order the kinds declare; their keys follow from the declarations and the key rules
(transferset/app/stages/keys.py). runner.run_stages runs them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from transferset.app.stages import keys
from transferset.app.report.outputs import RunOutputs
from transferset.app.stages.base import KINDS, StageDef, in_order
from transferset.app.stages.context import DataFiles, StageFunctions, make_run
from transferset.config import RunConfig
from transferset.runtime.progress import log_line


@dataclass(frozen=True)
class RunPlan:
    stages: list[StageDef]  # in the order they run
    selection: str  # the split every choice is made on
    test: Optional[str]  # the split every model is scored on at the end
    outputs: RunOutputs  # what the stages make: the report reads it


def build_plan(cfg: RunConfig, files: DataFiles, fn: StageFunctions = StageFunctions(), rules: keys.KeyRules = keys,
               log: Callable[[str], None] = log_line) -> RunPlan:
    """The run's stages as data, each kind's from its module, in the kinds' order; their keys by `rules`."""
    r = make_run(cfg, files, fn, rules, log)
    out = RunOutputs(run_dir=cfg.run_dir, selection=r.selection, test=r.test)
    stages: list[StageDef] = []
    for kind in in_order(KINDS.values()):
        stages += kind.build(r, out)
        if kind.report_rows is not None:
            out.report_rows.append(kind.report_rows)
    return RunPlan(stages, r.selection, r.test, out)
