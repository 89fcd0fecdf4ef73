"""`transferset run`: configs validate, overrides apply, and the demo runs end to end (reduced)."""
import json
import shutil
from pathlib import Path

import pytest

import pyarrow.parquet as pq

from transferset.app.cli import main
from transferset.contract import schema
from transferset.data import transfer
from transferset.data.card import read_front_matter
from students.compress.export import Int8Refused
from transferset.app.report.outputs import ResultRow
from transferset.app.run.runner import STAGE_FILE, load_config, plan_stages, resolve_data, run_pipeline
from transferset.app.stages.base import stage_key
from transferset.config import AugmentConfig, RunConfig, ScoreConfig, StudentConfig, TeacherConfig
from transferset.fs.output import MODEL_NAMES, Output
from transferset.runtime import typed
from transferset.runtime.errors import ConfigError, UserError

from recording_stages import RecordingStages, _protocol_write  # noqa: F401 (a helper in tests/)

CONFIGS = sorted((Path(__file__).resolve().parents[4] / "configs").glob("*.yaml"))


def test_there_are_configs():
    assert {p.name for p in CONFIGS} >= {"demo.yaml", "sst2_tang.yaml", "sst2_lowres.yaml", "sst2_transformer.yaml"}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_config_validates_and_names_its_command(path):
    first = path.read_text().splitlines()[0]
    assert first == f"# transferset run --config configs/{path.name}"
    cfg = load_config(str(path))
    assert isinstance(cfg, RunConfig) and cfg.students
    assert all(isinstance(s, StudentConfig) for s in cfg.students.values())


def test_overrides_and_defaults_written_once():
    cfg = load_config("configs/demo.yaml", ["teacher.epochs=1", "students.distilled.epochs=3", "data=/x",
                                            "augment.p_mask=0.3", "score.batch_size=64", "score.layers=-1,2"])
    assert (cfg.teacher.epochs, cfg.students["distilled"].epochs, cfg.data) == (1, 3, "/x")
    assert (cfg.augment.p_mask, cfg.score.batch_size, cfg.score.layers) == (0.3, 64, (-1, 2))
    assert cfg.teacher.optim.lr == 5e-5  # untouched settings keep the file's values
    # What the YAML leaves out comes from the stage's dataclass: the one place a default is written.
    assert cfg.score.hidden == ScoreConfig().hidden and cfg.augment.p_ng == AugmentConfig().p_ng
    assert cfg.students["distilled"].optim.weight_decay == StudentConfig().optim.weight_decay


@pytest.mark.parametrize("override, message", [
    ("students.distilled.epochs=abc", "students.distilled.epochs=abc: input should be a valid integer"),
    ("augment.n_iter=abc", "augment.n_iter=abc: input should be a valid integer"),
    ("teacher.epochs=abc", "teacher.epochs=abc: input should be a valid integer"),
    ("teacher.optim.lr=fast", "teacher.optim.lr=fast: input should be a valid number"),
    ("augment.p_mask=1.5", "augment.p_mask=1.5: input should be less than or equal to 1 (expected float)"),
    ("students.distilled.epochz=3", "students.distilled.epochz=3: students.distilled.epochz: unknown setting; known: student, phases, epochs"),
    ("teachr.epochs=3", "teachr.epochs=3: teachr: unknown setting; known: run_dir, data"),
    ("score.forward=fast", "score: --forward 'fast': choose one of ['auto', 'packed', 'padded']"),
    ("augment.recipe=eda", "augment: unknown recipe 'eda'; known: tang, tang_join, tinybert"),
    ("augment.ops=mask,swap", "augment: ops: unknown augmenter 'swap'; known: join, mask, mlm, ngram, pos"),
    ("augment.p_pos=0.95", "augment: word-op probabilities sum to 1.05 > 1 for ops ('mask', 'pos')"),
    ("students.distilled.vocab.tokens=chars", "students.distilled.vocab.tokens=chars: input should be 'wordpiece' or 'words'"),
    ("compress.int8=teacher,nobody", "compress.int8 names ['nobody']: neither `teacher` nor a student of this run"),
    ("compress.exit_speeds=0.5,1.5", "compress.exit_speeds=0.5,1.5: input should be less than or equal to 1"),
    ("compress.exit_speeds=[]", "exit_speeds is empty: give at least one speed"),
    ("compress.prune.heads=-1", "compress.prune.heads=-1: input should be greater than or equal to 0"),
])
def test_bad_settings_refused_with_key_value_and_type(override, message):
    with pytest.raises(UserError) as exc:
        load_config("configs/demo.yaml", [override])
    # blamed on the override when its value is wrong, on the file when a check of the whole config refuses it
    assert str(exc.value).startswith(("configs/demo.yaml: ", f"{override}: ")) and message in str(exc.value)
    if "valid" in message:
        assert "(expected " in str(exc.value)


def test_bad_config_refused_before_any_stage_runs(tmp_path, capsys):
    run_dir = tmp_path / "run"
    rc = main(["run", "--config", "configs/demo.yaml", f"run_dir={run_dir}", "students.distilled.epochs=abc"])
    err = capsys.readouterr().err
    assert rc == 2 and "students.distilled.epochs=abc: " in err and "(expected int)" in err
    assert not run_dir.exists()


def test_yaml_and_override_syntax_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("run_dir: x\nstudents: {s: [\n")
    with pytest.raises(UserError, match="bad.yaml: not valid YAML"):
        load_config(str(bad))
    bad.write_text("- a\n- b\n")
    with pytest.raises(UserError, match="a config is a YAML mapping of settings, got list"):
        load_config(str(bad))
    with pytest.raises(UserError, match="expected key=value"):
        load_config("configs/demo.yaml", ["teacher.epochs"])
    with pytest.raises(UserError, match=r"data is .*not a section.*set data=VALUE instead"):
        load_config("configs/demo.yaml", ["data=/x", "data.train=x"])
    with pytest.raises(UserError, match="train.tsv not found"):
        resolve_data(str(tmp_path))


