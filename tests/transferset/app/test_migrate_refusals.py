"""`transferset migrate RUN` refuses in one line (exit 2) what it must not touch: a stage folder reached through a
symbolic link. Through the command line (transferset.app.cli.main), checking that a refusal wrote nothing."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from test_migrate import layout1_folder
from transferset.app import keys
from transferset.app.cli import main
from transferset.runtime import typed
from transferset.testing import tree_hashes


def with_config(cfg, run: Path) -> None:
    """RUN/config.yaml as a run of today writes it: `cfg`'s settings (JSON is YAML)."""
    (run / "config.yaml").write_text(json.dumps(typed.to_dict(cfg)))


def refusal(capsys) -> str:
    """The one line a refused command printed (stderr has nothing else: no traceback)."""
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("link", ["students", "students/distilled"])
def test_migrate_refuses_a_stage_folder_reached_through_a_link_and_touches_nothing(tmp_path, capsys, link):
    """A link inside the run folder (students/ or one student's folder → a folder elsewhere): migrate would rewrite
    the records of the folder it points to. Refused as `run` refuses it, before anything is written."""
    cfg = layout1_folder("demo", tmp_path)
    run, other = tmp_path / "run", tmp_path / "elsewhere"
    with_config(cfg, run)
    (run / link).rename(other)
    os.symlink(other, run / link)
    before, outside = tree_hashes(str(run)), tree_hashes(str(other))
    assert main(["migrate", str(run)]) == 2
    assert f"run_dir {run}: {link} is a symbolic link (to {other})" in refusal(capsys)
    assert tree_hashes(str(other)) == outside and tree_hashes(str(run)) == before
    assert keys.read_layout(str(run)) is None
