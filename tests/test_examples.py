"""Every example command line runs as written: each line starting with `transferset COMMAND` in a command's
`--help`, in docs/*.md and in README.md (code blocks, and inline code) is parsed by that command's own parser, as
cli.main does (negative values, Beam's pass-through options checked), and its settings are built through the real
settings layer (flags over --config, key=value overrides; `run`'s and `init`'s columns against a tiny file), so an
unknown flag, an unknown key or a bad value fails here. Nothing runs a stage. (`lr=5e-4` in `train --help` was
refused by the settings layer: `optim.lr=` is the key.)

How a line is read (`words`):
- a line ending in a backslash goes on with the next one; `# ...` is a comment;
- the usage synopses' `[--flag VALUE]` is taken as written without its brackets, `a|b|c` as its first choice `a`,
  and `...` (more of the same) is dropped;
- an inline span may name a command and a few of its flags only (`transferset score --combine mean`): the required
  options it leaves out are filled in from FILL, the ones a code line must give itself; with --help it only names
  the command;
- PLACEHOLDERS stands in for the names that stand for a value (FILE, YAML, N...) and for the few files something
  reads (the data `run` and `init` check for their columns, a --config YAML); per command where the command
  reads them differently (`train --config YAML`: a student's settings; `run --config YAML`: a run config).
  Every other path (an output, a model the command would load) is only parsed, so it stays as written, and a
  bucket's data (gs://) is not opened for its columns.
Lines run from the repository root, as the docs' relative paths (configs/demo.yaml, ../shared/data/sst2) say.
"""
from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
COMMAND_LINE = re.compile(r"^transferset (augment|inspect|teacher|score|train|evaluate|predict|export|prune|exits|run|"
                          r"init|migrate)(\s|$)")
INLINE = re.compile(r"`(transferset [^`]+)`")
NO_EXAMPLES = {"inspect", "evaluate", "migrate"}  # the commands whose --help shows no example line

# What a placeholder stands for: a key of `files` (the tiny fixtures below), or the value itself.
PLACEHOLDERS = {
    "FILE": "train", "T": "train", "D": "dev", "reviews.csv": "reviews", "path/to/sst2": "folder",
    "YAML": "run_yaml", "my.yaml": "run_yaml", "student.yaml": "student_yaml", "SECTION": "student_yaml",
    "C": "student_yaml",
    "S": "0", "N": "2", "W": "2", "B": "5", "X": "1e-3", "K": "0",
}
PER_COMMAND = {("train", "YAML"): "student_yaml", ("train", "FILE"): "student_yaml", ("init", "my.yaml"): "init_output",
               ("init", "YAML"): "init_output"}
# The required options of each command, for an inline span that leaves them out (a positional: flag None).
FILL = {
    "augment": [("--input", "D"), ("--output", "OUT")],
    "inspect": [(None, "OUT")],
    "teacher": [("--train", "T"), ("--dev", "D"), ("--output", "OUT")],
    "score": [("--input", "OUT"), ("--teacher", "M"), ("--output", "OUT2")],
    "train": [("--transfer", "OUT"), ("--dev", "D"), ("--output", "OUT2")],
    "evaluate": [("--model", "M"), ("--data", "D")],
    "predict": [("--model", "M"), ("--input", "D"), ("--output", "OUT")],
    "export": [("--model", "M"), ("--output", "OUT")],
    "prune": [("--model", "M"), ("--selection", "D"), ("--transfer", "OUT"), ("--output", "OUT2")],
    "exits": [("--model", "M"), ("--scored", "OUT"), ("--output", "OUT2")],
    "run": [("--config", "configs/demo.yaml")],  # unless --data is given
    "init": [("--data", "FILE"), ("--output", "my.yaml")],
    "migrate": [(None, "RUN")],
}


def _lines(text: str, inline: bool) -> list[tuple[int, str, bool]]:
    """(line number, command line, from inline code) of every example in a Markdown page or a help text."""
    found, in_code, lines = [], not inline, text.splitlines()
    i = 0
    while i < len(lines):
        number, line = i + 1, lines[i].strip()
        if inline and line.startswith("```"):
            in_code = not in_code
        elif in_code and COMMAND_LINE.match(line):
            while line.endswith("\\") and i + 1 < len(lines):
                i += 1
                line = line[:-1].rstrip() + " " + lines[i].strip()
            found.append((number, line, False))
        elif inline and not in_code:
            found += [(number, m.group(1), True) for m in INLINE.finditer(lines[i]) if COMMAND_LINE.match(m.group(1))]
        i += 1
    return found


