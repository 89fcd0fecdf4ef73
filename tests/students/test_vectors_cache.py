"""The contextual vectors' cache ($TRANSFERSET_CACHE/vectors, embed_init: contextual) only saves a pass of the teacher:
a cache that cannot be written costs that pass, said in one line, and a kept file that is not this table (another
shape, not a tensor, values that are not finite) is made again, naming the file, as an unreadable one is."""
import os
import subprocess

import pytest
import torch

from transferset import testing
from transferset.app.cli import main


@pytest.fixture(scope="module")
def contextual_config(tmp_path_factory) -> str:
    return testing.write_student_config(str(tmp_path_factory.mktemp("contextual") / "cfg.yaml"), report={"latency_examples": 8},
                                        vocab={"embed_init": "contextual"})


def _train(tiny_scored_dir, sst2_dev200, out, config, capsys):
    rc = main(["train", "--transfer", tiny_scored_dir, "--dev", sst2_dev200, "--output", str(out), "--config", config,
               "--epochs", "1", "--no-progress"])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return rc, err


def _said(err: str, words: str) -> list[str]:
    return [line for line in err.splitlines() if words in line]


@pytest.fixture
def unwritable_cache(request, tmp_path, monkeypatch):
    """→ a TRANSFERSET_CACHE no file can be written under: a path that names a file, or a folder made immutable
    (chattr +i: root writes through chmod's read-only bits)."""
    if request.param == "a file":
        cache = tmp_path / "cache-file"
        cache.write_text("not a folder")
    else:
        cache = tmp_path / "cache"
        cache.mkdir()
        if subprocess.run(["chattr", "+i", str(cache)], capture_output=True).returncode != 0:
            os.chmod(cache, 0o555)

        def writable_again():  # or pytest cannot remove its temporary folders
            subprocess.run(["chattr", "-i", str(cache)], capture_output=True)
            os.chmod(cache, 0o755)
        request.addfinalizer(writable_again)
        try:
            (cache / "probe").write_text("")
            pytest.skip("this machine lets the test write into a read-only folder (neither chattr nor chmod holds)")
        except OSError:
            pass
    monkeypatch.setenv("TRANSFERSET_CACHE", str(cache))
    return cache


@pytest.mark.parametrize("unwritable_cache", ["a file", "a read-only folder"], indirect=True)
def test_a_cache_that_cannot_be_written_costs_only_its_time(tmp_path, tiny_scored_dir, sst2_dev200,
                                                            contextual_config, unwritable_cache, capsys):
    rc, err = _train(tiny_scored_dir, sst2_dev200, tmp_path / "o", contextual_config, capsys)
    assert rc == 0, err
    line, = _said(err, "the table is not kept")
    assert line.startswith(f"embed_init contextual: the table is not kept in {unwritable_cache / 'vectors'} (") \
           and "the next student on these texts makes it again; point TRANSFERSET_CACHE at a folder" in line, line
    assert (tmp_path / "o" / "model").is_dir()


@pytest.mark.parametrize("damage, says", [
    ("shape", "holds a tensor of shape (5, 3)"),
    ("not a tensor", "holds a dict, not a tensor"),
    ("nan", "values that are not finite"),
])
def test_a_kept_file_that_is_not_the_table_is_made_again(tmp_path, tiny_scored_dir, sst2_dev200, contextual_config,
                                                         monkeypatch, damage, says, capsys):
    monkeypatch.setenv("TRANSFERSET_CACHE", str(tmp_path / "cache"))
    rc, err = _train(tiny_scored_dir, sst2_dev200, tmp_path / "first", contextual_config, capsys)
    assert rc == 0, err
    kept, = (tmp_path / "cache" / "vectors").iterdir()
    table = torch.load(kept, weights_only=True)
    torch.save({"shape": torch.zeros(5, 3), "not a tensor": {"rows": 5}, "nan": torch.full_like(table, float("nan"))
                }[damage], kept)

    rc, err = _train(tiny_scored_dir, sst2_dev200, tmp_path / "again", contextual_config, capsys)
    assert rc == 0, err
    line, = _said(err, str(kept))
    assert says in line and line.endswith("made again"), line
    assert not _said(err, "reused from")
    assert torch.equal(torch.load(kept, weights_only=True), table)  # written over with the table these inputs make
