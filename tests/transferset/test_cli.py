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
