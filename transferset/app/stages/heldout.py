"""The test stage: every model of the run scored once on the held-out split, after every choice was made."""
from __future__ import annotations

from typing import Any, Callable, Optional

from students.evaluate import evaluate
from transferset import fs
from transferset.app.report.outputs import RunOutputs
from transferset.app.stages.base import StageDef, StageKind, register
from transferset.app.stages.context import Run, fingerprint
from transferset.app.stages.costs import Costing, Estimate, fp32_rate, teacher_weight
from transferset.config import AugmentConfig

TEST_RESULTS_FILE = "accuracy.json"  # in run_dir/test/: every model's accuracy on the test split


def evaluate_on_test(test: str, models: dict[str, Any], out: str, a: AugmentConfig,
                     evaluate_fn: Callable = evaluate, speeds: Optional[dict[str, float]] = None,
                     **ensemble_kwargs: Any) -> dict:
    """Accuracy of each model on the test file, as `transferset evaluate` computes it.

    A model given as a list is a teacher ensemble (`ensemble_kwargs`: its combine setting): its result
    holds each member's too. `speeds`: the early-exit threshold of the models with exits, by name."""
    speeds = speeds or {}
    fs.delete(fs.join(out, TEST_RESULTS_FILE))  # written without the output protocol: cleared by name
    results = {name: evaluate_fn(path, test, **a.column_kwargs(), **(ensemble_kwargs if isinstance(path, list) else {}),
                                 **({"speed": speeds[name]} if name in speeds else {}))
               for name, path in models.items()}
    doc = {"test": test, "models": results}
    fs.write_json(fs.join(out, TEST_RESULTS_FILE), doc, indent=2)
    return doc


STUDENT_TEST_S = 1.0  # a student's evaluation: loading it and its forward passes over a test file of ~1,000 rows


def test_estimate(models: list[str], c: Costing) -> Estimate:
    """Every model over the test rows: the teacher at its fp32 rate (evaluation runs at fp32 whatever the scoring's
    precision), a model made from it at EXPORT_TIMING times that, each loaded as a score stage loads it; a student
    at STUDENT_TEST_S."""
    weights = [teacher_weight(name) for name in models]
    teachers = sum(1 for w in weights if w)
    if c.rates.score_rows_s is None:
        return Estimate("test", f"{len(models)} models × {c.rows.test:,} rows", None)
    return Estimate("test", f"{len(models)} models × {c.rows.test:,} rows",
                    sum(weights) * c.rows.test / fp32_rate(c.rates) + teachers * c.rates.score_fixed_s
                    + (len(models) - teachers) * STUDENT_TEST_S)


def build(r: Run, out: RunOutputs) -> list[StageDef]:
    if not r.test:
        return []
    models, speeds = out.models(), out.speeds()
    combine = {"combine": r.cfg.score.combine} if out.ensemble else {}
    columns = list(r.augment.column_kwargs().values())
    out.test_results = r.path("test", TEST_RESULTS_FILE)
    return [StageDef(
        "test", r.path("test"), {"test": fingerprint(r.test), "columns": columns, "models": list(models), **combine,
                                 **({"speeds": speeds} if speeds else {})}, tuple(out.model_stages),
        run=lambda folder: evaluate_on_test(r.test, models, folder, r.augment, r.fn.evaluate, speeds=speeds, **combine),
        done_file=TEST_RESULTS_FILE, estimate=lambda c: test_estimate(list(models), c))]


KIND = register(StageKind("test", build, after=("compress",)))
