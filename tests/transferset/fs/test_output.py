"""transferset.fs.output: what an output folder holds, what a run may clear, and the finishing order."""
import json
import os
import shutil

import pytest

from transferset.contract import schema
from transferset.fs.output import STUDENT_NAMES, Output
from transferset.fs.written import reject_line
from transferset.runtime.errors import ConfigError, UserError
from transferset.sources import Reject


def _run(path, command, *, finish=True, **kwargs) -> Output:
    """A run of `command` into `path` that writes data/part-0.parquet (and finishes when asked)."""
    out = Output(str(path), command, **kwargs)
    with out.open():
        out.check()
        out.prepare()
        (path / schema.DATA_DIR).mkdir(exist_ok=True)
        (path / schema.DATA_DIR / "part-0.parquet").write_bytes(b"rows")
        out.write_rejects([Reject("in.tsv", 3, "x\ty", "bad label")])
        if finish:
            out.finish({"output_rows": 1})
    return out


def test_a_finished_run_records_what_it_wrote_and_finishes_with_stats_then_the_marker(tmp_path):
    out = tmp_path / "out"
    _run(out, "augment")
    assert json.loads((out / schema.STATS_FILE).read_text()) == {"output_rows": 1}
    assert (out / schema.COMPLETE_MARKER).read_bytes() == b""
    assert (out / schema.STATS_FILE).stat().st_mtime_ns <= (out / schema.COMPLETE_MARKER).stat().st_mtime_ns
    manifest = json.loads((out / schema.MANIFEST_FILE).read_text())
    assert manifest["command"] == "augment" and manifest["kept"] == []
    assert manifest["written"] == sorted([schema.COMPLETE_MARKER, schema.DATA_DIR, schema.REJECTS_DIR,
                                          schema.STATS_FILE])
    line = (out / schema.REJECTS_DIR / "rejects.jsonl").read_text()
    assert json.loads(line) == {"file": "in.tsv", "line": 3, "raw": "x\ty", "reason": "bad label"}
    assert line == reject_line({"reason": "bad label", "raw": "x\ty", "line": 3, "file": "in.tsv"}) + "\n"
    assert not (out / schema.LOCK_FILE).exists()


def test_a_complete_output_is_kept_unless_overwrite_and_says_what_it_holds(tmp_path):
    out = tmp_path / "out"
    _run(out, "augment")
    for command in ("augment", "predict"):
        with pytest.raises(UserError, match=r"already holds a complete run of `transferset augment` \(a transfer "
                                            r"set\), _COMPLETE present; pass --overwrite"):
            Output(str(out), command).check()
    _run(out, "predict", overwrite=True)
    assert json.loads((out / schema.MANIFEST_FILE).read_text())["command"] == "predict"


def test_an_unfinished_run_is_ours_to_redo_but_another_commands_needs_overwrite(tmp_path):
    out = tmp_path / "out"
    _run(out, "score", finish=False)
    (out / schema.DATA_DIR / "_tmp-1.partial").write_bytes(b"half")  # a write the kill cut short
    with pytest.raises(UserError, match=r"holds an unfinished run of `transferset score` \(a scored transfer set\); "
                                        "pass --overwrite"):
        Output(str(out), "augment").check()
    again = Output(str(out), "score")
    with again.open():
        again.check()
        again.prepare()
    assert sorted(p.name for p in out.iterdir()) == [schema.MANIFEST_FILE]  # the killed run's files, and only them


def test_resume_keeps_the_data_and_clears_the_rest(tmp_path):
    out = tmp_path / "out"
    _run(out, "score")
    resumed = Output(str(out), "score", resume=True)
    resumed.check()
    resumed.prepare(keep=(schema.DATA_DIR,))
    assert sorted(p.name for p in out.iterdir()) == [schema.MANIFEST_FILE, schema.DATA_DIR]
    assert (out / schema.DATA_DIR / "part-0.parquet").read_bytes() == b"rows"
    # The kept shards are the run's own again when it finishes (recorded by name).
    (out / schema.DATA_DIR / "part-1.parquet").write_bytes(b"more rows")
    resumed.finish({})
    assert json.loads((out / schema.MANIFEST_FILE).read_text())["files"] == [
        schema.COMPLETE_MARKER, "data/part-0.parquet", "data/part-1.parquet", schema.STATS_FILE]
    other = tmp_path / "other"
    _run(other, "augment")  # --resume completes a run of score only
    with pytest.raises(UserError, match="already holds a complete run of `transferset augment`"):
        Output(str(other), "score", resume=True).check()


