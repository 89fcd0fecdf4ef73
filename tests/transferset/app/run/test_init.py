"""Your own data in one command: `transferset run --data FILE` on the packaged defaults, and `transferset init`'s
starter YAML, which `run --config` accepts unchanged; a missing column is refused with the columns present."""
import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from transferset import testing
from transferset.app.cli import main
from transferset.app.run import init
from transferset.app.run.init import STARTER_STUDENTS, starter
from transferset.app.run.runner import load_config
from transferset.data.card import read_front_matter

REPO = Path(__file__).resolve().parents[4]
# the chain's figures on 40 rows and 2 rounds: these runs test the data flags, not the timing
QUICK = ["report.latency_rows=40", "report.latency_rounds=2", "students.labels_only.report.latency_examples=40",
         "students.distilled.report.latency_examples=40"]
POSITIVE = "good great fine funny brilliant best love like".split()
NEGATIVE = "bad awful terrible boring dull worst hate never".split()
FILLER = "the movie film story acting plot was is very really so just one two time life world".split()


def reviews(n: int, seed: int) -> list[dict]:
    """`n` distinct product-review rows, columns review and sentiment (positive/negative), words the tiny
    teacher's vocabulary holds."""
    rng = random.Random(seed)
    rows, seen = [], set()
    while len(rows) < n:
        label = rng.choice(["positive", "negative"])
        words = rng.sample(FILLER, 4) + rng.sample(POSITIVE if label == "positive" else NEGATIVE, 2)
        rng.shuffle(words)
        text = " ".join(words)
        if text not in seen:
            seen.add(text)
            rows.append({"id": len(rows), "review": text, "sentiment": label})
    return rows


def write(path: Path, rows: list[dict]) -> str:
    if path.suffix == ".csv":
        lines = [",".join(rows[0]), *(",".join(str(v) for v in r.values()) for r in rows)]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    elif path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    else:
        pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    """A tiny BERT classifier as the base model (fine-tuned for a few steps by the run's teacher stage)."""
    return testing.tiny_classifier(str(tmp_path_factory.mktemp("base")), initializer_range=0.02)


def small(teacher: str, run_dir: Path) -> list[str]:
    return [f"run_dir={run_dir}", f"teacher.model={teacher}", "teacher.epochs=1", "teacher.max_steps=4",
            "teacher.batch_size=16", "augment.n_iter=1", "augment.ops=mask,ngram", "validation.rows=20",
            "students.labels_only.epochs=1", "students.distilled.epochs=1", *QUICK]


def results_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())


@pytest.mark.integration
@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".parquet"])
def test_run_on_your_own_file_in_one_command(suffix, teacher, tmp_path, capsys):
    data = write(tmp_path / f"reviews{suffix}", reviews(120, seed=1))
    test = write(tmp_path / f"held_out{suffix}", reviews(30, seed=2))
    run_dir = tmp_path / "run"
    assert main(["run", "--data", data, "--text-column", "review", "--label-column", "sentiment",
                 "--test", test, *small(teacher, run_dir)]) == 0
    out = capsys.readouterr()
    results = results_of(run_dir)
    names = [r["name"] for r in results["rows"]]
    assert names == ["teacher", "student: labels_only (bilstm, joint)", "student: distilled (bilstm, joint)",
                     "teacher (ONNX)", "labels_only (ONNX)", "distilled (ONNX)"]  # each exported as it ships
    # the one model to ship: the most accurate on selection of those at least 10x the teacher's speed, or the closest
    chosen = json.loads((run_dir / "chosen.json").read_text())["chosen"]
    assert out.out.splitlines()[0].startswith(("Ship ", "No model meets at least 10x"))
    assert chosen["name"] in out.out.splitlines()[0] and (run_dir / "chosen" / "README.md").exists()
    # the selection split is carved from the train file (20 rows), the test file is scored by every model
    split = json.loads((run_dir / "data" / "split.json").read_text())
    assert (split["train_rows"], split["validation_rows"], split["labeled_rows"]) == (120, 20, 100)
    assert split["label_names"] == ["negative", "positive"]
    assert results["test"] == test and results["selection"] == str(run_dir / "data" / "validation.jsonl")
    tested = json.loads((run_dir / "test" / "accuracy.json").read_text())["models"]
    assert {m["rows"] for m in tested.values()} == {30}
    assert all(0.0 <= r["test_accuracy"] <= 1.0 for r in results["rows"])
    # the packaged defaults: the run config's, the starter's students, the data's own run folder name
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert cfg["augment"]["text_column"] == cfg["teacher"]["text_column"] == "review"
    assert cfg["augment"]["label_column"] == cfg["teacher"]["label_column"] == "sentiment"
    assert "| teacher |" in out.out
    # every saved model folder has a model card whose figures are the report's (results.json)
    folders = {"teacher": run_dir / "teacher", names[1]: run_dir / "students" / "labels_only",
               names[2]: run_dir / "students" / "distilled"}
    for row in results["rows"][:3]:
        meta = read_front_matter(str(folders[row["name"]] / "README.md"))
        metrics = {m["name"]: m["value"] for m in meta["model-index"][0]["results"][0]["metrics"]}
        assert metrics == {"accuracy on the selection split": row["dev_accuracy"],
                           "accuracy on the test split": row["test_accuracy"],
                           "CPU ms per example (batch 1)": row["latency_1"],
                           "CPU ms per example (batch 64)": row["latency_64"]}
        assert meta["labels"] == ["negative", "positive"] and meta["pipeline_tag"] == "text-classification"
        text = (folders[row["name"]] / "README.md").read_text()
        assert f"{100 * row['test_accuracy']:.1f}%" in text and ("from_pretrained(" in text or "pipeline(" in text)
    student_meta = read_front_matter(str(folders[names[2]] / "README.md"))
    card = (folders[names[2]] / "README.md").read_text()
    # the tiny teacher is known by its local folder only: no base_model; the run's teacher/ named in the run
    assert "base_model" not in student_meta and "from the teacher `teacher`." in card
    assert "recipe mask,ngram, 1 variants per labeled example" in card and "losses kd 1.0 at temperature 2.0" in card


