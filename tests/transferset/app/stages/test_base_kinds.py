"""Stage kinds are ordered from their declarations (`after`, `before`); a new kind is one module, found by the
registry, and its stages run in the place it declares."""
import pytest

from transferset.app.report.outputs import RunOutputs

from transferset.app.stages.base import KINDS, StageDef, StageKind, in_order, register
from transferset.runtime.registry import RegistryError
from stage_plans import plan_of  # noqa: F401 (a fixture)


def _kind(name, after=(), before=()):
    return StageKind(name, lambda r, out: [], after=after, before=before)


def test_the_shipped_kinds_in_their_order():
    assert [k.name for k in in_order(KINDS.values())] == ["data", "teacher", "augment", "score", "layer_texts",
                                                          "students", "compress", "search", "test"]


def test_after_and_before_place_a_kind_and_ties_keep_registration_order():
    kinds = [_kind("a"), _kind("c", after=("a",)), _kind("d", after=("a",)), _kind("b", after=("a",), before=("c",))]
    # after a, b and d are free (c waits for b): b goes first by name, then c and d are free
    assert [k.name for k in in_order(kinds)] == ["a", "b", "c", "d"]
    kinds[3] = _kind("b", after=("a",), before=("c", "d"))
    assert [k.name for k in in_order(kinds)] == ["a", "b", "c", "d"]
    kinds[0] = _kind("a", after=("d",))
    kinds[2] = _kind("d")
    kinds[3] = _kind("b", after=("a",))
    assert [k.name for k in in_order(kinds)] == ["d", "a", "b", "c"]


def test_an_unknown_neighbour_and_a_circle_are_refused():
    with pytest.raises(RegistryError, match="run stage kind b: no stage kind 'x' to follow or precede"):
        in_order([_kind("a"), _kind("b", after=("x",))])
    with pytest.raises(RegistryError, match="follow each other in a circle"):
        in_order([_kind("a", after=("b",)), _kind("b", after=("a",))])


def test_a_kind_registered_twice_is_refused():
    with KINDS.scratch(), pytest.raises(RegistryError, match="run stage kind 'students' is already registered"):
        register(StageKind("students", lambda r, out: []))


def test_a_new_kind_runs_in_its_declared_place_and_reads_what_earlier_kinds_made(plan_of):
    seen = {}

    def build(r, out: RunOutputs) -> list[StageDef]:
        seen["students"] = dict(out.students)  # the students' kind ran before: its folders are known
        out.model_stages.append("extra")
        return [StageDef("extra", r.path("extra"), {"n": 1}, ("students.distilled",))]

    with KINDS.scratch():
        register(StageKind("extra", build, after=("students",), before=("test",)))
        plan = plan_of()
    names = [s.name for s in plan.stages]
    assert names.index("students.distilled") < names.index("extra") < names.index("test")
    assert set(seen["students"]) == {"labels_only", "distilled"}
    assert "extra" in plan.stages[-1].upstream  # the test stage waits for it
    assert "extra" not in [k.name for k in KINDS.values()]  # the scratch registration is gone


