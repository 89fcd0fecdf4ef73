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
