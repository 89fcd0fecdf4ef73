"""`transferset predict` end to end on real files: every reader format, with a BiLSTM and a transformer
student trained in this test run (tests/students/shipped.py), their teacher, and an ONNX export; values
checked against `Student.predict`; in-process and on Beam (FnApiRunner) the same rows."""
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shipped import dev_rows, shipped_models
from students.predict import predict_files
from students.student import Student
from transferset.app.cli import main
from transferset.config import PredictConfig
from transferset.contract import schema
from transferset.data import predictions
from transferset.sources import source_id_for
from tolerances import reordered

N = 30  # SST-2 dev rows per file


@pytest.fixture(scope="module")
def models(tmp_path_factory, sst2_dir, sst2_dev200):
    return shipped_models(tmp_path_factory, sst2_dir, sst2_dev200)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, sst2_dev200):
    """The same 30 SST-2 dev sentences as TSV, CSV, JSONL, Parquet and an hf: dataset folder, each (but
    hf:) with bad rows the readers reject. → ({path: (kept, rejected)}, the sentences)."""
    texts, labels = dev_rows(sst2_dev200, N)
    d = tmp_path_factory.mktemp("predict_inputs")
    tsv = d / "rows.tsv"
    tsv.write_text("sentence\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in zip(texts, labels))
                   + "\n" + "too\tmany\tfields\n", encoding="utf-8")
    csv = d / "rows.csv"
    csv.write_text("label,sentence\n" + "".join(f'{y},"{t.replace(chr(34), chr(34) * 2)}"\n' for t, y in zip(texts, labels))
                   + '1,"an unclosed quote\n', encoding="utf-8")
    jsonl = d / "rows.jsonl"
    jsonl.write_text("".join(json.dumps({"sentence": t, "label": y}) + "\n" for t, y in zip(texts, labels))
                     + "{not json\n" + json.dumps({"sentence": 12345}) + "\n", encoding="utf-8")
    parquet = d / "rows.parquet"
    pq.write_table(pa.table({"sentence": texts + ["   "], "label": labels + [0]}), parquet)
    hf = d / "hf_dataset"
    hf.mkdir()
    (hf / "train.jsonl").write_text("".join(json.dumps({"sentence": t}) + "\n" for t in texts), encoding="utf-8")
    files = {str(tsv): (N, 2), str(csv): (N, 1), str(jsonl): (N, 2), str(parquet): (N, 1), f"hf:{hf}:train": (N, 0)}
    return files, texts


def _read_output(out) -> list[dict]:
    files = sorted(f for f in (out / schema.DATA_DIR).iterdir() if f.suffix in (".parquet", ".jsonl"))
    if files[0].suffix == ".parquet":
        return [r for f in files for r in pq.read_table(f).to_pylist()]
    return [json.loads(line) for f in files for line in f.read_text(encoding="utf-8").splitlines()]


# Probabilities computed in other batches than the reference's: the shipped BiLSTM's recurrence chains one
# reduction of embed + hidden = 40 terms per token over up to 128 tokens, then its head (tests/tolerances.py);
# a two-class softmax moves a probability by at most half the logits' error. Taken for every shipped model
# (the transformer student's bound is lower).
PROB_TOL = reordered(1.0, terms=24 + 16, reductions=128 + 2) / 2


def _check_against(rows: list[dict], model: Student, texts_b=None):
    texts = [r[schema.TEXT] for r in rows]
    ref = model.predict(texts, [r[schema.TEXT_B] for r in rows] if texts_b else None)
    got = np.array([[r[schema.prob_column(n)] for n in ref.label_names] for r in rows])
    np.testing.assert_allclose(got, ref.probabilities, atol=PROB_TOL, rtol=0)
    assert [r[schema.PREDICTED_LABEL] for r in rows] == ref.labels
    assert len(set(np.round(got[:, 0], 4))) > 10  # a row mix-up would show