def _doc_examples() -> list:
    return [pytest.param(line, inline, id=f"{page.name}:{number}")
            for page in [*sorted(DOCS.glob("*.md")), REPO / "README.md"]
            for number, line, inline in _lines(page.read_text(encoding="utf-8"), inline=True)]


def _value(word: str, name: str, files: dict) -> str:
    key = PER_COMMAND.get((name, word), PLACEHOLDERS.get(word))
    return files.get(key, key) if key is not None else word


def words(line: str, inline: bool, files: dict) -> tuple[str, list[str]]:
    """The command and its arguments as `transferset` would get them, placeholders replaced (module docstring)."""
    tokens = shlex.split(line.replace("[", " ").replace("]", " "), comments=True)
    name, argv = tokens[1], []
    for word in tokens[2:]:
        if word == "...":
            continue
        word = word.split("|")[0]
        if "=" in word:  # key=value and --flag=value: the value may be a placeholder
            key, value = word.split("=", 1)
            word = f"{key}={_value(value, name, files)}"
        else:
            word = _value(word, name, files)
        argv.append(word)
    if inline:
        given = {w.split("=")[0] for w in argv if w.startswith("--")}
        bare = [w for w in argv if not w.startswith("-") and "=" not in w]
        for flag, value in FILL[name]:
            if flag is None and not bare:
                argv.append(_value(value, name, files))
            elif flag is not None and flag not in given and not (name == "run" and "--data" in given):
                argv += [flag, _value(value, name, files)]
    return name, argv


def settings(name: str, args, extra: list[str]) -> None:
    """The command's settings from its parsed arguments, through the settings layer its `run` uses."""
    from transferset import fs
    from transferset.app.cli import flags, train
    from transferset.app.run import init, runner
    from transferset.augment import check_ops
    from transferset.config import (AugmentConfig, BeamConfig, ExitsConfig, PredictConfig, PruneConfig, ScoreConfig,
                                    TeacherConfig)
    from transferset.runtime import typed

    from pipelines.runtime import check_beam

    if name == "train":
        train.load_config(args)
    elif name == "run":
        data = {"data": args.data, **init.data_kwargs(args)} if args.data else None
        minutes = [f"budget_minutes={args.budget_minutes}"] if args.budget_minutes is not None else []
        cfg = runner.load_config(args.config, [*args.overrides, *runner.budget_overrides(args), *minutes], data)
        if not fs.is_remote(cfg.data or ""):  # a bucket's columns need its backend and credentials
            init.check_data(cfg)
        runner.check_engines(cfg)
    elif name == "init":
        assert init.run(args, extra) == 0
    elif name == "migrate":
        runner.load_overridden(typed.read_yaml(args.config or "configs/demo.yaml"), args.overrides, "migrate")
    for cls in {"augment": (AugmentConfig,), "teacher": (TeacherConfig,), "score": (ScoreConfig,),
                "predict": (PredictConfig,), "prune": (PruneConfig,), "exits": (ExitsConfig,)}.get(name, ()):
        cfg = flags.from_args(cls, args)
        if cls is AugmentConfig:
            check_ops(cfg)
    if name in ("augment", "score", "predict"):
        check_beam(flags.from_args(BeamConfig, args), extra, where="--")


def check(line: str, inline: bool, files: dict) -> None:
    """Parse `line` as cli.main does, then build its settings; a usage error fails with the line and the reason."""
    from transferset.app import cli
    from transferset.runtime.errors import UserError

    from pipelines.runtime import check_beam_args

    name, argv = words(line, inline, files)
    module, parser, passthrough = cli.build_subparser(name)
    if "--help" in argv or "-h" in argv:  # `transferset train --help`: the command is there, its help prints
        return
    argv = cli.join_negative_values(parser, argv)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args, extra = (parser.parse_known_intermixed_args(argv) if passthrough
                           else (parser.parse_intermixed_args(argv), []))
        if extra:
            check_beam_args(extra, known=[o for o in parser._option_string_actions if o.startswith("--")], command=name)
        cli.normalize_paths(name, args, getattr(module, "URL_SCHEMES", lambda: ())())
        settings(name, args, extra)
    except SystemExit:
        pytest.fail(f"`{line}` does not parse ({' '.join(argv)}): {err.getvalue().strip()}")
    except UserError as exc:
        pytest.fail(f"`{line}` is refused ({' '.join(argv)}): {exc}")


