import logging

import pytest

from transferset.app.cli import COMMANDS, main


def test_top_level_help_lists_every_command(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for name in COMMANDS:
        assert name in out


@pytest.mark.parametrize("name", list(COMMANDS))
def test_subcommand_help(name, capsys):
    with pytest.raises(SystemExit) as exc:
        main([name, "--help"])
    assert exc.value.code == 0
    assert f"usage: transferset {name}" in capsys.readouterr().out


def test_unknown_command_and_bad_ops_are_clear(capsys, tmp_path):
    with pytest.raises(SystemExit):
        main(["agument"])
    assert "invalid choice: 'agument'" in capsys.readouterr().err
    src = tmp_path / "a.tsv"
    src.write_text("sentence\tlabel\nx\t0\n")
    assert main(["augment", "--input", str(src), "--output", str(tmp_path / "o"), "--ops", "mask,swap"]) == 2
    assert "unknown augmenter 'swap'; known: mask, mlm, ngram, pos" in capsys.readouterr().err
    assert main(["augment", "--input", str(tmp_path / "missing.tsv"), "--output", str(tmp_path / "o")]) == 1
    assert "missing.tsv: no such file" in capsys.readouterr().err


def test_no_transformers_bars_in_a_log_file_but_the_result_is_there(tiny_teacher, tmp_path):
    """Off a terminal (stderr to a file), loading a model prints no "Loading weights" bar."""
    import os
    import subprocess
    import sys

    data = tmp_path / "d.tsv"
    data.write_text("sentence\tlabel\na fine film\t1\na dull mess\t0\n")
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_DISABLE_PROGRESS_BARS"}
    out = subprocess.run([sys.executable, "-c", "from transferset.app.cli import main; raise SystemExit(main())",
                          "evaluate", "--model", tiny_teacher, "--data", str(data)],
                         capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert "accuracy" in out.stdout + out.stderr
    assert "Loading weights" not in out.stderr and "it/s]" not in out.stderr


@pytest.mark.parametrize("command", ["augment", "predict", "teacher"])
def test_an_hf_input_that_does_not_load_stops_before_any_output(command, tmp_path, capsys, monkeypatch):
    """Issue 25 item 9: `hf:` on a folder of non-UTF-8 files was a traceback that left a partial output;
    an unknown dataset offline a ConnectionError traceback."""
    import datasets
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    # `datasets` binds its log handler to the sys.stderr of its first use, a test's captured stream closed
    # since: without it, its own error line ("Failed to read file ...") reaches this test's stderr.
    monkeypatch.setattr(logging.getLogger("datasets"), "handlers", [])
    d = tmp_path / "latin1"
    d.mkdir()
    (d / "train.csv").write_bytes("sentence,label\nun café noir,1\n".encode("latin-1"))
    for source, says in ((f"hf:{d}:train", "are not UTF-8 text"),
                         ("hf:nosuch-user/nosuch-set:train", "the Hugging Face Hub cannot be reached")):
        out = tmp_path / f"out-{len(says)}"
        args = {"augment": ["augment", "--input", source, "--output", str(out)],
                "predict": ["predict", "--model", str(tmp_path / "no-model"), "--input", source, "--output", str(out)],
                "teacher": ["teacher", "--train", source, "--dev", source, "--output", str(out)]}[command]
        assert main(args) == 1
        err = capsys.readouterr().err
        assert says in err and "Traceback" not in err, err
        assert not out.exists()