def test_run_passes_typed_settings_from_yaml_to_each_stage(tmp_path, sst2_dir):
    """The stage functions are recorders passed to the runner: its wiring is what is under test."""
    rec = RecordingStages()
    cfg = load_config("configs/demo.yaml", [f"run_dir={tmp_path / 'r'}", f"data={sst2_dir}", "augment.p_mask=0.3",
                                            "score.batch_size=64", "students.distilled.optim.lr=0.003",
                                            "beam.workers=2", "unlabeled_rows=50"])
    run_pipeline(cfg, log=lambda m: None, functions=rec.functions())
    seen = rec.seen
    t_cfg, labeled, dev = seen["teacher"]
    assert isinstance(t_cfg, TeacherConfig) and t_cfg.epochs == cfg.teacher.epochs and t_cfg.max_length == 64
    a_cfg, inputs, unlabeled, exclude, beam_cfg = seen["augment"]
    assert isinstance(a_cfg, AugmentConfig) and a_cfg.p_mask == 0.3 and a_cfg.n_iter == cfg.augment.n_iter
    # The demo carves its validation split from train: the teacher picks its epoch on it, and the official
    # dev file becomes the test split; the leak guard keeps both out of the transfer set.
    official_dev = str(sst2_dir / "dev.tsv")
    assert dev == str(tmp_path / "r" / "data" / "validation.jsonl") and sum(1 for _ in open(dev)) == 1000
    assert exclude == [dev, official_dev] and beam_cfg.workers == 2 and beam_cfg.runner == "FnApiRunner"
    # labeled_limit + unlabeled_rows: the first N train rows labeled, the next M as unlabeled text.
    assert sum(1 for _ in open(inputs[0])) == 3000 and sum(1 for _ in open(unlabeled[0])) == 50
    assert inputs[0] == labeled
    (s_cfg, scored_input, _, _), (dev_cfg, dev_input, _, _) = seen["score"]
    assert isinstance(s_cfg, ScoreConfig) and s_cfg.batch_size == 64 and dev_cfg == s_cfg
    assert [c.optim.lr for c, _, _ in seen["students"]] == [None, 0.003]
    # The students early-stop on, and report agreement on, the validation split the teacher scored once.
    dev_rows = transfer.read_table(dev_input)
    assert dev_rows.num_rows == 1000 and dev_rows.column(schema.LABEL).null_count == 0
    assert {d for _, _, d in seen["students"]} == {str(tmp_path / "r" / "dev" / "scored")}
    # ... and find their teacher in the run's own folder, not where the scored set recorded it (a run directory
    # copied elsewhere trained no new student: "the transfer set names no tokenizer directory")
    assert {c.teacher for c, _, _ in seen["students"]} == {str(tmp_path / "r" / "teacher")}
    # Every model is scored once on the test split (the official dev), after the students.
    students = tmp_path / "r" / "students"
    exports = tmp_path / "r" / "compressed"  # and each as it ships (compress.ship)
    assert seen["test"] == [(str(tmp_path / "r" / "teacher"), official_dev),
                            (str(students / "labels_only"), official_dev), (str(students / "distilled"), official_dev),
                            *[(str(exports / f"{name}-onnx"), official_dev)
                              for name in ("teacher", "labels_only", "distilled")]]
    accuracy = json.loads((tmp_path / "r" / "test" / "accuracy.json").read_text())
    assert accuracy["test"] == official_dev and set(accuracy["models"]) == {
        "teacher", "labels_only", "distilled", "teacher (ONNX)", "labels_only (ONNX)", "distilled (ONNX)"}


def test_the_compress_section_makes_each_model_from_the_runs_own_and_tests_it_with_the_rest(tmp_path, sst2_dir):
    """compress: int8 exports of the teacher and a student, the teacher's exits (timed and tested at each speed)
    and its pruned heads: each a stage after the model it is made from, each model on the test split."""
    rec = RecordingStages()
    run_dir = tmp_path / "r"
    cfg = load_config("configs/demo.yaml", [f"run_dir={run_dir}", f"data={sst2_dir}", "unlabeled_rows=50",
                                            "compress.int8=teacher,distilled", "compress.exits={epochs: 3}",
                                            "compress.exit_speeds=0.2,0.5", "compress.prune={heads: 2, epochs: 1}"])
    plan = plan_stages(cfg, resolve_data(cfg.data, cfg.test))
    upstream = {s.name: s.upstream for s in plan.stages}
    assert upstream["compress.int8.teacher"] == ("teacher",)
    assert upstream["compress.int8.distilled"] == ("students.distilled",)
    assert upstream["compress.exits"] == ("teacher", "score")
    assert upstream["compress.prune"] == ("teacher", "score", "dev.score")
    # compress.ship (on by default) exports the one model compress.int8 does not name, as it ships
    assert upstream["compress.ship.labels_only"] == ("students.labels_only",)
    assert upstream["test"][-5:] == ("compress.int8.teacher", "compress.int8.distilled", "compress.ship.labels_only",
                                     "compress.exits", "compress.prune")
    run_pipeline(cfg, log=lambda m: None, functions=rec.functions())
    teacher, compressed = str(run_dir / "teacher"), run_dir / "compressed"
    # The teacher's derivatives read rows as its scored set did (its max_length), a student's as it trained.
    assert rec.seen["export"] == [
        (teacher, str(compressed / "teacher-int8"), {"format": "onnx", "quantize": "int8", "max_length": 64,
                                                     "overwrite": True}),
        (str(run_dir / "students" / "distilled"), str(compressed / "distilled-int8"),
         {"format": "onnx", "quantize": "int8", "max_length": None, "overwrite": True}),
        (str(run_dir / "students" / "labels_only"), str(compressed / "labels_only-onnx"),
         {"format": "onnx", "quantize": "int8", "max_length": None, "overwrite": True})]
    model, scored, _, e_cfg, _ = rec.seen["exits"]
    assert (model, scored, e_cfg.epochs, e_cfg.max_length) == (teacher, str(run_dir / "scored"), 3, 64)
    p_cfg, model, selection, _, settings = rec.seen["prune"]
    assert (p_cfg.heads, p_cfg.epochs, p_cfg.max_length, model) == (2, 1, 64, teacher)
    assert selection == str(run_dir / "dev" / "scored") and settings["transfer_dir"] == str(run_dir / "scored")
    # Every model on the test split once; the exits at each speed.
    tested = [m for m, _ in rec.seen["test"]]
    assert tested[3:] == [str(compressed / "teacher-int8"), str(compressed / "distilled-int8"),
                          str(compressed / "labels_only-onnx"), str(compressed / "teacher-exits"),
                          str(compressed / "teacher-exits"),
                          str(compressed / "teacher-pruned")]
    assert rec.seen["speeds"] == [(str(compressed / "teacher-exits"), 0.2), (str(compressed / "teacher-exits"), 0.5)]
    accuracy = json.loads((run_dir / "test" / "accuracy.json").read_text())
    assert list(accuracy["models"])[3:] == ["teacher (int8)", "distilled (int8)", "labels_only (ONNX)",
                                            "teacher (exits, speed 0.2)",
                                            "teacher (exits, speed 0.5)", "teacher (pruned)"]


def test_an_int8_graph_the_check_refuses_stops_the_run_saying_what_to_change(tmp_path, sst2_dir, monkeypatch):
    """The export's refusal (students/export.Int8Refused) keeps its figures and adds the run's remedy; the
    stages before it are done and kept, so the rerun without that model starts after them."""
    rec = RecordingStages()

    def refused(model, output, **settings):
        rec.seen.setdefault("export", []).append((model, output, settings))
        raise Int8Refused(f"export: the int8 graph of {model} does not agree with the model: its logits differ "
                          "by up to 0.9 where 0.5 is allowed. Nothing was written; export it in float32")

    monkeypatch.setattr(rec, "export", refused)
    run_dir = tmp_path / "r"
    cfg = load_config("configs/demo.yaml", [f"run_dir={run_dir}", f"data={sst2_dir}", "unlabeled_rows=50",
                                            "compress.int8=teacher"])
    with pytest.raises(Int8Refused) as exc:
        run_pipeline(cfg, log=lambda m: None, functions=rec.functions())
    assert str(exc.value) == (f"export: the int8 graph of {run_dir / 'teacher'} does not agree with the model: its "
                              "logits differ by up to 0.9 where 0.5 is allowed. Nothing was written; export it in "
                              "float32. In this run: remove teacher from compress.int8 and run it again (every "
                              "finished stage is reused)")
    assert (run_dir / "students" / "distilled").is_dir() and not (run_dir / "test").exists()


