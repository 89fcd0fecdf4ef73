"""The compress stages: each model exported as it ships (compress.ship, on by default) and what the `compress:`
section sets, each from a model of the run."""
from stage_plans import plan_of, stages  # noqa: F401 (a fixture)
from transferset.app.report.outputs import Compressed


def test_no_section_no_stage_but_each_model_exported_as_it_ships(plan_of):
    plan = plan_of("compress.ship=false")
    assert stages(plan, "compress") == {} and plan.outputs.compressed == {}
    plan = plan_of()
    assert stages(plan, "compress") == {
        "compress.ship.teacher": ("compressed/teacher-onnx", ("teacher",)),
        "compress.ship.labels_only": ("compressed/labels_only-onnx", ("students.labels_only",)),
        "compress.ship.distilled": ("compressed/distilled-onnx", ("students.distilled",))}
    run = plan.outputs.run_dir
    assert plan.outputs.compressed["distilled (ONNX)"] == Compressed(f"{run}/compressed/distilled-onnx", None,
                                                                     "distilled", "onnx")


def test_int8_exits_and_prune_each_from_its_model(plan_of):
    plan = plan_of("compress.int8=[teacher, distilled]", "compress.exits={}", "compress.exit_speeds=[0.1, 0.3]",
                   "compress.prune={heads: 2}")
    assert stages(plan, "compress") == {
        "compress.int8.teacher": ("compressed/teacher-int8", ("teacher",)),
        "compress.int8.distilled": ("compressed/distilled-int8", ("students.distilled",)),
        "compress.ship.labels_only": ("compressed/labels_only-onnx", ("students.labels_only",)),
        "compress.exits": ("compressed/teacher-exits", ("teacher", "score")),
        "compress.prune": ("compressed/teacher-pruned", ("teacher", "score", "dev.score"))}
    c = plan.outputs.compressed
    run = plan.outputs.run_dir
    assert c["distilled (int8)"] == Compressed(f"{run}/compressed/distilled-int8", None, "distilled", "int8")
    assert c["teacher (exits, speed 0.3)"] == Compressed(f"{run}/compressed/teacher-exits", 0.3, "teacher", "exits")
    assert c["teacher (pruned)"].how == "pruned"
    assert plan.outputs.speeds() == {"teacher (exits, speed 0.1)": 0.1, "teacher (exits, speed 0.3)": 0.3}
    # the test split scores each, after its stage
    assert plan.stages[-1].upstream[-5:] == ("compress.int8.teacher", "compress.int8.distilled",
                                             "compress.ship.labels_only", "compress.exits", "compress.prune")