@pytest.mark.integration
def test_init_writes_a_starter_that_run_accepts_unchanged(teacher, tmp_path, capsys):
    data = write(tmp_path / "reviews.csv", reviews(120, seed=1))
    dev = write(tmp_path / "dev.csv", reviews(25, seed=3))
    config = tmp_path / "my.yaml"
    argv = ["init", "--data", data, "--text-column", "review", "--label-column", "sentiment", "--dev", dev,
            "--output", str(config)]
    assert main(argv) == 0
    text = config.read_text()
    assert text.splitlines()[0] == f"# transferset run --config {config}"
    assert yaml.safe_load(text) == starter(data, text_column="review", label_column="sentiment", dev=dev)
    assert "validation" not in yaml.safe_load(text)  # a dev file is the selection split: nothing is carved
    assert main(argv) == 2 and "exists" in capsys.readouterr().err  # never overwritten unless asked
    run_dir = tmp_path / "run"
    overrides = [o for o in small(teacher, run_dir) if not o.startswith("validation.")]
    assert main(["run", "--config", str(config), *overrides]) == 0
    results = results_of(run_dir)
    assert results["selection"] == dev and results["test"] is None
    assert len(results["rows"]) == 6 and not (run_dir / "data").exists()  # nothing split: all of train is labeled


@pytest.mark.parametrize("command", ["run", "init"])
@pytest.mark.parametrize("flags, missing", [
    (["--text-column", "body", "--label-column", "sentiment"], "text column 'body'"),
    (["--text-column", "review", "--label-column", "stars"], "label column 'stars'"),
    (["--label-column", "sentiment"], "no 'sentence' or 'text' column"),
])
def test_a_missing_column_is_refused_with_the_columns_present(command, flags, missing, tmp_path, capsys):
    data = write(tmp_path / "reviews.jsonl", reviews(10, seed=1))
    out = ["--output", str(tmp_path / "my.yaml")] if command == "init" else []
    assert main([command, "--data", data, *flags, *out]) == 2
    err = capsys.readouterr().err
    assert missing in err and "its columns: id, review, sentiment" in err and "Traceback" not in err
    assert not (tmp_path / "my.yaml").exists() and not (tmp_path / "runs").exists()


def test_a_missing_column_of_the_test_file_is_refused_too(tmp_path, capsys):
    data = write(tmp_path / "reviews.csv", reviews(10, seed=1))
    test = write(tmp_path / "test.csv", [{"id": 1, "text": "good", "sentiment": "positive"}])
    assert main(["run", "--data", data, "--text-column", "review", "--label-column", "sentiment",
                 "--test", test]) == 2
    err = capsys.readouterr().err
    assert f"test: {test} has no text column 'review'; its columns: id, text, sentiment" in err


def test_a_train_file_needs_a_dev_file_or_a_carved_split(tmp_path, capsys):
    data = write(tmp_path / "reviews.csv", reviews(10, seed=1))
    with pytest.raises(Exception, match="is one file: give dev: FILE"):
        load_config("configs/demo.yaml", [f"data={data}", "validation=null"])
    # the data flags carve it when no dev file is given
    assert load_config(None, [], {"data": data}).validation is not None
    assert load_config(None, [], {"data": data, "dev": data}).validation is None