def test_every_model_is_exported_as_it_ships_and_float32_where_the_int8_check_refuses_it(tmp_path, sst2_dir,
                                                                                          monkeypatch):
    """compress.ship (the default): the teacher and each student exported to ONNX, int8 where the export's check
    passes it; a refused int8 graph is exported in float32 instead, and the run goes on to test every export."""
    rec = RecordingStages()
    calls = []

    def export(model, output, **settings):
        calls.append((Path(model).name, settings.get("quantize")))
        if settings.get("quantize") == "int8" and Path(model).name == "teacher":
            raise Int8Refused("export: the int8 graph does not agree with the model")
        _protocol_write(output, "export", MODEL_NAMES, {"model.onnx": "graph"})

    monkeypatch.setattr(rec, "export", export)
    run_dir = tmp_path / "r"
    cfg = load_config("configs/demo.yaml", [f"run_dir={run_dir}", f"data={sst2_dir}", "unlabeled_rows=50"])
    run_pipeline(cfg, log=lambda m: None, functions=rec.functions())
    assert calls == [("teacher", "int8"), ("teacher", None), ("labels_only", "int8"), ("distilled", "int8")]
    tested = [Path(m).name for m, _ in rec.seen["test"]]
    assert tested[3:] == ["teacher-onnx", "labels_only-onnx", "distilled-onnx"]
    off = load_config("configs/demo.yaml", [f"run_dir={tmp_path / 'off'}", f"data={sst2_dir}", "compress.ship=false"])
    assert not [s for s in plan_stages(off, resolve_data(off.data, off.test)).stages if s.name.startswith("compress")]


def test_compressing_an_ensembles_teacher_is_refused_with_what_to_do_instead():
    with pytest.raises(UserError, match=r"compress: exits, prune work on one teacher, and this run's teacher is an "
                                        r"ensemble; compress a member with `transferset export/exits/prune"):
        load_config("configs/demo_ensemble.yaml", ["compress.exits={}", "compress.prune={}"])
    cfg = load_config("configs/demo_ensemble.yaml", ["compress.int8=distilled"])  # a student's int8 is fine
    assert cfg.compress.int8 == ("distilled",)


def test_stages_are_declared_once_with_their_upstream(tmp_path, sst2_dir):
    cfg = load_config("configs/demo.yaml", [f"run_dir={tmp_path / 'r'}", f"data={sst2_dir}"])
    plan = plan_stages(cfg, resolve_data(cfg.data, cfg.test))
    assert [(s.name, s.upstream) for s in plan.stages] == [
        ("data", ()), ("teacher", ("data",)), ("augment", ("data",)), ("score", ("augment", "teacher")),
        ("dev", ()), ("dev.score", ("dev", "teacher")), ("students.labels_only", ("score", "dev.score")),
        ("students.distilled", ("score", "dev.score")), ("compress.ship.teacher", ("teacher",)),
        ("compress.ship.labels_only", ("students.labels_only",)), ("compress.ship.distilled", ("students.distilled",)),
        ("test", ("teacher", "students.labels_only", "students.distilled", "compress.ship.teacher",
                  "compress.ship.labels_only", "compress.ship.distilled"))]
    assert {s.name: s.folder for s in plan.stages}["students.distilled"] == str(tmp_path / "r" / "students" / "distilled")


def test_a_rerun_reuses_every_current_stage_and_redoes_what_changed_downstream(tmp_path, sst2_dir):
    """Keys come from the declarations: a changed student setting redoes that student and the test stage
    only; a changed score setting redoes score, dev.score, both students and the test."""
    base = [f"run_dir={tmp_path / 'r'}", f"data={sst2_dir}", "labeled_limit=200", "unlabeled_rows=20",
            "validation.rows=50"]

    def run(*overrides) -> list[str]:
        log = []
        run_pipeline(load_config("configs/demo.yaml", [*base, *overrides]), log=log.append,
                     functions=RecordingStages().functions())
        return [m.split("]")[0][1:] for m in log if "] running → " in m]

    everything = ["data", "teacher", "augment", "score", "dev", "dev.score", "students.labels_only",
                  "students.distilled", "compress.ship.teacher", "compress.ship.labels_only", "compress.ship.distilled", "test"]
    assert run() == everything
    keys = {s: json.loads((tmp_path / "r" / f / STAGE_FILE).read_text())["key"]
            for s, f in [("data", "data"), ("augment", "transfer"), ("teacher", "teacher"), ("score", "scored")]}
    assert run() == []
    assert run("students.distilled.optim.lr=0.003") == ["students.distilled", "compress.ship.distilled", "test"]
    assert run("students.distilled.optim.lr=0.003", "score.batch_size=64") == [
        "score", "dev.score", "students.labels_only", "students.distilled", "compress.ship.labels_only",
        "compress.ship.distilled", "test"]
    # The derived keys are the ones the hand-written chain wrote before stages were data, so the run
    # directories made then are reused, not redone.
    score = load_config("configs/demo.yaml", base).score
    # (`combine` counts only for a teacher ensemble: one teacher's key leaves it out, as before it existed)
    settings = {k: v for k, v in typed.to_dict(score).items() if k != "combine"}
    assert keys["score"] == stage_key("score", settings, [keys["augment"], keys["teacher"]])


def test_a_students_layer_texts_set_written_again_retrains_that_student(tmp_path, sst2_dir):
    """layer_texts is read by the student stage, not made by the run: its key held the path alone, so a set
    rewritten at the same path was silently not read again."""
    texts = tmp_path / "texts"

    def write_texts(shards: int) -> None:
        shutil.rmtree(texts, ignore_errors=True)
        (texts / schema.DATA_DIR).mkdir(parents=True)
        for k in range(shards):
            pq.write_table(schema.transfer_schema(schema.base_metadata(["0", "1"])).empty_table(),
                           texts / schema.DATA_DIR / f"p{k}.parquet")
        (texts / schema.COMPLETE_MARKER).write_text("")

    base = [f"run_dir={tmp_path / 'r'}", f"data={sst2_dir}", "labeled_limit=200", "unlabeled_rows=20",
            "validation.rows=50", "students.distilled.phases=two-step", "students.distilled.losses.repr=1.0",
            f"students.distilled.layer_texts={texts}"]

    def run() -> list[str]:
        log = []
        run_pipeline(load_config("configs/demo.yaml", base), log=log.append, functions=RecordingStages().functions())
        return [m.split("]")[0][1:] for m in log if "] running → " in m]

    write_texts(1)
    assert "students.distilled" in run()
    assert run() == []
    write_texts(2)
    assert run() == ["students.distilled", "compress.ship.distilled", "test"]
    assert run() == []