@pytest.mark.parametrize("name", ("bilstm", "transformer"))
def test_predict_reads_every_format_and_writes_the_students_predictions(name, models, inputs, tmp_path, capsys):
    files, texts = inputs
    out = tmp_path / "out"
    assert main(["predict", "--model", models[name], "--input", *files, "--output", str(out)]) == 0
    line = capsys.readouterr().out
    kept, rejected = sum(k for k, _ in files.values()), sum(r for _, r in files.values())
    assert f"{kept + rejected:,} rows read, {kept:,} predicted, {rejected:,} rejected" in line and "in-process" in line
    rows = _read_output(out)
    assert len(rows) == kept and [r[schema.TEXT] for r in rows[:N]] == texts  # in input order
    assert list(rows[0]) == ["id", "file", "line", "source_id", "text", "predicted_label", "prob_0", "prob_1"]
    assert rows[0]["source_id"] == source_id_for(texts[0], None)
    # Each format's rows say where they were read: the TSV's first row is line 2 (after the header).
    first = {r["file"]: r["line"] for r in reversed(rows)}
    assert {p: first[p] for p in files} == {p: 2 if p.endswith((".tsv", ".csv")) else 1 for p in files}
    assert len({r["id"] for r in rows}) == kept  # the same 30 sentences in 5 inputs: 150 ids
    _check_against(rows, Student.from_pretrained(models[name]))
    # Parquet: zstd, float32 probabilities, label names in the metadata.
    f = next((out / schema.DATA_DIR).iterdir())
    assert pq.ParquetFile(f).metadata.row_group(0).column(0).compression == "ZSTD"
    sch = pq.read_schema(f)
    assert sch.field("prob_1").type == pa.float32()
    assert json.loads(sch.metadata[schema.META_LABEL_NAMES.encode()]) == ["0", "1"]
    # Rejects: one line each, with the reason, beside the data; stats reconcile with the lines read.
    rejects = [json.loads(x) for f in (out / schema.REJECTS_DIR).iterdir() for x in f.read_text().splitlines()]
    assert len(rejects) == rejected
    reasons = " | ".join(r[schema.REJECT_REASON] for r in rejects)
    for why in ("blank line", "expected 2 fields", "unbalanced quote", "invalid JSON", "text must be a string",
                "empty text"):
        assert why in reasons
    stats = json.loads((out / schema.STATS_FILE).read_text())
    assert stats["input_rows"] == kept + rejected and stats["problems"] == []
    assert stats["input_lines"] is None  # the hf: dataset's rows are not counted up front
    assert {p: (c["predicted"], c["rejected"]) for p, c in stats["inputs"].items()} == files
    assert (out / schema.COMPLETE_MARKER).exists()


def test_predict_pairs_as_jsonl_with_the_teacher_and_its_onnx_export(models, tmp_path, sst2_dev200, capsys):
    texts, _ = dev_rows(sst2_dev200, N)
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("premise\thypothesis\n" + "".join(f"{a}\t{b}\n" for a, b in zip(texts, texts[::-1])))
    onnx_dir = tmp_path / "onnx"
    assert main(["export", "--model", models["teacher"], "--output", str(onnx_dir), "--max-length", "64"]) == 0
    for model in (models["teacher"], str(onnx_dir)):
        out = tmp_path / ("out_" + model.split("/")[-1])
        assert main(["predict", "--model", model, "--input", str(pairs), "--output", str(out), "--format", "jsonl",
                     "--text-column", "premise", "--text-b-column", "hypothesis", "--max-length", "64"]) == 0
        rows = _read_output(out)
        assert [(r["text"], r["text_b"]) for r in rows] == list(zip(texts, texts[::-1]))
        assert rows[0]["source_id"] == source_id_for(texts[0], texts[-1])
        assert (rows[0]["file"], rows[0]["line"]) == (str(pairs), 2)
        assert next((out / schema.DATA_DIR).iterdir()).suffix == ".jsonl"
        _check_against(rows, Student.from_pretrained(models["teacher"], max_length=64), texts_b=True)
    capsys.readouterr()


def test_beam_writes_the_rows_in_process_writes(models, inputs, tmp_path, capsys):
    files, _ = inputs
    paths = [p for p in files if not p.startswith("hf:")]
    here, there = tmp_path / "here", tmp_path / "there"
    assert main(["predict", "--model", models["bilstm"], "--input", *paths, "--output", str(here)]) == 0
    assert main(["predict", "--model", models["bilstm"], "--input", *paths, "--output", str(there),
                 "--runner", "FnApiRunner", "--batch-size", "16"]) == 0
    assert "Beam" in capsys.readouterr().out
    a, b = _read_output(here), _read_output(there)
    key = lambda r: (r["id"], r["file"], r["line"], r["text"])  # noqa: E731
    a, b = sorted(a, key=key), sorted(b, key=key)
    assert [key(r) for r in a] == [key(r) for r in b] and [r["predicted_label"] for r in a] == \
        [r["predicted_label"] for r in b]
    assert len({r["id"] for r in a}) == len(a)  # the files hold the same sentences, each row its own id
    np.testing.assert_allclose([r["prob_1"] for r in a], [r["prob_1"] for r in b], atol=PROB_TOL, rtol=0)
    s1, s2 = (json.loads((d / schema.STATS_FILE).read_text()) for d in (here, there))
    assert (s1["input_rows"], s1["predicted"], s1["rejected"]) == (s2["input_rows"], s2["predicted"], s2["rejected"])
    assert s2["input_lines"] == s2["input_rows"] and s2["runner"] == "beam"
    assert len(list((there / schema.REJECTS_DIR).iterdir())) >= 1