def test_data_flags_over_a_yaml_and_overrides_still_apply(tmp_path):
    data = write(tmp_path / "reviews.csv", reviews(10, seed=1))
    cfg = load_config("configs/demo.yaml", ["teacher.epochs=1"],
                      {"data": data, "text_column": "review", "label_column": "sentiment"})
    assert (cfg.data, cfg.teacher.epochs, cfg.teacher.max_length) == (data, 1, 64)  # the YAML's, the override's
    assert (cfg.augment.text_column, cfg.teacher.label_column) == ("review", "sentiment")
    assert cfg.validation.rows == 1000  # the YAML's carve stands


def test_run_without_config_or_data_says_what_to_give(capsys):
    assert main(["run"]) == 2
    assert "give --config YAML, or --data PATH" in capsys.readouterr().err


def test_the_starter_students_are_the_demos():
    demo = yaml.safe_load((REPO / "configs" / "demo.yaml").read_text())
    assert STARTER_STUDENTS == demo["students"]


@pytest.mark.parametrize("words, tang", [(29, True), (30, False), (60, False)])
def test_on_long_texts_the_starters_distilled_student_takes_the_max_pooled_shape(tmp_path, words, tang):
    """Texts of LONG_TEXT_WORDS words or more (the median of the first rows): the distilled student takes the
    BiLSTM's default shape (max-pooled); on sentences Tang's (its last states, the demo's); the labels-only student
    is the demo's either way."""
    path = tmp_path / "texts.csv"
    rows = [" ".join(["word"] * (words + (i % 3) - 1)) for i in range(9)]  # median `words`
    path.write_text("review,sentiment\n" + "".join(f"{text},{'ab'[i % 2]}\n" for i, text in enumerate(rows)))
    assert init.median_words(str(path), "review") == words
    students = starter(str(path), text_column="review")["students"]
    assert students["distilled"]["model"] == ({"shape": "tang"} if tang else {})
    assert students["labels_only"] == STARTER_STUDENTS["labels_only"]
    assert (words < init.LONG_TEXT_WORDS) == tang
    assert {k: v for k, v in students["distilled"].items() if k != "model"} == \
        {k: v for k, v in STARTER_STUDENTS["distilled"].items() if k != "model"}


def test_init_refuses_a_file_that_is_not_there(tmp_path, capsys):
    assert main(["init", "--data", str(tmp_path / "nope.csv"), "--output", str(tmp_path / "my.yaml")]) == 2
    assert f"--data {tmp_path / 'nope.csv'}: no such file" in capsys.readouterr().err
    assert not (tmp_path / "my.yaml").exists()


def test_init_makes_a_missing_folder_and_refuses_a_folder_or_a_file_on_the_way(tmp_path, capsys):
    data = write(tmp_path / "reviews.csv", reviews(10, seed=1))
    nested = tmp_path / "configs" / "mine" / "my.yaml"
    assert main(["init", "--data", data, "--text-column", "review", "--label-column", "sentiment",
                 "--output", str(nested)]) == 0
    assert yaml.safe_load(nested.read_text())["data"] == data
    (tmp_path / "afile").write_text("mine\n")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    for output, flags, says in ((tmp_path / "configs", ["--overwrite"], "is a folder: give the path of the YAML"),
                                (tmp_path / "configs", [], "is a folder"),
                                (tmp_path / "afile" / "my.yaml", [], f"{tmp_path / 'afile'} is a file, not a folder")):
        capsys.readouterr()
        assert main(["init", "--data", data, "--output", str(output), *flags]) == 2
        err = capsys.readouterr().err
        assert says in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    assert (tmp_path / "afile").read_text() == "mine\n"


def test_an_init_yaml_runs_from_any_folder_and_says_how_its_relative_paths_are_read(tmp_path, monkeypatch):
    """Its data paths are written absolute; run_dir, relative, is read from the folder `run` starts in, as every
    relative path of a run YAML is (configs/*.yaml are run from the repository root)."""
    (tmp_path / "here").mkdir()
    (tmp_path / "elsewhere").mkdir()
    write(tmp_path / "here" / "reviews.csv", reviews(10, seed=1))
    write(tmp_path / "here" / "test.csv", reviews(4, seed=2))
    monkeypatch.chdir(tmp_path / "here")
    assert main(["init", "--data", "reviews.csv", "--test", "test.csv", "--text-column", "review",
                 "--label-column", "sentiment", "--output", "../my.yaml"]) == 0
    text = (tmp_path / "my.yaml").read_text()
    assert "# A relative path here (run_dir) is read from the folder `transferset run` starts in" in text
    monkeypatch.chdir(tmp_path / "elsewhere")
    cfg = load_config("../my.yaml", [])
    assert (cfg.data, cfg.test) == (str(tmp_path / "here" / "reviews.csv"), str(tmp_path / "here" / "test.csv"))
    assert cfg.run_dir == "runs/reviews"  # under the folder the run starts in
