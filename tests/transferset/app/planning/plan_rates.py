"""What the plan's tests share: given rates and rows, the demo's config and stages, a plan's total seconds."""
from __future__ import annotations

from transferset.app.planning import estimate as est
from transferset.app.stages import costs
from transferset.app.run.runner import load_config, plan_stages, resolve_data

RATES = costs.Rates(teacher_step_s=1.0, score_rows_s=100.0, augment_rows_s=1000.0,
                    student_step_s={"distilled": 0.1, "labels_only": 0.1}, measured="given")
ROWS = costs.Rows(labeled=3000, unlabeled=14000, selection=1000)


def demo(tmp_path, data, *overrides):
    cfg = load_config("configs/demo.yaml", [f"run_dir={tmp_path / 'r'}", f"data={data}", *overrides])
    return cfg, plan_stages(cfg, resolve_data(cfg.data, cfg.test, cfg.dev)).stages


def total(cfg, stages, reused=frozenset(), rates=RATES):
    return est.total_seconds(est.estimate(cfg, stages, ROWS, rates, set(reused)))
