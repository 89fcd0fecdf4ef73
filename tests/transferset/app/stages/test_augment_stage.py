"""The augment stage: the transfer set from the labeled and unlabeled pools, the evaluation files kept out."""
from dataclasses import replace

from stage_plans import plan_of, stages  # noqa: F401 (a fixture)
from transferset.app.stages.context import StageFunctions


def test_the_transfer_set_reads_the_pools_and_guards_the_evaluation_files(plan_of, sst2_dir):
    seen = {}
    plan = plan_of()
    assert stages(plan, "augment") == {"augment": ("transfer", ("data",))}
    augment = {s.name: s for s in plan.stages}["augment"]
    assert plan.outputs.transfer.endswith("/r/transfer")
    # what it calls, with a recording function in place of the pipeline
    fn = replace(StageFunctions(), augment=lambda a, **kw: seen.update(kw, n_iter=a.n_iter))
    from transferset.app.stages import augment as kind
    from transferset.app.stages.context import make_run
    from transferset.app.run.runner import load_config, resolve_data
    cfg = load_config("configs/demo.yaml", [f"run_dir={plan.outputs.run_dir}", f"data={sst2_dir}",
                                            "augment.labels=0,1"])
    r = make_run(cfg, resolve_data(cfg.data), fn)
    kind.augment_stage(r, "augment", r.path("transfer"), r.augment, [r.labeled], [r.unlabeled]).run("OUT")
    assert seen["inputs"] == [r.labeled] and seen["unlabeled"] == [r.unlabeled] and seen["output"] == "OUT"
    assert seen["exclude"] == [r.selection, str(sst2_dir / "dev.tsv")] and seen["n_iter"] == 2
    assert augment.settings()["exclude"] == r.guarded_fingerprints
