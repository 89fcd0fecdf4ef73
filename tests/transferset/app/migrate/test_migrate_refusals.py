"""`transferset migrate RUN` converts run folders and nothing else, and refuses in one line (exit 2) what it must not
touch: a stage folder reached through a symbolic link, a read-only run folder, a path that is no folder, a folder no
run wrote. A damaged layout record has one way out, named by `run` and taken by `migrate`. Each goes through the
command line (transferset.app.cli.main) and checks that a refusal wrote nothing."""
from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from test_migrate import assert_converted, layout1_folder
from test_migrate_layout3 import LAYOUT3_KEYS, layout3_folder
from transferset.app.stages import keys
from transferset.app.cli import main
from transferset.app.run.runner import plan_stages, resolve_data, run_pipeline
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


@pytest.fixture
def read_only():
    """Makes a folder read-only for this process, and writable again afterwards: `chattr +i` as root (whom chmod
    does not stop), chmod otherwise."""
    made = []

    def make(folder: Path) -> None:
        if os.geteuid() == 0:
            done = subprocess.run(["chattr", "+i", str(folder)], capture_output=True, text=True)
            if done.returncode:
                pytest.skip(f"root, and chattr +i does not work here: {done.stderr.strip()}")
        else:
            folder.chmod(0o555)
        made.append(folder)

    yield make
    for folder in made:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(folder)], check=True)
        else:
            folder.chmod(0o755)


def test_migrate_on_a_read_only_run_folder_says_so_in_one_line_and_changes_nothing(tmp_path, capsys, read_only):
    cfg = layout1_folder("demo", tmp_path)
    run = tmp_path / "run"
    with_config(cfg, run)
    before = tree_hashes(str(run))
    read_only(run)
    with pytest.raises(OSError):  # the fixture did make it read-only
        (run / "probe").write_text("")
    assert main(["migrate", str(run)]) == 2
    line = refusal(capsys)
    assert line.startswith(f"transferset migrate: error: {run} ") and "write" in line
    assert tree_hashes(str(run)) == before and keys.read_layout(str(run)) is None


def test_migrate_refuses_a_path_that_is_no_folder_and_creates_nothing(tmp_path, capsys):
    cfg = layout1_folder("demo", tmp_path)
    with_config(cfg, tmp_path / "run")
    config = str(tmp_path / "run" / "config.yaml")
    missing = tmp_path / "missing"
    assert main(["migrate", str(missing), "--config", config]) == 2
    assert refusal(capsys) == f"transferset migrate: error: {missing} does not exist: give a run folder"
    assert not missing.exists()
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    assert main(["migrate", str(a_file), "--config", config]) == 2
    assert refusal(capsys) == f"transferset migrate: error: {a_file} is a file, not a run folder"
    assert a_file.read_text() == "mine"


def test_migrate_refuses_a_folder_no_run_wrote_saying_what_it_lacks(tmp_path, capsys):
    """A user's folder given with a run's --config: no stage record, no layout record. Not stamped as a run
    folder."""
    cfg = layout1_folder("demo", tmp_path)
    with_config(cfg, tmp_path / "run")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    assert main(["migrate", str(mine), "--config", str(tmp_path / "run" / "config.yaml")]) == 2
    line = refusal(capsys)
    assert f"{mine} holds no stage record (data/.stage.json, teacher/.stage.json" in line
    assert f"and no layout record ({keys.LAYOUT_FILE})" in line and "not a run folder" in line
    assert sorted(p.name for p in mine.rglob("*")) == ["notes.txt"] and (mine / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("record", ["garbage", '{"layout": -1}', '{"layout": 0}', '{"layout": "three"}', "[3]"])
def test_a_damaged_layout_record_has_one_way_out_which_works(tmp_path, capsys, record):
    """A layout-3 folder whose layout record is damaged: `run` refuses it naming a command; that command (migrate)
    tells from the stage records that they hold layout 3's keys and converts them; then `run` reuses every stage."""
    from recording_stages import RecordingStages

    cfg = layout3_folder("demo", tmp_path)
    run = tmp_path / "run"
    (run / keys.LAYOUT_FILE).write_text(record)
    (tmp_path / "today.yaml").write_text(json.dumps(typed.to_dict(cfg)))
    before = tree_hashes(str(run))
    assert main(["run", "--config", str(tmp_path / "today.yaml")]) == 2
    line = refusal(capsys)
    assert f"run_dir {run} has a damaged layout record ({keys.LAYOUT_FILE}: it names no layout)" in line
    assert tree_hashes(str(run)) == before
    advice = re.search(r"`transferset (migrate [^`]+)`", line).group(1)
    assert main(advice.split()) == 0
    said = capsys.readouterr().out
    assert f"{run}/{keys.LAYOUT_FILE} is damaged (it names no layout)" in said
    assert "its stage records hold layout 3's keys (9 of 9 stages): converted as layout 3" in said
    assert keys.read_layout(str(run)) == keys.LAYOUT
    assert_converted(cfg, "layout3_key", LAYOUT3_KEYS["demo"])
    log = []
    run_pipeline(cfg, log=log.append, functions=RecordingStages().functions())
    ran = [s for s in plan_stages(cfg, resolve_data(cfg.data, cfg.test)).stages if s.run is not None]
    assert sum("up to date" in m for m in log) == len(ran) == 9


def test_a_layout_record_of_a_newer_transferset_is_refused_by_both_commands_naming_it(tmp_path, capsys):
    cfg = layout3_folder("demo", tmp_path)
    run = tmp_path / "run"
    (run / keys.LAYOUT_FILE).write_text(json.dumps({"layout": keys.LAYOUT + 1}))
    (tmp_path / "today.yaml").write_text(json.dumps(typed.to_dict(cfg)))
    before = tree_hashes(str(run))
    newer = f"records layout {keys.LAYOUT + 1}, written by a newer transferset (this one writes layout {keys.LAYOUT})"
    assert main(["run", "--config", str(tmp_path / "today.yaml")]) == 2
    line = refusal(capsys)
    assert f"run_dir {run} {newer}: run it with that transferset, or give another run_dir" in line
    assert "migrate" not in line
    assert main(["migrate", str(run)]) == 2
    assert f"{run} {newer}: run it with that transferset" in refusal(capsys)
    assert tree_hashes(str(run)) == before