def test_layer_texts_rest_is_a_stage_of_the_rows_no_pool_took_read_by_that_student_alone(tmp_path, sst2_dir):
    run_dir = tmp_path / "r"
    base = [f"run_dir={run_dir}", f"data={sst2_dir}", "labeled_limit=200", "unlabeled_rows=20", "validation.rows=50",
            "students.distilled.phases=two-step", "students.distilled.losses.repr=1.0",
            "students.distilled.layer_texts=rest"]

    def run(*overrides):
        rec, log = RecordingStages(), []
        run_pipeline(load_config("configs/demo.yaml", [*base, *overrides]), log=log.append, functions=rec.functions())
        return [m.split("]")[0][1:] for m in log if "] running → " in m], rec.seen

    ran, seen = run()
    assert ran == ["data", "teacher", "augment", "score", "dev", "dev.score", "layer_texts", "students.labels_only",
                   "students.distilled", "compress.ship.teacher", "compress.ship.labels_only", "compress.ship.distilled", "test"]
    cfg, inputs, unlabeled, exclude = seen["augment_outputs"]["layer_texts"]
    assert inputs == [str(run_dir / "data" / "rest.jsonl")] and unlabeled == []
    assert cfg.n_iter == 0 and cfg.unlabeled_n_iter == 0  # the rows as they are
    assert exclude == seen["augment_outputs"]["transfer"][3]  # the evaluation files the transfer set excludes
    rest = (run_dir / "data" / "rest.jsonl").read_text().splitlines()
    stats = json.loads((run_dir / "data" / "split.json").read_text())
    assert len(rest) == stats["rest_rows"] > 60_000  # SST-2 train less 200 + 20 rows and the validation carve
    students = {c.layer_texts for c, _, _ in seen["students"]}
    assert students == {None, str(run_dir / "layer_texts")}  # labels_only reads no such set
    assert run()[0] == []
    assert run("students.distilled.optim.lr=0.003")[0] == ["students.distilled", "compress.ship.distilled", "test"]


def test_layer_texts_rest_without_a_split_and_a_missing_set_are_refused_before_any_stage(tmp_path, sst2_dir):
    base = [f"run_dir={tmp_path / 'r'}", f"data={sst2_dir}", "students.distilled.phases=two-step",
            "students.distilled.losses.repr=1.0"]
    unsplit = ["validation=null", "labeled_limit=null", "unlabeled_rows=null"]
    with pytest.raises(ConfigError, match="layer_texts=rest: .*splits nothing"):
        run_pipeline(load_config("configs/demo.yaml", [*base, *unsplit, "students.distilled.layer_texts=rest"]),
                     log=lambda m: None, functions=RecordingStages().functions())
    with pytest.raises(ConfigError, match=r"layer_texts=.*missing: no such directory"):
        run_pipeline(load_config("configs/demo.yaml", [*base, f"students.distilled.layer_texts={tmp_path / 'missing'}"]),
                     log=lambda m: None, functions=RecordingStages().functions())
    assert not (tmp_path / "r").exists()


def test_layer_texts_rest_when_the_pools_took_every_row_is_refused_at_its_stage(tmp_path, sst2_dir, head_tsv):
    data = tmp_path / "data"
    data.mkdir()
    head_tsv(sst2_dir / "train.tsv", data / "train.tsv", 60)
    head_tsv(sst2_dir / "dev.tsv", data / "dev.tsv", 20)
    run_dir = tmp_path / "r"
    cfg = load_config("configs/demo.yaml", [
        f"run_dir={run_dir}", f"data={data}", "labeled_limit=40", "unlabeled_rows=100", "validation.rows=10",
        "students.distilled.phases=two-step", "students.distilled.losses.repr=1.0", "students.distilled.layer_texts=rest"])
    log = []
    with pytest.raises(UserError, match="took every row of the train file, so none is left: lower labeled_limit"):
        run_pipeline(cfg, log=log.append, functions=RecordingStages().functions())
    stats = json.loads((run_dir / "data" / "split.json").read_text())
    assert stats["rest_rows"] == 0 and (run_dir / "data" / "rest.jsonl").read_text() == ""
    assert "[layer_texts] running → " + str(run_dir / "layer_texts") in log
    assert not (run_dir / "layer_texts" / schema.COMPLETE_MARKER).exists()


def test_the_augment_key_holds_its_settings_at_their_values(tmp_path, sst2_dir):
    """words_per_variant at its default is in the augment key, and set, it changes it."""
    def augment_settings(*overrides):
        cfg = load_config("configs/demo.yaml", [f"run_dir={tmp_path / 'r'}", f"data={sst2_dir}", *overrides])
        return {s.name: s for s in plan_stages(cfg, resolve_data(cfg.data, cfg.test)).stages}["augment"].settings()

    unset = augment_settings()["settings"]
    assert unset["words_per_variant"] is None and unset["n_iter"] == load_config("configs/demo.yaml").augment.n_iter
    assert augment_settings("augment.words_per_variant=5")["settings"] == {**unset, "words_per_variant": 5}


# The demo's latency figures on 40 rows and 2 rounds (report and students): the runs below test the chain,
# not the timing.
QUICK_LATENCY = ["report.latency_rows=40", "report.latency_rounds=2",
                 "students.labels_only.report.latency_examples=40", "students.distilled.report.latency_examples=40"]


