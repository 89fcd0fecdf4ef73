"""An output in a folder the user cannot write: one line naming that folder, exit 2 (a usage error), nothing
written, for every command that writes one (the output's lock is where the folder is first written:
transferset.fs.lock; `init` writes its YAML through the same check)."""
import os
import shutil
import subprocess

import numpy as np
import pytest

from transferset import testing
from transferset.app.cli import main

TEXTS = [f"a {w} film , {v} acting" for w in ("good", "bad", "great", "dull") for v in ("fine", "awful", "charming")]


@pytest.fixture
def locked_folder(tmp_path):
    """An empty folder no process may write in, root included (`chattr +i`; chmod where not root)."""
    folder = tmp_path / "locked"
    folder.mkdir()
    root = os.geteuid() == 0
    if root and not shutil.which("chattr"):
        pytest.skip("root, and no chattr to make a folder unwritable")
    try:
        if root:
            done = subprocess.run(["chattr", "+i", str(folder)], capture_output=True, text=True)
            if done.returncode:
                pytest.skip(f"chattr +i does not work here: {done.stderr.strip()}")
        else:
            folder.chmod(0o555)
        try:
            (folder / "probe").touch()
        except PermissionError:
            pass
        else:
            pytest.skip("the folder stays writable here")
        yield folder
    finally:
        if root:
            subprocess.run(["chattr", "-i", str(folder)], check=False)
        folder.chmod(0o755)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("unwritable_inputs")
    rows = "".join(f"{t}\t{i % 2}\n" for i, t in enumerate(TEXTS))
    (d / "train.tsv").write_text("sentence\tlabel\n" + rows)
    (d / "dev.tsv").write_text("sentence\tlabel\n" + rows)
    teacher = testing.tiny_classifier(str(d / "teacher"))
    rng = np.random.default_rng(0)
    scored = testing.write_scored_set(str(d / "scored"), TEXTS, rng.normal(size=(len(TEXTS), 2)),
                                      rng.normal(size=(len(TEXTS), 8)), labels=[i % 2 for i in range(len(TEXTS))],
                                      extra_metadata={"teacher_id": teacher})
    return {"train": str(d / "train.tsv"), "dev": str(d / "dev.tsv"), "teacher": teacher, "scored": scored}


def _command(name, files, out):
    return {
        "augment": ["augment", "--input", files["train"], "--output", out, "--n-iter", "1"],
        "teacher": ["teacher", "--train", files["train"], "--dev", files["dev"], "--output", out,
                    "--model", files["teacher"], "--epochs", "1"],
        "train": ["train", "--transfer", files["scored"], "--dev", files["dev"], "--output", out, "--tokens", "words",
                  "--embed-init", "random", "--epochs", "1", "--no-progress"],
        "run": ["run", "--data", files["train"], f"run_dir={out}", f"teacher.model={files['teacher']}"],
        "init": ["init", "--data", files["train"], "--output", os.path.join(out, "my.yaml")],
    }[name]


@pytest.mark.parametrize("inside", ["the folder", "below it"])
@pytest.mark.parametrize("name", ["augment", "teacher", "train", "run", "init"])
def test_an_output_in_a_folder_that_cannot_be_written_is_one_line_exit_2(name, inside, files, locked_folder,
                                                                         capsys):
    # the output is the unwritable folder itself (init: a file in it), or a folder to be made in it
    out = str(locked_folder) if inside == "the folder" else str(locked_folder / "new" / "out")
    rc = main(_command(name, files, out))
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith(f"transferset {name}: error:")]
    assert rc == 2, err[-2000:]
    assert "Traceback" not in err and len(lines) == 1, err[-2000:]
    assert lines[0].startswith(f"transferset {name}: error: {out if name != 'init' else os.path.join(out, 'my.yaml')}"
                               f" cannot be written: {locked_folder} does not let this user write in it ")
    assert "choose a folder you can write" in lines[0]
    assert os.listdir(locked_folder) == []  # nothing half-written