def test_files_of_others_are_kept_and_never_written_over(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match=r"holds notes.txt, which transferset did not write; choose an empty or new "
                                        r"--output, or pass --overwrite to write beside them \(they are kept\)"):
        Output(str(out), "augment").check()
    _run(out, "augment", overwrite=True)
    _run(out, "augment", overwrite=True)  # replacing our own set keeps them still
    assert (out / "notes.txt").read_text() == "mine"
    assert json.loads((out / schema.MANIFEST_FILE).read_text())["kept"] == ["notes.txt"]
    # A file added to a finished output is another's too, even with a name the command writes.
    (out / schema.CURVES_FILE).write_text("a plot of mine")
    with pytest.raises(UserError, match=r"holds curves.png, notes.txt, which .*`transferset train` writes curves.png "
                                        r"there, and transferset never deletes files it did not write, even with "
                                        "--overwrite"):
        Output(str(out), "train", names=STUDENT_NAMES, overwrite=True).check()
    assert (out / schema.CURVES_FILE).read_text() == "a plot of mine"


def test_empty_folders_hold_nothing_to_lose(tmp_path):
    out = tmp_path / "out"
    (out / schema.STUDENT_MODEL_DIR / "tokenizer").mkdir(parents=True)  # a killed `train` of an earlier version
    train = Output(str(out), "train", names=STUDENT_NAMES)
    assert train.check().foreign == []
    train.prepare()
    assert not (out / schema.STUDENT_MODEL_DIR).exists()


def test_an_earlier_versions_complete_layout_is_recognised_by_its_names(tmp_path):
    out = tmp_path / "out"
    (out / schema.DATA_DIR).mkdir(parents=True)
    (out / schema.DATA_DIR / "part-00000.parquet").write_bytes(b"rows")
    (out / schema.DATA_DIR / "keep.tsv").write_text("mine")  # another's file inside that layout
    (out / schema.STATS_FILE).write_text("{}")
    (out / schema.COMPLETE_MARKER).write_text("")
    with pytest.raises(UserError, match=r"already holds a complete run of an earlier transferset version"):
        Output(str(out), "score").check()
    # Inside data/, only the names transferset gives its files are taken for ours: keep.tsv stays.
    _run(out, "score", overwrite=True)
    assert sorted(p.name for p in (out / schema.DATA_DIR).iterdir()) == ["keep.tsv", "part-0.parquet"]
    assert (out / schema.DATA_DIR / "keep.tsv").read_text() == "mine"
    # A folder of others' files with other names at its top is not that layout: nothing there is ours.
    (out / schema.MANIFEST_FILE).unlink()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match=r"holds _COMPLETE, data/ \(keep.tsv, part-0.parquet\), notes.txt, rejects/ "):
        Output(str(out), "score", overwrite=True).check()