@pytest.mark.integration
def test_demo_config_runs_end_to_end_reduced(sst2_dir, tmp_path, head_tsv, capsys):
    run_dir = tmp_path / "demo"
    data = tmp_path / "data"  # the first rows of SST-2's train and dev: dev is the test split here
    data.mkdir()
    head_tsv(sst2_dir / "train.tsv", data / "train.tsv", 2000)
    head_tsv(sst2_dir / "dev.tsv", data / "dev.tsv", 200)
    small = ["labeled_limit=300", "unlabeled_rows=200", "validation.rows=150", "teacher.epochs=1", "teacher.max_steps=15", "augment.n_iter=2",
             "students.labels_only.epochs=1", "students.distilled.epochs=1", f"data={data}",
             *QUICK_LATENCY]
    assert main(["run", "--config", "configs/demo.yaml", f"run_dir={run_dir}", *small]) == 0
    out = capsys.readouterr()
    report = run_dir / "report.html"
    assert report.exists()
    html = report.read_text()
    for png in ("augmentation.png", "teacher_confidence.png", "curves_distilled.png", "curves_labels_only.png"):
        assert (run_dir / "report_files" / png).stat().st_size > 1000
        assert png in html
    results = json.loads((run_dir / "results.json").read_text())
    names = [r["name"] for r in results["rows"]]
    # the teacher, two students, then each exported as it ships (compress.ship): ONNX, int8 where its check passed
    assert names[0] == "teacher" and names[3:] == ["teacher (ONNX)", "labels_only (ONNX)", "distilled (ONNX)"]
    shipped = [r for r in results["rows"][3:] if r["runtime"] == "ONNX Runtime" and r["path"]]
    assert len(shipped) == 3 and all(r["display"].endswith(("(int8, ONNX)", "(float32, ONNX)")) for r in shipped)
    for r in results["rows"]:
        assert 0.0 <= r["dev_accuracy"] <= 1.0 and r["parameters"] > 0
        assert set(r) <= set(ResultRow.__annotations__), set(r) - set(ResultRow.__annotations__)  # typed rows
    assert "| teacher |" in out.out
    # Latency on one thread, with the load it was taken under; on a busy machine no speed-up is printed.
    cond = results["latency_conditions"]
    assert cond["threads"] == 1 and isinstance(cond["busy"], bool) and cond["cpu_count"] >= 1
    assert all((r["speedup_64"] is None) == cond["busy"] for r in results["rows"][1:])
    assert all((r["speedup_1_export"] is None) == cond["busy"] for r in results["rows"])
    assert ("(busy)" in out.out) == cond["busy"] and "Latency: CPU ms per example" in out.out
    assert "timed together in 2 interleaved rounds" in out.out  # the report: section's rounds
    # One model is shipped: RUN/chosen holds a copy of its folder, and the table's first line says which.
    chosen = json.loads((run_dir / "chosen.json").read_text())["chosen"]
    shipped = {r.get("display", r["name"]): r for r in results["rows"] if r["path"]}
    assert chosen["name"] in shipped and chosen["selection"] == shipped[chosen["name"]]["dev_accuracy"]
    assert (run_dir / "chosen" / "README.md").read_text() == (Path(chosen["path"]) / "README.md").read_text()
    assert out.out.startswith(("Ship ", "No model meets")) and chosen["name"] in out.out.splitlines()[0]
    assert results["chosen"] == out.out.splitlines()[0]
    # compared with the labels-only student, unless it is that student (or its export): which one is chosen
    # depends on the timing (10x the teacher)
    plain = chosen["name"].startswith(("student: labels_only", "labels_only"))
    assert chosen["labels_only"] == (None if plain else "student: labels_only (bilstm, joint)")
    stats = json.loads((run_dir / "transfer" / schema.STATS_FILE).read_text())
    # 300 labeled rows (2 variants each) and the next 200 train rows as unlabeled text, as they are.
    assert stats["accepted_rows"] == 500 and stats["n_iter"] == 2 and stats["unlabeled_n_iter"] == 0
    rows = transfer.read_table(str(run_dir / "transfer")).to_pylist()
    assert sum(1 for r in rows if r[schema.LABEL] is None and not r[schema.OPS]) <= 200
    assert all(r[schema.LABEL] is not None for r in rows if not r[schema.OPS]
               if r[schema.SOURCE_ID] in {v[schema.SOURCE_ID] for v in rows if v[schema.OPS]})
    # A rerun with a changed student setting redoes only that student.
    stamps = {d: (run_dir / d / STAGE_FILE).stat().st_mtime_ns for d in ("teacher", "transfer", "scored")}
    distilled = (run_dir / "students" / "distilled" / STAGE_FILE).stat().st_mtime_ns
    labels_only = (run_dir / "students" / "labels_only" / STAGE_FILE).stat().st_mtime_ns
    assert main(["run", "--config", "configs/demo.yaml", f"run_dir={run_dir}", *small,
                 "students.distilled.optim.lr=0.003"]) == 0
    err = capsys.readouterr().err
    assert "[teacher] up to date" in err and "[score] up to date" in err
    assert {d: (run_dir / d / STAGE_FILE).stat().st_mtime_ns for d in ("teacher", "transfer", "scored")} == stamps
    assert (run_dir / "students" / "labels_only" / STAGE_FILE).stat().st_mtime_ns == labels_only
    assert (run_dir / "students" / "distilled" / STAGE_FILE).stat().st_mtime_ns != distilled
    # every saved model folder has a model card whose figures are the rerun's report's (transferset/data/card.py)
    results = json.loads((run_dir / "results.json").read_text())
    for row, folder in zip(results["rows"][:3], ("teacher", "students/labels_only", "students/distilled"), strict=True):
        card = read_front_matter(str(run_dir / folder / "README.md"))["model-index"][0]["results"][0]["metrics"]
        assert {m["name"]: m["value"] for m in card} == {
            "accuracy on the selection split": row["dev_accuracy"], "accuracy on the test split": row["test_accuracy"],
            "CPU ms per example (batch 1)": row["latency_1"], "CPU ms per example (batch 64)": row["latency_64"]}


