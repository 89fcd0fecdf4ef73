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
    assert "unknown augmenter 'swap'; known: join, mask, mlm, ngram, pos" in capsys.readouterr().err
    assert main(["augment", "--input", str(tmp_path / "missing.tsv"), "--output", str(tmp_path / "o")]) == 1
    assert "missing.tsv: no such file" in capsys.readouterr().err


@pytest.mark.parametrize("given, expected", [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_a_command_makes_openmp_threads_wait_without_spinning_unless_told(monkeypatch, tmp_path, given, expected):
    import os

    monkeypatch.setenv("OMP_WAIT_POLICY", "placeholder")  # recorded, so the test's change is undone after it
    if given is None:
        monkeypatch.delenv("OMP_WAIT_POLICY")
    else:
        monkeypatch.setenv("OMP_WAIT_POLICY", given)
    assert main(["inspect", str(tmp_path / "missing")]) != 0
    assert os.environ["OMP_WAIT_POLICY"] == expected


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


def _head(src, dst, n):
    with open(src, encoding="utf-8") as fh:
        dst.write_text("".join(fh.readlines()[:n + 1]))
    return str(dst)


def test_augment_reads_every_input_given_after_one_flag(sst2_dir, tmp_path, capsys):
    """`--input T.tsv D.tsv` reads both files, not T alone: stats.json counts each file's rows, none dropped."""
    import json

    t = _head(sst2_dir / "train.tsv", tmp_path / "T.tsv", 5)
    d = _head(sst2_dir / "dev.tsv", tmp_path / "D.tsv", 3)
    out = tmp_path / "out"
    assert main(["augment", "--input", t, d, "--output", str(out), "--n-iter", "0"]) == 0
    stats = json.loads((out / "stats.json").read_text())
    # Each row's file is recorded: the per-file counts, and rejects carry file and line.
    assert stats["inputs"] == {t: {"accepted": 5, "rejected": 0}, d: {"accepted": 3, "rejected": 0}}
    assert stats["output_rows"] == 8


@pytest.mark.parametrize("command, args, says", [
    ("augment", ["--n-iterr", "0"], "unrecognized arguments: --n-iterr 0 (neither a `transferset augment` option "
                                    "nor an Apache Beam pipeline option; did you mean --n-iter?)"),
    ("augment", ["--direct_running_mode", "bogus"], "argument --direct_running_mode: invalid choice: 'bogus'"),
    ("score", ["--teacher", "T", "stray.tsv"], "unrecognized arguments: stray.tsv"),
    ("score", ["--teacher", "T", "--batch-sise", "8"], "did you mean --batch-size?"),
])
def test_arguments_neither_we_nor_beam_know_are_refused_before_anything_runs(command, args, says, tmp_path, capsys):
    """A misspelt option (`--n-iterr 0`) or a stray path is one line, exit 2, before any output: never ignored
    while the command runs on with its defaults."""
    src = tmp_path / "a.tsv"
    src.write_text("sentence\tlabel\nx\t0\n")
    out = tmp_path / "o"
    assert main([command, "--input", str(src), "--output", str(out), *args]) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


def test_beam_pipeline_options_still_pass_through():
    from pipelines.runtime import check_beam_args

    check_beam_args(["--direct_num_workers", "2", "--project=p", "--temp_location", "gs://b/t", "--save_main_session"])


@pytest.mark.parametrize("runner", ["NoSuchRunner", "FnApi Runner", "apache_beam.runners.NoSuch"])
def test_a_runner_beam_cannot_create_is_refused_listing_the_known_ones(runner, tmp_path, capsys):
    """A --runner Beam cannot create is one line listing the known runners, not a 19-41-line Beam traceback."""
    src = tmp_path / "a.tsv"
    src.write_text("sentence\tlabel\nx\t0\n")
    out = tmp_path / "o"
    assert main(["augment", "--input", str(src), "--output", str(out), "--runner", runner]) == 2
    err = capsys.readouterr().err
    assert f"--runner {runner!r}: not a Beam runner; known: " in err and "FnApiRunner" in err, err
    assert len(err.strip().splitlines()) == 1 and not out.exists()


@pytest.mark.parametrize("runner", ["FnApiRunner", "fnapirunner", "DirectRunner", "direct", "DataflowRunner",
                                    "apache_beam.runners.portability.fn_api_runner.FnApiRunner"])
def test_runner_names_beam_accepts_pass(runner):
    from pipelines.runtime import check_runner

    check_runner(runner)


@pytest.mark.parametrize("command", ["augment", "predict", "teacher"])
def test_an_hf_input_that_does_not_load_stops_before_any_output(command, tmp_path, capsys, monkeypatch):
    """An `hf:` input that does not load (a folder of non-UTF-8 files, an unknown dataset offline) is an error
    without a traceback, and no output, not even a partial one, is left."""
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
    for source, says, rc in ((f"hf:{d}:train", "are not UTF-8 text", 1),
                             ("hf:nosuch-user/nosuch-set:train", "HF_HUB_OFFLINE is set with no copy of it", 2)):
        out = tmp_path / f"out-{len(says)}"
        args = {"augment": ["augment", "--input", source, "--output", str(out)],
                "predict": ["predict", "--model", str(tmp_path / "no-model"), "--input", source, "--output", str(out)],
                "teacher": ["teacher", "--train", source, "--dev", source, "--output", str(out)]}[command]
        assert main(args) == rc
        err = capsys.readouterr().err
        assert says in err and "Traceback" not in err, err
        assert not out.exists()


@pytest.fixture
def hub_off(monkeypatch):
    """HF_HUB_OFFLINE set, as a user sets it on a machine without network; an empty cache of hub models."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", "/nonexistent-hub-cache")
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", "/nonexistent-hub-cache")


@pytest.mark.parametrize("args, says", [
    (["teacher", "--train", "T", "--dev", "T", "--model", "nosuchorg/nosuchmodel"], "--model nosuchorg/nosuchmodel"),
    (["augment", "--input", "T", "--recipe", "tinybert"], "--mlm-model bert-base-uncased"),
    (["augment", "--input", "T", "--ops", "mlm", "--mlm-model", "nosuchorg/mlm"], "--mlm-model nosuchorg/mlm"),
    (["augment", "--input", "T", "--unlabeled", "hf:nosuchorg/nosuchds:train"],
     "--unlabeled=hf:nosuchorg/nosuchds:train: the dataset nosuchorg/nosuchds"),
    (["score", "--input", "T", "--teacher", "nosuchorg/nosuchmodel"], "--teacher nosuchorg/nosuchmodel"),
    (["evaluate", "--model", "nosuchorg/nosuchmodel", "--data", "T"], "--model nosuchorg/nosuchmodel"),
    (["predict", "--model", "nosuchorg/nosuchmodel", "--input", "T"], "--model nosuchorg/nosuchmodel"),
    (["export", "--model", "nosuchorg/nosuchmodel"], "--model nosuchorg/nosuchmodel"),
    (["exits", "--model", "nosuchorg/nosuchmodel", "--scored", "T"], "--model nosuchorg/nosuchmodel"),
    (["prune", "--model", "nosuchorg/nosuchmodel", "--selection", "T"], "--model nosuchorg/nosuchmodel"),
    (["train", "--transfer", "T", "--dev", "hf:nosuchorg/nosuchds:validation"],
     "--dev=hf:nosuchorg/nosuchds:validation: the dataset nosuchorg/nosuchds"),
])
def test_a_hub_name_that_cannot_load_offline_is_one_line_before_any_output(args, says, tmp_path, capsys, hub_off):
    """Offline, a hub name with no cached copy (`teacher --model nosuchorg/nosuchmodel`, the default MLM of
    `augment --recipe tinybert`) is one line saying HF_HUB_OFFLINE is set, exit 2, before any output: no retries,
    no OSError or Beam traceback."""
    data = tmp_path / "t.tsv"
    data.write_text("sentence\tlabel\na good film\t1\na dull film\t0\n")
    out = tmp_path / "out"
    rc = main([str(data) if a == "T" else a for a in args] + (["--output", str(out)] if args[0] != "evaluate" else []))
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert f"transferset {args[0]}: error: {says}" in err, err
    assert "HF_HUB_OFFLINE is set" in err and "unset HF_HUB_OFFLINE" in err, err
    assert not out.exists()


def test_a_flag_value_that_starts_with_a_minus_needs_no_equals_sign():
    """`--layer-map -1,2,3` needs no `=`: argparse alone reads -1,2,3 as an option ("expected one argument")."""
    from transferset.app.cli import build_subparser, join_negative_values

    _, parser, _ = build_subparser("train")
    argv = ["--transfer", "T", "--dev", "D", "--output", "O", "--layer-map", "-1,2,3", "--lr", "-0.5", "--no-resume"]
    assert join_negative_values(parser, argv)[6:] == ["--layer-map=-1,2,3", "--lr=-0.5", "--no-resume"]
    args = parser.parse_args(join_negative_values(parser, argv))
    assert (args.layer_map, getattr(args, "optim.lr")) == ("-1,2,3", "-0.5")  # a section's field: its dest
    with pytest.raises(SystemExit):  # what the join is for
        parser.parse_args(argv)
    _, parser, _ = build_subparser("score")  # a flag given twice (append) and a Beam option it does not declare
    assert join_negative_values(parser, ["--teacher", "-a", "--direct_num_workers", "-1"]) == \
        ["--teacher", "-a", "--direct_num_workers", "-1"]


def test_run_takes_settings_on_both_sides_of_an_option(monkeypatch):
    from transferset.app import cli

    module, _, _ = cli.build_subparser("run")
    seen = {}
    monkeypatch.setattr(module, "run", lambda args, extra: seen.update(vars(args), extra=extra) or 0)
    assert cli.main(["run", "--config", "c.yaml", "run_dir=r", "--budget-ms", "5", "search.int8=false"]) == 0
    assert seen["overrides"] == ["run_dir=r", "search.int8=false"] and seen["budget_ms"] == 5.0
    assert seen["extra"] == []