@pytest.fixture
def files(tmp_path_factory, tmp_path, monkeypatch):
    """The tiny files the placeholders stand for; the examples run from the repository root."""
    d = tmp_path_factory.getbasetemp() / "example_files"
    if not d.exists():
        d.mkdir()
        rows = [("a charming , funny film", 1), ("dull and boring", 0), ("the best movie ever", 1), ("awful", 0)]
        body = "".join(f"{t}\t{y}\n" for t, y in rows)
        (d / "folder").mkdir()
        for path in (d / "train.tsv", d / "dev.tsv", d / "folder" / "train.tsv", d / "folder" / "dev.tsv"):
            path.write_text("sentence\tlabel\n" + body, encoding="utf-8")
        (d / "reviews.csv").write_text("id,review,sentiment\n" + "".join(
            f'{i},"{t}",{"pos" if y else "neg"}\n' for i, (t, y) in enumerate(rows)), encoding="utf-8")
        (d / "student.yaml").write_text(yaml.safe_dump({"student": "transformer", "epochs": 1}), encoding="utf-8")
        from transferset.app.run import init

        (d / "run.yaml").write_text(init.starter_yaml(str(d / "reviews.csv"), str(d / "run.yaml"), "transferset init",
                                                      text_column="review", label_column="sentiment"), encoding="utf-8")
    monkeypatch.chdir(REPO)
    return {"train": str(d / "train.tsv"), "dev": str(d / "dev.tsv"), "folder": str(d / "folder"),
            "reviews": str(d / "reviews.csv"), "student_yaml": str(d / "student.yaml"), "run_yaml": str(d / "run.yaml"),
            "init_output": str(tmp_path / "my.yaml")}


@pytest.mark.parametrize("line, inline", _doc_examples())
def test_every_example_in_the_docs_parses_and_its_settings_load(line, inline, files):
    check(line, inline, files)


@pytest.mark.parametrize("name", ["augment", "inspect", "teacher", "score", "train", "evaluate", "predict", "export",
                                  "prune", "exits", "run", "init", "migrate"])
def test_every_example_in_a_commands_help_parses_and_its_settings_load(name, files):
    from transferset.app import cli

    assert sorted(cli.COMMANDS) == sorted(FILL)  # a new command gets its FILL entry and is checked here
    _, parser, _ = cli.build_subparser(name)
    examples = _lines(parser.format_help(), inline=False)
    assert examples or name in NO_EXAMPLES, f"`transferset {name} --help` shows no example"
    for _, line, _ in examples:
        check(line, False, files)


def test_the_reader_takes_a_line_as_the_docstring_says(files):
    """The reading rules themselves, on a made-up synopsis and an inline span."""
    assert words("transferset teacher --train T --dev D --output runs/t [--lr X] [--forward auto|packed] ... "
                 "# and --seed 1", False, files) == (
        "teacher", ["--train", files["train"], "--dev", files["dev"], "--output", "runs/t", "--lr", "1e-3",
                    "--forward", "auto"])
    assert words("transferset train ... optim.lr=X --config SECTION", True, files) == (
        "train", ["optim.lr=1e-3", "--config", files["student_yaml"], "--transfer", "OUT", "--dev", files["dev"],
                  "--output", "OUT2"])
    assert words("transferset run --data FILE", True, files) == ("run", ["--data", files["train"]])
    assert [(n, inline) for n, _, inline in _lines("a `transferset run --plan` b\n```\ntransferset init --data x \\\n"
                                                   "  --output y\ntransferset run: error\n```\n", inline=True)] == [
        (1, True), (3, False)]
    with pytest.raises(pytest.fail.Exception, match=r"is refused .*lr"):
        check("transferset train --transfer s --dev D --output o lr=5e-4", False, files)
    with pytest.raises(pytest.fail.Exception, match=r"does not parse .*--no-such-flag"):
        check("transferset teacher --train T --dev D --output o --no-such-flag", False, files)