def _tree(path) -> dict:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_a_users_files_inside_data_and_rejects_survive_a_rerun_and_an_overwrite(tmp_path):
    """The record names the files transferset wrote, not the whole data/ folder, so a rerun onto an unfinished
    output (and --overwrite onto a complete one) keeps a user's data/keep.txt and rejects/mine.jsonl."""
    out = tmp_path / "out"
    _run(out, "augment")
    manifest = json.loads((out / schema.MANIFEST_FILE).read_text())
    assert manifest["files"] == sorted([schema.COMPLETE_MARKER, "data/part-0.parquet", "rejects/rejects.jsonl",
                                        schema.STATS_FILE])
    (out / schema.COMPLETE_MARKER).unlink()  # as a killed rerun would leave it
    (out / schema.DATA_DIR / "keep.txt").write_text("x")
    (out / schema.REJECTS_DIR / "mine.jsonl").write_text('{"mine": 1}\n')
    (out / schema.DATA_DIR / "notes").mkdir()
    (out / schema.DATA_DIR / "notes" / "a.md").write_text("kept with its folder")
    mine = {rel: data for rel, data in _tree(out).items() if "keep" in rel or "mine" in rel or "notes" in rel}
    assert len(mine) == 3
    _run(out, "augment")  # an unfinished run of the same command: redone without --overwrite
    assert {rel: data for rel, data in _tree(out).items() if rel in mine} == mine
    manifest = json.loads((out / schema.MANIFEST_FILE).read_text())
    assert manifest["kept_files"] == sorted(mine) and not set(mine) & set(manifest["files"])
    _run(out, "augment", overwrite=True)  # --overwrite onto a complete output: the same
    _run(out, "score", overwrite=True)  # another command's
    assert {rel: data for rel, data in _tree(out).items() if rel in mine} == mine
    assert sorted(_tree(out)) == sorted([schema.MANIFEST_FILE, schema.COMPLETE_MARKER, "data/part-0.parquet",
                                         "rejects/rejects.jsonl", schema.STATS_FILE, *mine])
    # Only files are ours: what is left of a folder of others' after clearing stays, a folder left empty goes.
    again = Output(str(out), "score", overwrite=True)
    again.check()
    again.prepare()
    assert sorted(_tree(out)) == sorted([schema.MANIFEST_FILE, *mine])
    assert (out / schema.DATA_DIR / "notes").is_dir() and not (out / schema.STATS_FILE).exists()
    (out / schema.DATA_DIR / "keep.txt").unlink()
    (out / schema.DATA_DIR / "notes" / "a.md").unlink()
    (out / schema.REJECTS_DIR / "mine.jsonl").unlink()
    (out / schema.DATA_DIR / "notes" / "deep").mkdir()  # empty folders hold nothing to lose
    again = Output(str(out), "score")
    again.check()
    again.prepare()
    assert sorted(p.name for p in out.iterdir()) == [schema.MANIFEST_FILE]


def test_a_killed_run_and_an_earlier_record_clear_only_the_names_transferset_gives_its_files(tmp_path):
    """No finished list of files (a run killed before it ended, or a record of an earlier version naming top-level
    entries only): inside data/ and rejects/ only shards, JSON lines and temporary files are ours."""
    out = tmp_path / "out"
    _run(out, "score", finish=False)
    (out / schema.DATA_DIR / "_tmp-1.partial").write_bytes(b"half")  # a write the kill cut short
    (out / schema.DATA_DIR / "beam-temp-part-1" / "x").mkdir(parents=True)  # Beam's temporary shards
    (out / schema.DATA_DIR / "beam-temp-part-1" / "x" / "shard").write_bytes(b"half")
    (out / schema.DATA_DIR / "keep.txt").write_text("put there after the kill")
    again = Output(str(out), "score")
    again.check()
    again.prepare()
    assert sorted(_tree(out)) == [schema.MANIFEST_FILE, "data/keep.txt"]
    # A record of an earlier version: top-level names only.
    _run(out, "score")
    (out / schema.REJECTS_DIR / "mine.txt").write_text("mine")
    (out / schema.MANIFEST_FILE).write_text(json.dumps({"command": "score", "kept": [], "written": [
        schema.COMPLETE_MARKER, schema.DATA_DIR, schema.REJECTS_DIR, schema.STATS_FILE]}))
    with pytest.raises(UserError, match=r"already holds a complete run of `transferset score`"):
        Output(str(out), "score").check()
    _run(out, "augment", overwrite=True)
    assert (out / schema.DATA_DIR / "keep.txt").read_text() == "put there after the kill"
    assert (out / schema.REJECTS_DIR / "mine.txt").read_text() == "mine"


