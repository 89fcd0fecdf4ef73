"""The whole chain with every path on a remote-style scheme gives what it gives on local paths.

`tsfake://` (tests/fake_remote.py) is a URL scheme backed by a temp folder, registered for Beam's
FileSystems and for fsspec and known to nothing else in the project: a stage that reaches a path
with os.path or open() instead of Beam's FileSystems / transferset.fs fails on it, as it would on
gs://. The same tiny chain runs once on tsfake:// paths and once on local paths; the transfer
sets, the teacher's logits and the students' dev accuracy must be equal.
"""
import json
import os
from pathlib import Path

import numpy as np
import pytest
import yaml

import fake_remote
from transferset import fs
from transferset.app.cli import main
from transferset.app.run.runner import STAGE_FILE
from transferset.contract import schema
from transferset.data import transfer
import builders as testing
from tolerances import tiny_bert

TRAIN_ROWS, DEV_ROWS = 120, 60
STUDENT = {"student": "bilstm", "epochs": 1, "losses": {"ce": 1.0, "mse": 1.0}, "batch_size": 32, "report": {"latency_examples": 8},
           "threads": 1, "model": {"embed_dim": 16, "hidden": 16, "head_dim": 32}}


def _head(src: Path, n: int) -> str:
    return "".join(src.read_text(encoding="utf-8").splitlines(keepends=True)[:n + 1])


