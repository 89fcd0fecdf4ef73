"""The data stage: a stage of its own folder when train is split, an input key otherwise."""
import json

from stage_plans import plan_of, stages  # noqa: F401 (a fixture)


def test_a_split_is_a_stage_and_no_split_is_an_input(plan_of):
    plan = plan_of()
    assert stages(plan, "data") == {"data": ("data", ())} and plan.stages[0].run is not None
    assert plan.outputs.data.endswith("/r/data")
    bare = plan_of("validation=null", "unlabeled_rows=null")
    assert bare.stages[0].run is None and bare.stages[0].folder is None and bare.outputs.data is None


def test_the_split_writes_its_files_and_accounts_for_every_row(plan_of):
    plan = plan_of("validation.rows=50", "labeled_limit=100", "unlabeled_rows=30")
    data = plan.stages[0]
    data.run(data.folder)
    split = json.loads(open(f"{data.folder}/split.json").read())
    assert (split["labeled_rows"], split["unlabeled_rows"], split["validation_rows"]) == (100, 30, 50)
    assert split["labeled_rows"] + split["unlabeled_rows"] + split["validation_rows"] + split["rest_rows"] \
        + split["pool_rows_dropped_inside_validation_rows"] + split["pool_rows_dropped_as_validation_copies"] \
        + split["rejected_rows"] == split["input_rows"] == 67349
    assert len(open(f"{data.folder}/labeled.jsonl").read().splitlines()) == 100