def test_invalid_yaml_is_one_message_on_the_command_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("students: {s: [\n")
    assert main(["run", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"transferset run: error: {bad}: not valid YAML" in err and "Traceback" not in err


@pytest.mark.integration
def test_a_test_split_is_reported_for_every_model_and_never_reaches_the_transfer_set(sst2_dir, tmp_path, capsys):
    """data/test.tsv: every model is scored on it at the end, as `transferset evaluate` scores it, and
    none of its sentences reaches the transfer set, even when the train file repeats one."""
    data = tmp_path / "data"
    data.mkdir()
    dev_lines = (sst2_dir / "dev.tsv").read_text(encoding="utf-8").splitlines()
    header, dev_rows = dev_lines[0], dev_lines[1:]
    (data / "dev.tsv").write_text("\n".join([header, *dev_rows[:200]]) + "\n", encoding="utf-8")
    (data / "test.tsv").write_text("\n".join([header, *dev_rows[200:400]]) + "\n", encoding="utf-8")
    train = (sst2_dir / "train.tsv").read_text(encoding="utf-8").splitlines()[:401]
    leaked = dev_rows[250]  # a test sentence planted among the labeled train rows
    (data / "train.tsv").write_text("\n".join([*train[:100], leaked, *train[100:]]) + "\n", encoding="utf-8")
    run_dir = tmp_path / "run"
    small = ["labeled_limit=250", "unlabeled_rows=150", "teacher.epochs=1", "teacher.max_steps=10",
             "augment.n_iter=1", "students.labels_only.epochs=1", "students.distilled.epochs=1",
             f"data={data}", f"run_dir={run_dir}", "validation=null", *QUICK_LATENCY,
             # cheaper models made from the run's (the teacher's int8 export is tested in test_export_int8.py)
             "compress.int8=distilled", "compress.exits={epochs: 1}", "compress.exit_speeds=0.5",
             "compress.prune={heads: 1, epochs: 0}",
             "compress.ship=false"]  # the exports as shipped: test_demo_config_runs_end_to_end_reduced
    assert main(["run", "--config", "configs/demo.yaml", *small]) == 0
    out = capsys.readouterr().out
    results = json.loads((run_dir / "results.json").read_text())
    assert results["test"] == str(data / "test.tsv") and results["selection"] == str(data / "dev.tsv")
    by_name = {r["name"] if r["kind"] == "compressed" else r["name"].split(" (")[0].replace("student: ", ""): r
               for r in results["rows"]}
    assert set(by_name) == {"teacher", "labels_only", "distilled", "distilled (int8)", "teacher (exits, speed 0.5)",
                            "teacher (pruned)"}
    compressed = run_dir / "compressed"
    model_dirs = {"teacher": run_dir / "teacher", "labels_only": run_dir / "students" / "labels_only",
                  "distilled": run_dir / "students" / "distilled", "distilled (int8)": compressed / "distilled-int8",
                  "teacher (exits, speed 0.5)": compressed / "teacher-exits", "teacher (pruned)": compressed / "teacher-pruned"}
    for name, directory in model_dirs.items():
        speed = ["--speed", "0.5"] if "exits" in name else []
        for split, key in (("test.tsv", "test_accuracy"), ("dev.tsv", "dev_accuracy")):
            if key == "dev_accuracy" and "exits" not in name:
                continue  # the teacher's and students' selection figures are their training runs' own; the
                # report measures the compressed models' as it does the exits' (report.compressed_rows)
            assert main(["evaluate", "--model", str(directory), "--data", str(data / split), "--json", *speed]) == 0
            evaluated = json.loads(capsys.readouterr().out)
            assert evaluated["labeled_rows"] == 200
            assert by_name[name][key] == pytest.approx(evaluated["accuracy"], abs=1e-12)
    # The compressed rows: what each was made from and how; the exits' mean layers; the pruned teacher lost a head.
    assert by_name["distilled (int8)"]["compressed"]["from"] == "distilled"
    # Which runtime each row was timed on; the table's note names the ONNX Runtime ones.
    # The teacher (and the pruned teacher, a classifier too) on its scoring path: padding-free.
    assert {n: r["runtime"] for n, r in by_name.items()} == {**{n: "PyTorch" for n in by_name},
                                                             "teacher": "PyTorch, padding-free",
                                                             "teacher (pruned)": "PyTorch, padding-free",
                                                             "distilled (int8)": "ONNX Runtime"}
    assert "distilled (int8): ONNX Runtime (an export), every other model PyTorch" in out
    assert "teacher, teacher (pruned): the forward pass that scored the transfer set, padding-free" in out
    assert 1.0 <= by_name["teacher (exits, speed 0.5)"]["mean_layers"] <= 6.0
    pruned = json.loads((compressed / "teacher-pruned" / schema.PRUNE_FILE).read_text())
    assert pruned["heads"] == {"before": 72, "after": 71}
    assert by_name["teacher (pruned)"]["parameters"] < by_name["teacher"]["parameters"]
    assert "teacher (exits, speed 0.5)" in (run_dir / "report.html").read_text()
    assert (run_dir / "report_files" / "frontier.png").stat().st_size > 1000
    assert "| model | selection accuracy | test accuracy |" in out
    # The planted test sentence was read as a labeled train row and dropped by the leak guard.
    texts = {r[schema.TEXT] for r in transfer.read_table(str(run_dir / "transfer")).to_pylist()}
    test_texts = {line.split("\t")[0] for line in dev_rows[200:400]}
    assert not texts & test_texts
    stats = json.loads((run_dir / "transfer" / schema.STATS_FILE).read_text())
    assert stats["excluded_dropped"] >= 1


def test_a_run_dir_owned_by_another_run_is_refused_before_anything_is_written(tmp_path, sst2_dir, capsys):
    import socket
    import time as _time

    from transferset.fs.lock import LockInfo

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    owner = LockInfo(host="another-machine", pid=4242, started=_time.time(), command="run", token="t")
    (run_dir / schema.LOCK_FILE).write_bytes(owner.to_json())
    assert socket.gethostname() != "another-machine"
    rc = main(["run", "--config", "configs/demo.yaml", f"run_dir={run_dir}", f"data={sst2_dir}"])
    err = capsys.readouterr().err
    assert rc == 1 and f"{run_dir} is in use by pid 4242 on host another-machine" in err
    assert sorted(p.name for p in run_dir.iterdir()) == [schema.LOCK_FILE]  # no config.yaml, no stage


@pytest.mark.parametrize("link", ("transfer", "students"))
def test_a_stage_folder_reached_through_a_link_is_refused_before_anything_is_written(tmp_path, sst2_dir, capsys,
                                                                                     link):
    """A run directory whose transfer/ (or students/) is a link to another folder: its stages would clear and
    write that folder. One line, exit 2, the other folder byte for byte as it was, and no config.yaml."""
    import os

    from transferset.testing import tree_hashes

    other = tmp_path / "other"
    (other / schema.DATA_DIR).mkdir(parents=True)
    (other / schema.DATA_DIR / "part-0.parquet").write_bytes(b"another set's rows")
    (other / schema.COMPLETE_MARKER).write_bytes(b"")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    os.symlink(other, run_dir / link)
    before = tree_hashes(str(other))
    rc = main(["run", "--config", "configs/demo.yaml", f"run_dir={run_dir}", f"data={sst2_dir}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and f"run_dir {run_dir}: {link} is a symbolic link (to {other})" in err[-1]
    assert tree_hashes(str(other)) == before and sorted(p.name for p in run_dir.iterdir()) == [link]


def test_file_urls_and_unknown_schemes_in_a_run_config(tmp_path, sst2_dir):
    cfg = load_config("configs/demo.yaml", [f"run_dir=file://{tmp_path}/r", f"data=file://{sst2_dir}",
                                            f"test=file://{sst2_dir}/dev.tsv"])
    assert (cfg.run_dir, cfg.data, cfg.test) == (f"{tmp_path}/r", str(sst2_dir), f"{sst2_dir}/dev.tsv")
    with pytest.raises(ConfigError, match="run_dir.*nosuch"):
        load_config("configs/demo.yaml", ["run_dir=nosuch://bucket/r"])


@pytest.mark.parametrize("overrides, says", [
    (["teacher.model=nosuch://x/y"], "teacher.model nosuch://x/y: unknown URL scheme nosuch://"),
    (["augment.mlm_model=nosuch://m"], "augment.mlm_model nosuch://m: unknown URL scheme nosuch://"),
    (["students.distilled.tokenizer=nosuch://t"], "students.distilled.tokenizer nosuch://t: unknown URL scheme"),
    (["students.distilled.teacher=nosuch://t"], "students.distilled.teacher nosuch://t: unknown URL scheme"),
    (["teacher.model=/no/such/model"], "teacher.model /no/such/model: no such model directory"),
    (["augment.recipe=tinybert", "augment.mlm_model=./no/such/mlm"], "augment.mlm_model ./no/such/mlm: no such model"),
    (["students.distilled.tokenizer=/no/such/tok"], "students.distilled.tokenizer=/no/such/tok: no such directory"),
    (["teacher_path=/no/such/teacher"], "teacher_path=/no/such/teacher: no such directory"),
    # exit 1, suggesting gcsfs for http
    (["students.distilled.teacher=http://example.com/x"],
     "students.distilled.teacher=http://example.com/x: an http:// URL names one file on a web server"),
    (["beam.runner=NoSuchRunner"], "beam.runner 'NoSuchRunner': not a Beam runner; known: DataflowRunner"),
    (["beam.options={projct: p}"], "beam.options.projct: not an Apache Beam pipeline option"),
])
def test_every_path_model_and_runner_setting_is_checked_before_any_stage(overrides, says, tmp_path, sst2_dir,
                                                                         capsys):
    """A bad teacher.model, augment.mlm_model, students.NAME.tokenizer or .teacher, teacher_path, beam.runner or
    beam.options is one line, exit 2, before any stage and before the run folder exists: no traceback after the
    data stage, no exit 1 after scoring."""
    run_dir = tmp_path / "run"
    rc = main(["run", "--config", "configs/demo.yaml", f"run_dir={run_dir}", f"data={sst2_dir}", *overrides])
    err = capsys.readouterr().err
    assert rc == 2 and says in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert not run_dir.exists()


def test_a_bilstm_student_as_a_students_teacher_is_refused_before_any_stage(tmp_path, sst2_dir, capsys):
    """The folder of a BiLSTM student as a student's `teacher` is said to be one, before any stage: nothing about
    sentencepiece after scoring."""
    student = tmp_path / "bilstm"
    (student / schema.STUDENT_MODEL_DIR).mkdir(parents=True)
    (student / schema.STUDENT_MODEL_DIR / schema.STUDENT_SIDECAR_FILE).write_text(json.dumps({"family": "bilstm"}))
    run_dir = tmp_path / "run"
    rc = main(["run", "--config", "configs/demo.yaml", f"run_dir={run_dir}", f"data={sst2_dir}",
               f"students.distilled.teacher={student}"])
    err = capsys.readouterr().err
    assert rc == 2 and (f"students.distilled.teacher {student}: a bilstm student trained by transferset, "
                        "not a Hugging Face teacher") in err, err
    assert not run_dir.exists()


def test_a_missing_config_and_a_python_tag_in_an_override_are_one_line_usage_errors(tmp_path, capsys):
    """`run --config nosuch.yaml`, a !!python tag, broken YAML or a key set twice in an override: one line each,
    exit 2."""
    assert main(["run", "--config", str(tmp_path / "nosuch.yaml")]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'nosuch.yaml'}: no such config file" in err and len(err.strip().splitlines()) == 1
    run_dir = tmp_path / "run"
    assert main(["run", "--config", "configs/demo.yaml", f"run_dir={run_dir}",
                 "teacher.model=!!python/object/apply:os.system ['touch pwned']"]) == 2
    err = capsys.readouterr().err
    assert "could not determine a constructor for the tag" in err and "no !!python tags" in err, err
    assert len(err.strip().splitlines()) == 1 and not run_dir.exists() and not Path("pwned").exists()
    assert main(["run", "--config", "configs/demo.yaml", f"run_dir={run_dir}", "teacher.epochs=[1"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert main(["run", "--config", "configs/demo.yaml", f"run_dir={run_dir}",
                 "students.distilled={epochs: 1, epochs: 2}"]) == 2
    err = capsys.readouterr().err
    assert "`epochs` is set twice (lines 1 and 1); keep one" in err and len(err.strip().splitlines()) == 1, err
    assert not run_dir.exists()


def test_a_teacher_stage_killed_after_a_checkpoint_goes_on_from_it(tmp_path, sst2_dir, monkeypatch):
    """The run keeps a killed teacher's checkpoint (its folder is not cleared) and resumes from it,
    when the checkpoint is of the same settings; checkpoint_steps is in no key."""
    from transferset.app.run import runner

    run_dir = tmp_path / "r"
    base = [f"run_dir={run_dir}", f"data={sst2_dir}", "labeled_limit=200", "unlabeled_rows=20", "validation.rows=50"]
    stages = RecordingStages()
    fresh = stages.teacher

    def killed(cfg, *, train, dev, output, overwrite):
        stages.seen.setdefault("teacher_resume", []).append(cfg.resume)
        if len(stages.seen["teacher_resume"]) == 1:
            with Output(str(output), "teacher", names=MODEL_NAMES, overwrite=overwrite).open() as out:
                out.check()
                out.prepare()
                (Path(output) / "checkpoint").mkdir(exist_ok=True)
                (Path(output) / "checkpoint" / "state.pt").write_text("x")
                raise KeyboardInterrupt
        fresh(cfg, train=train, dev=dev, output=output, overwrite=overwrite)

    stages.teacher = killed
    matches = {"value": True}
    stages.can_resume_teacher = lambda cfg, **paths: matches["value"] \
        and (Path(paths["output"]) / "checkpoint" / "state.pt").exists()
    with pytest.raises(KeyboardInterrupt):
        run_pipeline(load_config("configs/demo.yaml", base), log=lambda m: None, functions=stages.functions())
    log = []
    run_pipeline(load_config("configs/demo.yaml", [*base, "teacher.checkpoint_steps=7"]), log=log.append,
                 functions=stages.functions())
    assert stages.seen["teacher_resume"] == [False, True]
    assert any(m.startswith("[teacher] resuming") for m in log)
    assert (run_dir / "teacher" / "checkpoint" / "state.pt").exists()  # kept, not cleared with the folder
    # a checkpoint of other settings is not resumed: the folder is cleared and the teacher starts over
    matches["value"] = False
    run_pipeline(load_config("configs/demo.yaml", [*base, "teacher.optim.lr=1e-4"]), log=lambda m: None,
                 functions=stages.functions())
    assert stages.seen["teacher_resume"] == [False, True, False]
    # cleared by the teacher's own output protocol (overwrite=True), not by the runner deleting the folder
    assert not (run_dir / "teacher" / "checkpoint").exists()


def test_a_score_stage_killed_midway_goes_on_from_its_shards_and_one_of_other_settings_starts_over(tmp_path,
                                                                                                     sst2_dir):
    """A killed score stage's shards were discarded by the rerun (82,945 MPNet rows): the runner's record says
    which key began in the folder, and a rerun of that key resumes (score --resume keeps whole shards); a rerun
    whose score key changed starts over."""
    run_dir = tmp_path / "r"
    base = [f"run_dir={run_dir}", f"data={sst2_dir}", "labeled_limit=200", "unlabeled_rows=20", "validation.rows=50"]
    stages = RecordingStages()
    fresh = stages.score

    def killed(cfg, *, input, teacher, output, beam_cfg, overwrite, resume=False):
        if output == scored and not stages.seen.get("killed"):
            stages.seen["killed"] = True
            with Output(str(output), "score", overwrite=overwrite).open() as out:
                out.check()
                out.prepare()
                (Path(output) / "data").mkdir(exist_ok=True)
                (Path(output) / "data" / "shard-0.parquet").write_text("rows")
                raise KeyboardInterrupt
        fresh(cfg, input=input, teacher=teacher, output=output, beam_cfg=beam_cfg, overwrite=overwrite, resume=resume)

    stages.score = killed
    scored, dev_scored = str(run_dir / "scored"), str(run_dir / "dev" / "scored")
    with pytest.raises(KeyboardInterrupt):
        run_pipeline(load_config("configs/demo.yaml", base), log=lambda m: None, functions=stages.functions())
    record = json.loads((run_dir / "scored" / STAGE_FILE).read_text())
    assert record["running"] is True
    log = []
    run_pipeline(load_config("configs/demo.yaml", base), log=log.append, functions=stages.functions())
    assert stages.seen["score_resume"] == [(scored, True), (dev_scored, False)]  # dev/scored had not begun
    assert any(m.startswith("[score] resuming the run of key") for m in log), log
    assert (run_dir / "scored" / "data" / "shard-0.parquet").read_text() == "rows"  # kept
    assert "running" not in json.loads((run_dir / "scored" / STAGE_FILE).read_text())
    # finished: a rerun reuses it; a rerun of other score settings starts over, clearing the old shards
    run_pipeline(load_config("configs/demo.yaml", base), log=lambda m: None, functions=stages.functions())
    assert len(stages.seen["score_resume"]) == 2
    stages.seen["killed"] = False
    with pytest.raises(KeyboardInterrupt):
        run_pipeline(load_config("configs/demo.yaml", [*base, "score.batch_size=16"]), log=lambda m: None,
                     functions=stages.functions())
    run_pipeline(load_config("configs/demo.yaml", [*base, "score.batch_size=64"]), log=lambda m: None,
                 functions=stages.functions())
    assert stages.seen["score_resume"][2:] == [(scored, False), (dev_scored, False)]
    assert not (run_dir / "scored" / "data" / "shard-0.parquet").exists()


@pytest.mark.parametrize("overrides, says", [
    (["teacher.model=nosuchorg/nosuchmodel"], "teacher.model nosuchorg/nosuchmodel: not a local folder, and "
                                              "HF_HUB_OFFLINE is set"),
    (["teacher.model=hf:nosuch/model"], "teacher.model hf:nosuch/model: neither a local folder nor a Hugging Face Hub "
                                        "model name"),
    (["augment.recipe=tinybert"], "augment.mlm_model bert-base-uncased: not a local folder, and HF_HUB_OFFLINE is set"),
    (["students.distilled.model={pretrained: nosuchorg/x}"], "students.distilled.model.pretrained nosuchorg/x: not a "
                                                             "local folder, and HF_HUB_OFFLINE is set"),
    (["data=hf:nosuchorg/nosuchds"], "data=hf:nosuchorg/nosuchds:train: the dataset nosuchorg/nosuchds: not a local "
                                     "folder, and HF_HUB_OFFLINE is set"),
    # not "no such file": the hub name is what is missing
    (["test=hf:nosuchds:validation"], "test=hf:nosuchds:validation: the dataset nosuchds: not a local folder, and "
                                      "HF_HUB_OFFLINE is set"),
])
def test_every_hub_name_of_a_run_is_resolved_before_any_stage(overrides, says, tmp_path, sst2_dir, capsys,
                                                              monkeypatch):
    """Offline, every hub name of a run (teacher.model, augment.mlm_model, a pretrained student, data=, test=) is
    resolved before any stage: one line, exit 2, no run folder, config.yaml or stage record written, no retries
    or traceback."""
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty-hub-cache"))
    run_dir = tmp_path / "run"
    data = [] if any(o.startswith("data=") for o in overrides) else [f"data={sst2_dir}"]
    rc = main(["run", "--config", "configs/demo.yaml", f"run_dir={run_dir}", *data, *overrides])
    err = capsys.readouterr().err
    assert rc == 2 and f"transferset run: error: {says}" in err, err
    assert len(err.strip().splitlines()) == 1, err
    if "HF_HUB_OFFLINE is set" in says:
        assert "unset HF_HUB_OFFLINE on a machine with network" in err
    assert not run_dir.exists()


def test_an_engine_section_the_machine_cannot_honour_stops_the_run_before_any_stage(tmp_path, sst2_dir, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as on this CPU machine, wherever the test runs
    rec = RecordingStages()
    for override, message in [("students.distilled.engine.precision=fp16",
                               "students.distilled.engine.precision fp16: float16 training needs a CUDA device"),
                              ("teacher.engine.device=cuda", "teacher.engine.device cuda: no CUDA device is visible")]:
        cfg = load_config("configs/demo.yaml", [f"run_dir={tmp_path / 'r'}", f"data={sst2_dir}", override])
        with pytest.raises(UserError, match=message):
            run_pipeline(cfg, log=lambda m: None, functions=rec.functions())
        assert rec.seen == {} and not (tmp_path / "r").exists()  # no stage ran, no folder was made


RUN_BASE = ["labeled_limit=200", "unlabeled_rows=20", "validation.rows=50"]
EVERY_STAGE = ["data", "teacher", "augment", "score", "dev", "dev.score", "students.labels_only",
               "students.distilled", "compress.ship.teacher", "compress.ship.labels_only", "compress.ship.distilled",
               "test"]


def _run_stages(run_dir, sst2_dir, *overrides) -> list[str]:
    """The stages a run ran (not reused), in order."""
    log = []
    run_pipeline(load_config("configs/demo.yaml", [f"run_dir={run_dir}", f"data={sst2_dir}", *RUN_BASE, *overrides]),
                 log=log.append, functions=RecordingStages().functions())
    return [m.split("]")[0][1:] for m in log if "] running → " in m]


def test_a_rerun_never_deletes_a_stage_folder_each_stage_clears_what_it_wrote(tmp_path, sst2_dir):
    """`run` never deletes a whole stage folder before calling a stage with overwrite=True: each stage's own
    output protocol clears what transferset wrote there, so a user's file inside one stays."""
    run_dir = tmp_path / "r"
    assert _run_stages(run_dir, sst2_dir) == EVERY_STAGE
    mine = {"transfer/data/keep.txt": "x", "scored/rejects/mine.jsonl": "{}", "students/distilled/notes.txt": "n",
            "dev/transfer/data/keep.txt": "d", "data/notes.txt": "s", "test/notes.txt": "t",
            "teacher/tokenizer/notes/keep.txt": "c"}
    for rel, text in mine.items():
        (run_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / rel).write_text(text)
    (run_dir / "teacher" / "tokenizer" / "merges.txt").write_text("an earlier teacher's file: ours")
    record = json.loads((run_dir / "teacher" / schema.MANIFEST_FILE).read_text())
    record["files"].append("tokenizer/merges.txt")
    (run_dir / "teacher" / schema.MANIFEST_FILE).write_text(json.dumps(record))
    assert _run_stages(run_dir, sst2_dir, "validation.rows=40") == EVERY_STAGE  # a new split: every stage again
    assert {rel: (run_dir / rel).read_text() for rel in mine} == mine
    assert not (run_dir / "teacher" / "tokenizer" / "merges.txt").exists()  # what the teacher wrote: cleared
    assert (run_dir / "dev" / "transfer" / schema.COMPLETE_MARKER).exists()  # the evaluation set, rewritten
    assert json.loads((run_dir / "data" / "split.json").read_text())["validation_rows"] == 40
    assert _run_stages(run_dir, sst2_dir, "validation.rows=40") == []


def test_teacher_and_student_stages_are_done_by_their_complete_marker(tmp_path, sst2_dir):
    """Teacher and student stages count as done by _COMPLETE, as every other stage, not by metrics.json: a
    folder whose run did not complete is run again, not reused."""
    run_dir = tmp_path / "r"
    assert _run_stages(run_dir, sst2_dir) == EVERY_STAGE
    (run_dir / "students" / "distilled" / schema.COMPLETE_MARKER).unlink()
    assert _run_stages(run_dir, sst2_dir) == ["students.distilled"]  # the same key: nothing downstream changes
    (run_dir / "teacher" / schema.COMPLETE_MARKER).unlink()
    assert _run_stages(run_dir, sst2_dir) == ["teacher"]
    assert _run_stages(run_dir, sst2_dir) == []