def test_large_inputs_go_to_beam_and_small_ones_stay(models, inputs, tmp_path, capsys):
    tsv = next(p for p in inputs[0] if p.endswith(".tsv"))
    assert main(["predict", "--model", models["bilstm"], "--input", tsv, "--output", str(tmp_path / "a"),
                 "--beam-above", "10"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("Beam")
    assert main(["predict", "--model", models["bilstm"], "--input", tsv, "--output", str(tmp_path / "b")]) == 0
    assert capsys.readouterr().out.rstrip().endswith("in-process")


def test_predict_refuses_clearly(models, inputs, tmp_path, capsys):
    tsv = next(p for p in inputs[0] if p.endswith(".tsv"))
    out = tmp_path / "out"
    assert main(["predict", "--model", models["bilstm"], "--input", tsv, "--output", str(out)]) == 0
    capsys.readouterr()
    # A complete output is kept unless --overwrite.
    assert main(["predict", "--model", models["bilstm"], "--input", tsv, "--output", str(out)]) == 1
    err = capsys.readouterr().err
    assert "already holds a complete run of `transferset predict` (predictions)" in err and "pass --overwrite" in err
    # A text column the file lacks: every row rejected, said once with the first reasons; no _COMPLETE.
    bad = tmp_path / "bad"
    assert main(["predict", "--model", models["bilstm"], "--input", tsv, "--output", str(bad),
                 "--text-column", "review"]) == 1
    err = capsys.readouterr().err
    assert f"every row was rejected ({N + 2} rows)" in err and "missing text column 'review'" in err
    assert not (bad / schema.COMPLETE_MARKER).exists()
    # Inputs and settings that cannot work stop before anything is loaded.
    assert main(["predict", "--model", models["bilstm"], "--input", str(tmp_path / "none.tsv"),
                 "--output", str(tmp_path / "c")]) == 1
    assert "no such file" in capsys.readouterr().err
    assert main(["predict", "--model", models["bilstm"], "--input", tsv, "--output", str(tmp_path / "d"),
                 "--format", "xml"]) == 2
    assert "format" in capsys.readouterr().err
    assert main(["predict", "--model", models["bilstm"], "--input", tsv, "--output", str(tmp_path / "e"),
                 "--bogus-option", "1"]) == 2
    assert "unrecognized arguments: --bogus-option 1" in capsys.readouterr().err
    assert main(["predict", "--model", str(tmp_path), "--input", tsv, "--output", str(tmp_path / "f")]) == 1
    assert "transferset export" in capsys.readouterr().err


def test_predict_files_reports_progress_with_an_eta(models, inputs, tmp_path, monkeypatch):
    import students.predict
    from transferset.runtime.progress import Progress

    tsv = next(p for p in inputs[0] if p.endswith(".tsv"))
    lines = []
    monkeypatch.setattr(students.predict, "Progress",  # a line at every update, into `lines`
                        lambda *a, **k: Progress(*a, **{**k, "every_s": 0.0, "log": lines.append}))
    stats = predict_files(Student.from_pretrained(models["bilstm"]), [tsv], str(tmp_path / "o"), PredictConfig(),
                          total=N + 2, progress=False)
    assert stats["predicted"] == N and stats["input_lines"] == N + 2
    assert any(f"of {N + 2} rows" in line and "ETA" in line for line in lines)


@pytest.mark.parametrize("runner", ([], ["--runner", "FnApiRunner"]))
def test_model_inputs_and_output_on_a_remote_scheme(runner, models, inputs, tmp_path, monkeypatch, capsys):
    """tsfake:// (tests/fake_remote.py) stands for gs://: the same rows as from local paths, in-process and on Beam."""
    import shutil

    import fake_remote

    monkeypatch.setenv("TRANSFERSET_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)  # a URL taken for a local path would show up here as ./tsfake:/
    fake_remote.use_root(str(tmp_path / "bucket"))
    tsv = next(p for p in inputs[0] if p.endswith(".tsv"))
    shutil.copytree(models["bilstm"], fake_remote.local(fake_remote.url("models/bilstm")))
    shutil.copy(tsv, fake_remote.local(fake_remote.url("in.tsv")))
    assert main(["predict", "--model", fake_remote.url("models/bilstm"), "--input", fake_remote.url("in.tsv"),
                 "--output", fake_remote.url("out"), *runner]) == 0
    assert main(["predict", "--model", models["bilstm"], "--input", tsv, "--output", str(tmp_path / "here")]) == 0
    capsys.readouterr()
    remote = Path(fake_remote.local(fake_remote.url("out")))
    # The same rows but for where they were read (the input's name, and the ids made from it).
    def key(r):
        return {k: v for k, v in r.items() if k not in ("id", "file")}

    there, here = _read_output(remote), _read_output(tmp_path / "here")
    assert sorted(map(key, there), key=lambda r: r["line"]) == sorted(map(key, here), key=lambda r: r["line"])
    assert {r["file"] for r in there} == {fake_remote.url("in.tsv")} and {r["file"] for r in here} == {tsv}
    assert (remote / schema.COMPLETE_MARKER).exists() and len(list((remote / schema.REJECTS_DIR).iterdir())) == 1
    assert not (tmp_path / "tsfake:").exists()


def test_predict_into_an_output_another_run_owns_is_refused(models, inputs, tmp_path, capsys):
    from transferset.fs.lock import LockInfo

    out = tmp_path / "owned"
    out.mkdir()
    (out / schema.LOCK_FILE).write_bytes(LockInfo(host="another-machine", pid=4242, started=0.0, command="predict",
                                                  token="t").to_json())
    tsv = next(p for p in inputs[0] if p.endswith(".tsv"))
    rc = main(["predict", "--model", models["bilstm"], "--input", tsv, "--output", str(out)])
    err = capsys.readouterr().err
    assert rc == 1 and f"{out} is in use by pid 4242 on host another-machine" in err
    assert sorted(p.name for p in out.iterdir()) == [schema.LOCK_FILE]  # nothing written beside it


class _LengthRule:
    """A stand-in classifier (P(pos) grows with the text's length) for tests of the rows, not of a model."""

    label_names = ["neg", "pos"]

    def predict(self, texts, texts_b=None, batch_size=256):
        from types import SimpleNamespace

        n = np.array([len(t) for t in texts], dtype=np.float32)
        p = n / (n + 20.0)
        return SimpleNamespace(labels=[self.label_names[int(x > 0.5)] for x in p], probabilities=np.stack([1 - p, p], 1))


def _load_length_rule(path):
    return _LengthRule()


def test_in_process_and_beam_rows_say_where_they_were_read_the_same_way(tmp_path):
    """In process and on Beam, a sentence repeated within and across inputs keeps one row per input line, each
    with its own id, file and line, and the two paths write the same rows."""
    import apache_beam as beam

    from pipelines.predict import PredictJob, build

    a, b = tmp_path / "a.tsv", tmp_path / "b.jsonl"
    a.write_text("sentence\nsame words\n\nsame words\na longer sentence than that\n")
    b.write_text(json.dumps({"text": "same words"}) + "\n")
    inputs = [str(a), str(b)]
    for fmt in ("parquet", "jsonl"):
        here, there = tmp_path / f"here_{fmt}", tmp_path / f"there_{fmt}"
        predict_files(_LengthRule(), inputs, str(here), PredictConfig(format=fmt), progress=False)
        with beam.Pipeline(runner="FnApiRunner") as p:
            build(p, PredictJob(model="rule", loader=_load_length_rule, label_names=("neg", "pos"),
                                inputs=tuple(inputs), output=str(there), cfg=PredictConfig(format=fmt)))
        rows = _read_output(here)
        assert [(r["file"], r["line"], r["text"]) for r in rows] == [
            (str(a), 2, "same words"), (str(a), 4, "same words"), (str(a), 5, "a longer sentence than that"),
            (str(b), 1, "same words")]
        assert len({r["id"] for r in rows}) == 4
        assert sorted(_read_output(there), key=lambda r: r["id"]) == sorted(rows, key=lambda r: r["id"])


def _tree(root: Path) -> dict:
    """Every file and folder under `root` → its bytes (None for a folder)."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize("runner", ([], ["--beam"]))
def test_predict_into_the_folder_of_its_input_is_refused_and_deletes_nothing(runner, models, inputs, tmp_path,
                                                                             monkeypatch, capsys):
    """`predict --input data/sst2/train.tsv --output .` is refused, exit 2, with or without --overwrite, and
    deletes nothing: an output folder that contains the input is never cleared."""
    import shutil

    tsv = next(p for p in inputs[0] if p.endswith(".tsv"))
    (tmp_path / "data" / "sst2").mkdir(parents=True)
    shutil.copy(tsv, tmp_path / "data" / "sst2" / "train.tsv")
    monkeypatch.chdir(tmp_path)
    before = _tree(tmp_path)
    for flags in ([], ["--overwrite"]):
        rc = main(["predict", "--model", models["bilstm"], "--input", "data/sst2/train.tsv", "--output", ".",
                   *runner, *flags])
        err = capsys.readouterr().err
        assert rc == 2 and "--output . contains the input data/sst2/train.tsv" in err
    assert _tree(tmp_path) == before


def test_predict_into_a_run_directory_keeps_its_stages(models, inputs, tmp_path, capsys):
    """`predict --output RUN` is refused, with or without --overwrite, and keeps the run's data/ stage (labeled,
    unlabeled and validation rows), which the run's later stages read."""
    run = tmp_path / "run"
    files = {"config.yaml": "run_dir: run\n", "data/labeled.jsonl": '{"text": "a fine film", "label": 1}\n',
             "data/unlabeled.jsonl": '{"text": "a film"}\n', "data/split.json": "{}\n",
             "data/.stage.json": '{"key": "k1"}\n', "teacher/config.json": "{}\n", "teacher/.stage.json": '{"key": "k2"}\n'}
    for rel, text in files.items():
        (run / rel).parent.mkdir(parents=True, exist_ok=True)
        (run / rel).write_text(text)
    before = _tree(run)
    tsv = next(p for p in inputs[0] if p.endswith(".tsv"))
    rc = main(["predict", "--model", models["bilstm"], "--input", tsv, "--output", str(run)])
    err = capsys.readouterr().err
    assert rc == 1 and (f"{run} holds config.yaml, data/ (.stage.json, labeled.jsonl, 2 more), teacher/ "
                        "(.stage.json, config.json) (a `transferset run` directory), which transferset did not write; "
                        "`transferset predict` writes data/ there") in err
    assert "never deletes files it did not write, even with --overwrite" in err
    assert main(["predict", "--model", models["bilstm"], "--input", tsv, "--output", str(run), "--overwrite"]) == 1
    assert "never deletes files it did not write, even with --overwrite" in capsys.readouterr().err
    assert _tree(run) == before


def test_predict_onto_a_transfer_set_says_what_the_folder_holds(models, inputs, tmp_path, capsys):
    """`predict --output` onto a transfer set says it holds a complete run of `transferset augment`, not
    "complete predictions"."""
    src = tmp_path / "in.jsonl"
    src.write_text('{"text": "a fine film", "label": 1}\n{"text": "a dull film", "label": 0}\n')
    transfer_set = tmp_path / "transfer"
    assert main(["augment", "--input", str(src), "--output", str(transfer_set), "--n-iter", "0"]) == 0
    before = _tree(transfer_set)
    capsys.readouterr()
    tsv = next(p for p in inputs[0] if p.endswith(".tsv"))
    rc = main(["predict", "--model", models["bilstm"], "--input", tsv, "--output", str(transfer_set)])
    err = capsys.readouterr().err
    assert rc == 1 and "predictions" not in err
    assert f"{transfer_set} already holds a complete run of `transferset augment` (a transfer set)" in err
    assert _tree(transfer_set) == before


@pytest.mark.parametrize("runner", ([], ["--runner", "FnApiRunner"]))
def test_a_users_files_inside_data_and_rejects_survive_a_rerun_and_an_overwrite(runner, models, inputs, tmp_path):
    """A rerun onto unfinished predictions and --overwrite on complete ones keep the user's data/keep.txt and
    rejects/mine.jsonl (the record names predict's own files, not the whole data/ folder). In process and on Beam."""
    tsv = next(p for p in inputs[0] if p.endswith(".tsv"))
    out = tmp_path / "out"
    args = ["predict", "--model", models["bilstm"], "--input", tsv, "--output", str(out), *runner]
    assert main(args) == 0
    rows = _read_output(out)
    (out / schema.COMPLETE_MARKER).unlink()
    (out / "data").mkdir(exist_ok=True)
    (out / "data" / "keep.txt").write_text("x\n")
    (out / "rejects").mkdir(exist_ok=True)
    (out / "rejects" / "mine.jsonl").write_text('{"mine": true}\n')
    assert main(args) == 0
    assert main(args + ["--overwrite"]) == 0
    assert (out / "data" / "keep.txt").read_text() == "x\n"
    assert (out / "rejects" / "mine.jsonl").read_text() == '{"mine": true}\n'
    assert sorted(_read_output(out), key=lambda r: r["id"]) == sorted(rows, key=lambda r: r["id"])
