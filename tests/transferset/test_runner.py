"""`transferset run`: configs validate, overrides apply, and the demo runs end to end (reduced)."""
import json
from pathlib import Path

import pytest

from transferset import schema
from transferset.cli import main
from transferset.errors import UserError
from transferset.runner import STAGE_FILE, load_config, resolve_data

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))


def test_there_are_configs():
    assert {p.name for p in CONFIGS} >= {"demo.yaml", "sst2_tang.yaml", "sst2_lowres.yaml", "sst2_transformer.yaml"}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_config_validates_and_names_its_command(path):
    first = path.read_text().splitlines()[0]
    assert first == f"# transferset run --config configs/{path.name}"
    cfg = load_config(str(path))
    assert cfg["students"]


def test_overrides_and_bad_configs(tmp_path):
    cfg = load_config("configs/demo.yaml", ["teacher.epochs=1", "students.distilled.epochs=3", "data=/x"])
    assert cfg["teacher"]["epochs"] == 1 and cfg["students"]["distilled"]["epochs"] == 3 and cfg["data"] == "/x"
    assert cfg["teacher"]["lr"] == 5e-5  # untouched settings keep the file's values
    bad = tmp_path / "bad.yaml"
    bad.write_text("run_dir: x\nstudents: {s: {student: bilstm, epochz: 3}}\n")
    with pytest.raises(UserError, match=r"students.s: unknown key\(s\) \['epochz'\]"):
        load_config(str(bad))
    bad.write_text("run_dir: x\nteachr: {}\nstudents: {s: {}}\n")
    with pytest.raises(UserError, match="unknown setting"):
        load_config(str(bad))
    assert load_config("configs/demo.yaml", ["score.forward=padded"])["score"]["forward"] == "padded"
    with pytest.raises(UserError, match=r"score: --forward 'fast': choose one of \['auto', 'packed', 'padded'\]"):
        load_config("configs/demo.yaml", ["score.forward=fast"])
    with pytest.raises(UserError, match="expected key=value"):
        load_config("configs/demo.yaml", ["teacher.epochs"])
    with pytest.raises(UserError, match="train.tsv not found"):
        resolve_data(str(tmp_path))


@pytest.mark.integration
def test_demo_config_runs_end_to_end_reduced(sst2_dir, tmp_path, capsys):
    run_dir = tmp_path / "demo"
    small = ["labeled_limit=300", "teacher.epochs=1", "teacher.max_steps=15", "augment.n_iter=2",
             "students.labels_only.epochs=1", "students.distilled.epochs=1", f"data={sst2_dir}"]
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
    assert names[0] == "teacher" and len(names) == 3
    for r in results["rows"]:
        assert 0.0 <= r["dev_accuracy"] <= 1.0 and r["parameters"] > 0
    assert "| teacher |" in out.out
    stats = json.loads((run_dir / "transfer" / schema.STATS_FILE).read_text())
    assert stats["accepted_rows"] == 300

    # A rerun with a changed student setting redoes only that student.
    stamps = {d: (run_dir / d / STAGE_FILE).stat().st_mtime_ns for d in ("teacher", "transfer", "scored")}
    distilled = (run_dir / "students" / "distilled" / STAGE_FILE).stat().st_mtime_ns
    labels_only = (run_dir / "students" / "labels_only" / STAGE_FILE).stat().st_mtime_ns
    assert main(["run", "--config", "configs/demo.yaml", f"run_dir={run_dir}", *small,
                 "students.distilled.lr=0.003"]) == 0
    err = capsys.readouterr().err
    assert "[teacher] up to date" in err and "[score] up to date" in err
    assert {d: (run_dir / d / STAGE_FILE).stat().st_mtime_ns for d in ("teacher", "transfer", "scored")} == stamps
    assert (run_dir / "students" / "labels_only" / STAGE_FILE).stat().st_mtime_ns == labels_only
    assert (run_dir / "students" / "distilled" / STAGE_FILE).stat().st_mtime_ns != distilled