@pytest.fixture
def places(tmp_path, sst2_dir, monkeypatch):
    """The same data and tiny teacher under a local folder and under tsfake://; → (local root, URL root)."""
    monkeypatch.setenv("TRANSFERSET_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)  # a path mistaken for a local one would show up here as ./tsfake:/
    fake_remote.use_root(str(tmp_path / "bucket"))
    local = tmp_path / "local"
    for root in (local, tmp_path / "bucket"):
        (root / "sst2").mkdir(parents=True)
        (root / "sst2" / "train.tsv").write_text(_head(sst2_dir / "train.tsv", TRAIN_ROWS), encoding="utf-8")
        (root / "sst2" / "dev.tsv").write_text(_head(sst2_dir / "dev.tsv", DEV_ROWS), encoding="utf-8")
        testing.tiny_classifier(str(root / "teacher"))
    (tmp_path / "student.yaml").write_text(yaml.safe_dump(STUDENT))
    yield str(local), fake_remote.url("")
    assert not (tmp_path / "tsfake:").exists(), "a tsfake:// path was written as a local path"


def _by_id(directory: str) -> dict:
    return {r[schema.ID]: r for r in transfer.read_table(directory).to_pylist()}


def _chain(root: str, capsys) -> dict:
    """augment → score → train → evaluate through the CLI; → what each stage produced."""
    def at(name):
        return f"{root}{name}" if root.endswith("//") else os.path.join(root, name)

    assert main(["augment", "--input", at("sst2/train.tsv"), "--exclude", at("sst2/dev.tsv"),
                 "--output", at("out/transfer"), "--n-iter", "2", "--seed", "3"]) == 0
    assert main(["score", "--input", at("out/transfer"), "--teacher", at("teacher"),
                 "--output", at("out/scored"), "--batch-size", "32"]) == 0
    # Every path on `root`: the student's output (trained locally, then uploaded) and evaluate's model too.
    assert main(["train", "--transfer", at("out/scored"), "--dev", at("sst2/dev.tsv"), "--output", at("student"),
                 "--config", "student.yaml", "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["evaluate", "--model", at("student"), "--data", at("out/scored"), "--json"]) == 0
    evaluated = json.loads(capsys.readouterr().out)
    assert fs.exists(fs.join(at("student"), schema.STUDENT_MODEL_DIR, schema.STUDENT_SIDECAR_FILE))
    return {"transfer": _by_id(at("out/transfer")), "scored": _by_id(at("out/scored")),
            "metrics": json.loads(fs.read_text(fs.join(at("student"), schema.METRICS_FILE))), "evaluated": evaluated,
            "meta": transfer.read_metadata(at("out/scored"), scored=True)}


def _assert_same_sets(remote: dict, local: dict) -> None:
    assert len(remote) > TRAIN_ROWS
    assert {i: r[schema.TEXT] for i, r in remote.items()} == {i: r[schema.TEXT] for i, r in local.items()}


def _assert_same_logits(remote: dict, local: dict) -> None:
    assert remote.keys() == local.keys()
    ids = sorted(remote)
    a = np.array([remote[i][schema.TEACHER_LOGITS] for i in ids])
    b = np.array([local[i][schema.TEACHER_LOGITS] for i in ids])
    assert a.shape == (len(ids), 2) and np.abs(a).max() > 0
    np.testing.assert_allclose(a, b, rtol=0, atol=tiny_bert(b))  # batches cut elsewhere: reordered sums (tests/tolerances.py)


@pytest.mark.integration
def test_augment_score_train_evaluate_on_a_remote_scheme_equal_local(places, tmp_path, capsys):
    local_root, url_root = places
    remote = _chain(url_root, capsys)
    local = _chain(local_root, capsys)

    # The outputs really are on the fake bucket, and the scored set names the teacher by its URL.
    assert (Path(fake_remote.local(url_root + "out/scored")) / schema.COMPLETE_MARKER).exists()
    assert remote["meta"][schema.META_TEACHER_ID] == url_root + "teacher"
    assert remote["meta"][schema.META_TEACHER_SHA256] == local["meta"][schema.META_TEACHER_SHA256]
    _assert_same_sets(remote["transfer"], local["transfer"])
    _assert_same_logits(remote["scored"], local["scored"])
    assert remote["metrics"]["dev_rows"] == local["metrics"]["dev_rows"] == DEV_ROWS
    assert remote["metrics"]["dev_accuracy"] == local["metrics"]["dev_accuracy"]
    assert remote["metrics"]["history"][0]["train_loss"] == pytest.approx(local["metrics"]["history"][0]["train_loss"])
    assert remote["evaluated"]["accuracy"] == local["evaluated"]["accuracy"]
    assert remote["evaluated"]["teacher_agreement"] == local["evaluated"]["teacher_agreement"]
    assert remote["evaluated"]["rows"] == len(remote["scored"])


def _run(run_dir: str, data: str, teacher_model: str, capsys) -> str:
    cfg = {"run_dir": run_dir, "data": data, "labeled_limit": 60, "unlabeled_rows": 40,
           "teacher": {"model": teacher_model, "epochs": 1, "max_steps": 2, "batch_size": 16, "max_length": 32},
           "augment": {"n_iter": 2, "seed": 1}, "score": {"batch_size": 32}, "students": {"distilled": STUDENT}}
    Path("run.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["run", "--config", "run.yaml"]) == 0
    return capsys.readouterr().err


@pytest.mark.integration
def test_transferset_run_with_run_dir_and_data_on_a_remote_scheme_equals_local(places, tmp_path, capsys):
    local_root, url_root = places
    base = os.path.join(local_root, "teacher")  # the base model to fine-tune: a name/path for transformers
    run_url, run_local = url_root + "runs/r", os.path.join(local_root, "runs", "r")
    _run(run_url, url_root + "sst2", base, capsys)
    _run(run_local, os.path.join(local_root, "sst2"), base, capsys)
    bucket_run = Path(fake_remote.local(run_url))

    # Every stage landed in the remote run_dir, bookkeeping included; the locally trained parts were uploaded.
    for stage in ("data", "teacher", "transfer", "scored", "dev/transfer", "dev/scored", "students/distilled"):
        assert json.loads((bucket_run / stage / STAGE_FILE).read_text())["key"] == \
            json.loads((Path(run_local) / stage / STAGE_FILE).read_text())["key"], stage
    assert (bucket_run / "teacher" / "model.safetensors").stat().st_size > 0
    assert (bucket_run / "students" / "distilled" / schema.STUDENT_MODEL_DIR).is_dir()
    assert (bucket_run / "students" / "distilled" / schema.CURVES_FILE).exists()
    assert (bucket_run / "report.html").exists() and (bucket_run / "report_files" / "augmentation.png").exists()
    assert (bucket_run / "config.yaml").exists()

    # The scorer loaded the fine-tuned teacher from the run_dir URL, and the results equal the local run's.
    assert transfer.read_metadata(run_url + "/scored", scored=True)[schema.META_TEACHER_ID] == run_url + "/teacher"
    _assert_same_sets(_by_id(run_url + "/transfer"), _by_id(os.path.join(run_local, "transfer")))
    _assert_same_logits(_by_id(run_url + "/scored"), _by_id(os.path.join(run_local, "scored")))
    _assert_same_logits(_by_id(run_url + "/dev/scored"), _by_id(os.path.join(run_local, "dev", "scored")))
    remote_m = json.loads((bucket_run / "students" / "distilled" / schema.METRICS_FILE).read_text())
    local_m = json.loads((Path(run_local) / "students" / "distilled" / schema.METRICS_FILE).read_text())
    assert remote_m["dev_accuracy"] == local_m["dev_accuracy"] and remote_m["dev_rows"] == DEV_ROWS
    results = json.loads((bucket_run / "results.json").read_text())
    assert [r["dev_accuracy"] for r in results["rows"]] == \
        [r["dev_accuracy"] for r in json.loads((Path(run_local) / "results.json").read_text())["rows"]]
    assert results["augmentation"]["plot"] == run_url + "/report_files/augmentation.png"

    # A rerun reuses every stage from the remote run_dir's bookkeeping.
    err = _run(run_url, url_root + "sst2", base, capsys)
    for stage in ("data", "teacher", "augment", "score", "dev", "dev.score", "students.distilled"):
        assert f"[{stage}] up to date" in err, stage


def test_teacher_fine_tunes_from_and_to_a_remote_scheme(places, capsys):
    """`transferset teacher` with --train, --dev, --model's output on the scheme equals the local run."""
    local_root, url_root = places
    out = {}
    for name, root in (("remote", url_root), ("local", local_root)):
        def at(rel, root=root):
            return f"{root}{rel}" if root.endswith("//") else os.path.join(root, rel)
        assert main(["teacher", "--train", at("sst2/train.tsv"), "--dev", at("sst2/dev.tsv"),
                     "--output", at("fine_tuned"), "--model", os.path.join(local_root, "teacher"),
                     "--epochs", "1", "--batch-size", "16", "--max-length", "32", "--no-progress"]) == 0
        out[name] = json.loads(capsys.readouterr().out)
        assert fs.exists(fs.join(at("fine_tuned"), "model.safetensors"))
        assert fs.exists(fs.join(at("fine_tuned"), schema.METRICS_FILE))
    assert out["remote"]["best_dev_accuracy"] == out["local"]["best_dev_accuracy"]
    assert out["remote"]["train_rows"] == TRAIN_ROWS and out["remote"]["dev_rows"] == DEV_ROWS
    # A second run into the same remote output is refused, as it is locally.
    assert main(["teacher", "--train", f"{url_root}sst2/train.tsv", "--dev", f"{url_root}sst2/dev.tsv",
                 "--output", f"{url_root}fine_tuned", "--model", os.path.join(local_root, "teacher")]) == 1
    assert "already holds a complete run of `transferset teacher`" in capsys.readouterr().err
