"""`transferset run`'s stages, one module per stage kind (transferset/app/stages/base.py says what a kind
declares); every module here is found and registered when the plan is first built (transferset.runtime.registry)."""
from transferset.app.stages.base import (KINDS, Compressed, RunOutputs, Stage, StageDef, StageKind,  # noqa: F401
                                         in_order, register, stage_key)