@pytest.mark.parametrize("rel", ["data/extra.parquet", "data/x.jsonl", "rejects/rejects-00000-of-00001.jsonl"])
def test_anothers_file_the_run_would_read_as_its_own_or_write_over_is_refused(tmp_path, rel):
    """A shard of another's inside data/ would be read as part of the set; a file named as transferset names its
    rejects would be written over: refused whatever the flags, and left as it was."""
    out = tmp_path / "out"
    _run(out, "augment")
    (out / rel).write_text("mine")
    for flags in ({}, {"overwrite": True}):
        with pytest.raises(UserError, match=rf"holds {rel}, which transferset did not write, where `transferset "
                                            r"augment` writes its own files: .* move it away or choose another "
                                            r"--output"):
            Output(str(out), "augment", **flags).check()
    assert (out / rel).read_text() == "mine"


def test_an_output_that_contains_an_input_is_refused_whatever_the_flags(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.tsv").write_text("sentence\tlabel\n")
    for path, output in (("data/train.tsv", "."), ("data/train.tsv", "data"), ("data", "data"),
                         ("memory://b/out/x.tsv", "memory://b/out/")):
        with pytest.raises(ConfigError, match=f"--output {output} contains the input {path}: this run could write"):
            Output(output, "predict", inputs=[path, "hf:glue:sst2:train"], overwrite=True).check()
    Output("out", "predict", inputs=["data/train.tsv", "outside.tsv"]).check()


def test_a_url_output_follows_the_same_protocol(tmp_path):
    url = f"memory://{tmp_path.name}/out"
    first = Output(url, "eval-set")
    with first.open():
        first.check()
        first.prepare()
        first.write_rejects([])
        first.finish({"rows": 0})
    with pytest.raises(UserError, match=r"already holds a complete run of `transferset eval-set` \(an evaluation set\)"):
        Output(url, "eval-set").check()
    again = Output(f"file://{tmp_path}/local", "eval-set")
    assert again.path == f"{tmp_path}/local"  # normalised once, where the output is made


def test_an_output_fsspec_cannot_read_is_written_only_when_empty(tmp_path, monkeypatch, caplog):
    """gs:// written by Beam where gcsfs is not installed: what is there cannot be told apart, so only an
    empty output is written (Beam's FileSystems list it: `lister`)."""
    from transferset import fs

    out = tmp_path / "out"
    real = fs.filesystem

    def no_backend(path):
        if str(path).startswith(str(out)):
            raise UserError(f"{path}: cannot open beamonly:// paths; install its fsspec backend")
        return real(path)

    monkeypatch.setattr(fs, "filesystem", no_backend)
    listing = lambda path: [str(p) for p in out.rglob("*")] if out.exists() else []  # noqa: E731
    empty = Output(str(out), "augment", lister=listing)
    assert empty.check() is None and "not checked for earlier results" in caplog.text
    empty.prepare()  # nothing to clear, no record written
    assert not out.exists()
    out.mkdir()
    (out / "keep.tsv").write_text("mine")
    with pytest.raises(UserError, match=r"is not empty .* and cannot be checked here for what transferset wrote"):
        Output(str(out), "augment", lister=listing, overwrite=True).check()
    assert (out / "keep.tsv").read_text() == "mine"


@pytest.mark.parametrize("record", ['{"command": "augment", "written": 5, "kept": []}', '{"command": "augment"}',
                                    "[1, 2]", "not json", '{"command": 3, "kept": []}'])
def test_a_damaged_record_makes_nothing_ours(tmp_path, record):
    out = tmp_path / "out"
    (out / schema.DATA_DIR).mkdir(parents=True)
    (out / schema.DATA_DIR / "keep.tsv").write_text("mine")
    (out / schema.MANIFEST_FILE).write_text(record)
    with pytest.raises(UserError, match=r"holds data/ \(keep.tsv\), which transferset did not write"):
        Output(str(out), "augment", overwrite=True).check()


def test_writing_finishes_a_block_that_ends_well_and_leaves_a_failed_one_unfinished(tmp_path):
    out = tmp_path / "model"
    with Output(str(out), "train", names=STUDENT_NAMES).writing() as run:
        assert (out / schema.LOCK_FILE).exists()  # owned while the block runs
        run.prepare()
        with run.local() as work:
            assert work == str(out)  # a local output is written in place
            (out / schema.STUDENT_MODEL_DIR).mkdir()
    assert (out / schema.COMPLETE_MARKER).exists() and not (out / schema.LOCK_FILE).exists()
    assert json.loads((out / schema.MANIFEST_FILE).read_text())["written"] == sorted(
        [schema.COMPLETE_MARKER, schema.STUDENT_MODEL_DIR])
    # A complete output is refused before the block runs; with overwrite, a failing block leaves no marker.
    with pytest.raises(UserError, match="already holds a complete run of `transferset train`"):
        with Output(str(out), "train", names=STUDENT_NAMES).writing():
            raise AssertionError("the block ran")
    with pytest.raises(RuntimeError, match="killed"):
        with Output(str(out), "train", names=STUDENT_NAMES, overwrite=True).writing() as run:
            run.prepare()
            (out / schema.STUDENT_MODEL_DIR).mkdir()
            (out / schema.STUDENT_MODEL_DIR / "config.json").write_text("{}")  # half a model
            raise RuntimeError("killed")
    assert not (out / schema.COMPLETE_MARKER).exists() and not (out / schema.LOCK_FILE).exists()
    assert Output(str(out), "train", names=STUDENT_NAMES).check().command == "train"  # ours, unfinished: redone


def test_clear_deletes_what_the_record_lists_and_keeps_the_rest(tmp_path):
    """`transferset run` clears a staged stage's URL folder this way before uploading into it."""
    from transferset.fs.output import clear
    import fsspec

    url = f"memory://{tmp_path.name}/stage"
    with Output(url, "train", names=STUDENT_NAMES).writing() as out:
        out.prepare()
        fsspec.filesystem("memory").pipe(f"/{tmp_path.name}/stage/model/w.bin", b"weights")
    fsspec.filesystem("memory").pipe(f"/{tmp_path.name}/stage/model/notes.txt", b"mine")
    fsspec.filesystem("memory").pipe(f"/{tmp_path.name}/stage/.stage.json", b"{}")
    assert sorted(clear(url)) == [schema.COMPLETE_MARKER, "model/w.bin"]
    left = sorted(p.split("/stage/")[1] for p in fsspec.filesystem("memory").find(f"/{tmp_path.name}/stage"))
    assert left == [".stage.json", schema.MANIFEST_FILE, "model/notes.txt"]
    assert clear(f"memory://{tmp_path.name}/nothing") == []


@pytest.mark.parametrize("overwrite", (False, True))
def test_a_link_inside_an_output_is_refused_and_the_folder_it_points_to_is_unchanged(tmp_path, overwrite):
    """A killed `train` whose model/ was replaced by a link to another student's model/: its rerun (and
    --overwrite) would have cleared and written that student's weights."""
    from transferset.testing import tree_hashes

    other = tmp_path / "other"
    (other / schema.STUDENT_MODEL_DIR).mkdir(parents=True)
    (other / schema.STUDENT_MODEL_DIR / "weights.bin").write_bytes(b"the other student")
    out = tmp_path / "out"
    student = Output(str(out), "train", names=STUDENT_NAMES)
    with student.writing():
        student.prepare()
        (out / schema.STUDENT_MODEL_DIR).mkdir()
        (out / schema.STUDENT_MODEL_DIR / "weights.bin").write_bytes(b"ours")
    shutil.rmtree(out / schema.STUDENT_MODEL_DIR)
    (out / schema.COMPLETE_MARKER).unlink()
    os.symlink(other / schema.STUDENT_MODEL_DIR, out / schema.STUDENT_MODEL_DIR)
    before, ours = tree_hashes(str(other)), tree_hashes(str(out))
    with pytest.raises(ConfigError, match=rf"^--output {out}: model is a symbolic link \(to {other}/model\); "):
        with Output(str(out), "train", names=STUDENT_NAMES, overwrite=overwrite).writing() as again:
            again.prepare()
    assert tree_hashes(str(other)) == before and tree_hashes(str(out)) == ours


def test_a_link_among_others_entries_is_kept_and_written_beside(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    os.symlink(tmp_path, out / "notes")  # another's entry the run neither writes nor clears
    _run(out, "augment", overwrite=True)
    assert os.path.islink(out / "notes") and (out / schema.COMPLETE_MARKER).exists()