def test_a_new_kind_estimates_its_stages_and_a_budget_cuts_its_lever(tmp_path, sst2_dir):
    """A kind owns its facets: its stage's minutes in the plan (StageDef.estimate) and the setting of its work a
    budget may cut (StageKind.levers), at the cost it declares; estimate.py and time_budget.py name neither."""
    from dataclasses import replace

    from transferset.app.planning import estimate as est
    from transferset.app.planning import time_budget as tb
    from transferset.app.run.runner import load_config, plan_stages, resolve_data
    from transferset.app.stages.costs import Estimate, Lever, Rates, Rows

    def build(r, out: RunOutputs) -> list[StageDef]:  # its work: a second per 10 labeled rows it takes
        return [StageDef("extra", r.path("extra"), {"n": 1}, ("data",), run=lambda folder: None,
                         estimate=lambda c: Estimate("extra", "its rows", c.cfg.labeled_limit / 10))]

    def levers(cfg, stages, rows):  # its rows halved, each step nearly free
        now = cfg.labeled_limit  # 3,000 in the demo
        return [Lever("extra rows", now, [now // 2, now // 4], lambda c, v: replace(c, labeled_limit=v or now),
                      ("extra",), lambda _: 0.01)]

    cfg = load_config("configs/demo.yaml", [f"run_dir={tmp_path / 'r'}", f"data={sst2_dir}"])
    rows = Rows(labeled=3000, unlabeled=0, selection=100)
    with KINDS.scratch():
        register(StageKind("extra", build, after=("data",), levers=levers))
        stages = plan_stages(cfg, resolve_data(cfg.data, cfg.test, cfg.dev)).stages
        by = {e.stage: e for e in est.estimate(cfg, stages, rows, Rates(), set())}
        assert by["extra"].seconds == 300.0  # no rate measured: the extra stage and the exports alone are estimated
        cut, cuts = tb.fit(cfg, stages, rows, Rates(), set(), 250 / 60)
        assert cuts == ["extra rows 3,000 → 1,500"] and cut.labeled_limit == 1500
    assert "extra" not in [k.name for k in KINDS.values()]


PLUGIN_STAGE = '''
from dataclasses import replace

from transferset.app.stages.base import StageDef, StageKind, register
from transferset.app.stages.costs import Estimate, Lever


def build(r, out):  # its work: 10 s per labeled row the run takes
    return [StageDef("extra", r.path("extra"), {"n": 1}, ("data",), run=lambda folder: None,
                     estimate=lambda c: Estimate("extra", f"{c.cfg.labeled_limit:,} rows", c.cfg.labeled_limit * 10))]


def levers(cfg, stages, rows):  # those rows halved, each step nearly free
    now = cfg.labeled_limit
    return [Lever("extra rows", now, [now // 2, now // 4], lambda c, v: replace(c, labeled_limit=v or now),
                  ("extra",), lambda _: 0.001)]


register(StageKind("extra", build, after=("data",), levers=levers))
'''


def test_a_stage_kind_of_another_package_plans_estimates_and_is_cut_through_its_entry_point(tmp_path, sst2_dir):
    """A package installed beside transferset (a folder on the path with its dist-info, as pip leaves it) declares
    a stage kind as an entry point: `run --plan` places its stage, counts its minutes and cuts its lever to fit
    --budget-minutes, with no file of this repository changed."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    site = tmp_path / "site"
    (site / "tsstage").mkdir(parents=True)
    (site / "tsstage" / "__init__.py").write_text("")
    (site / "tsstage" / "extra.py").write_text(PLUGIN_STAGE)
    (site / "tsstage-0.1.dist-info").mkdir()
    (site / "tsstage-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: tsstage\nVersion: 0.1\n")
    (site / "tsstage-0.1.dist-info" / "entry_points.txt").write_text("[transferset.stages]\nextra = tsstage.extra\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)}
    # 3,000 labeled rows (the demo's labeled_limit): 500 minutes of the extra stage; 300 leave room for half of them
    done = subprocess.run([str(Path(sys.executable).parent / "transferset"), "run", "--config", "configs/demo.yaml",
                           f"data={sst2_dir}", f"run_dir={tmp_path / 'run'}", "--budget-minutes", "300", "--plan"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    extra = [line.split() for line in done.stderr.splitlines() if line.strip().startswith("extra ")]
    assert extra == [["extra", "250.0", "min", "1,500", "rows"]], done.stderr[-3000:]
    assert not (tmp_path / "run").exists()  # a plan alone writes nothing


def test_each_kind_gives_its_models_rows_of_the_report_in_the_kinds_order(plan_of):
    """The report's rows come from the kinds (StageKind.report_rows), in the order the plan placed them: the
    teacher's first (the others' speed-ups are against it), then the students', then the compressed models'."""
    from transferset.app.report import ROWS, compressed_rows, student_rows, teacher_rows

    plan = plan_of()
    assert plan.outputs.report_rows == [teacher_rows, student_rows, compressed_rows] == list(ROWS)
