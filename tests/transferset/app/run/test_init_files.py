"""`run --data` and `init` on files people have: a header with no rows, a column named twice and a small file
get one line (exit 2, nothing written) or a carve that fits; `augment` refuses a column named twice alike."""
import json
import re

import pytest
import yaml

from transferset.app.cli import main
from transferset.app.run.runner import load_config
from transferset.data.splits import split_data


def _reviews(n: int) -> str:
    return "".join(f"review {i} was {'good' if i % 2 else 'bad'},{'pos' if i % 2 else 'neg'}\n" for i in range(n))


@pytest.mark.parametrize("command", ["run", "init"])
def test_a_header_without_rows_is_said_so(command, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "only.csv").write_text("text,label\n")
    out = ["--output", "my.yaml"] if command == "init" else []
    assert main([command, "--data", "only.csv", *out]) == 2
    err = capsys.readouterr().err.strip()
    # init names the file by the absolute path it writes into the YAML, run as given
    assert re.search(r"data: (\S*/)?only\.csv has a header \(text, label\) but no data rows; give a file with "
                     r"labeled rows$", err), err
    assert len(err.splitlines()) == 1 and sorted(p.name for p in tmp_path.iterdir()) == ["only.csv"]


@pytest.mark.parametrize("argv", [["run", "--data", "dup.csv"], ["init", "--data", "dup.csv", "--output", "my.yaml"],
                                  ["augment", "--input", "dup.csv", "--output", "out"]])
def test_a_column_named_twice_is_refused_before_anything_is_written(argv, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dup.csv").write_text("text,label,text\n" + _reviews(30).replace(",pos", ",1,x").replace(",neg", ",0,y"))
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "dup.csv, line 1: the header names the column 'text' more than once (text, label, text)" in err
    assert len(err.splitlines()) == 1 and sorted(p.name for p in tmp_path.iterdir()) == ["dup.csv"]


def test_init_writes_a_carve_that_run_accepts_on_a_small_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "small.csv").write_text("text,label\n" + _reviews(60))
    assert main(["init", "--data", "small.csv", "--output", "my.yaml"]) == 0
    assert yaml.safe_load((tmp_path / "my.yaml").read_text())["validation"]["rows"] == "auto"
    cfg = load_config("my.yaml", [])
    split_data("small.csv", "data", cfg)
    stats = json.loads((tmp_path / "data" / "split.json").read_text())
    assert (stats["validation_rows"], stats["labeled_rows"]) == (10, 50)  # 10 %, raised toward 5 per class
