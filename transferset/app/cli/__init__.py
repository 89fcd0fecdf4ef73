"""`transferset` command line: one subcommand per stage.

Subcommand modules are imported only when selected, so `transferset --help` stays
fast and the library never imports Apache Beam unless a pipeline is run. Each module
provides `add_arguments(parser)` and `run(args, extra) -> int`; `extra` holds the
arguments the subcommand did not declare (Beam pipeline options for pipelines).
"""
from __future__ import annotations

import argparse
import importlib
import logging
import os
import re
import sys
from typing import Optional, Sequence

from transferset import __version__, fs
from transferset.runtime.errors import ConfigError
from transferset.runtime.errors import UserError

# name -> (module, one-line help, passes unknown args through as Beam options)
COMMANDS = {
    "augment": ("transferset.app.cli.augment", "build a transfer set from labeled and unlabeled text (Apache Beam)", True),
    "inspect": ("transferset.app.cli.inspect", "print a JSON summary of a transfer set directory", False),
    "teacher": ("transferset.app.cli.teacher", "fine-tune a Hugging Face encoder as the teacher", False),
    "score": ("transferset.app.cli.score", "score a transfer set once with the teacher; cache logits and hidden states (Apache Beam)", True),
    "train": ("transferset.app.cli.train", "train a student from the cached teacher outputs", False),
    "evaluate": ("transferset.app.cli.evaluate", "accuracy of a trained student (and agreement with the teacher)", False),
    "predict": ("transferset.app.cli.predict", "label files with a student, a Hugging Face classifier or an ONNX export "
                "(in-process, or Apache Beam for large inputs)", True),
    "export": ("transferset.app.cli.export", "export a student (or any Hugging Face classifier) to ONNX", False),
    "prune": ("transferset.app.cli.prune", "remove a BERT model's least important attention heads, then recover by "
              "distillation from the cached logits", False),
    "exits": ("transferset.app.cli.exits", "train FastBERT's early exits of a frozen teacher or transformer student "
              "(then evaluate / predict --speed)", False),
    "run": ("transferset.app.run.runner", "run the whole chain: teacher, transfer set, scores, students, report "
            "(--data FILE, or a YAML config)", False),
    "init": ("transferset.app.run.init", "write a commented starter run config for your own data", False),
    "migrate": ("transferset.app.migrate", "convert a run folder written by an earlier transferset, so `run` "
                "reuses its finished stages", False),
}

# Path-like arguments of each command (argparse dest names), normalised once here before dispatch
# (transferset.fs.normalize): file:// URLs become local paths, an unknown URL scheme is a usage error.
# Settings that may name a local directory (a base model, a tokenizer) are included: hub names pass as they are.
PATH_ARGS = {
    "augment": ("input", "unlabeled", "exclude", "output", "mlm_model"),
    "inspect": ("directory",),
    "teacher": ("train", "dev", "output", "model"),
    "score": ("input", "teacher", "output"),
    "train": ("transfer", "dev", "output", "config", "teacher", "tokenizer"),
    "evaluate": ("model", "data"),
    "run": ("config", "data", "dev", "test"),
    "init": ("data", "dev", "test", "output"),
    "migrate": ("run_dir", "config"),
    "predict": ("model", "input", "output"),
    "export": ("model", "output"),
    "prune": ("model", "selection", "transfer", "output"),
    "exits": ("model", "scored", "output"),
}
POSITIONAL_NAMES = {"directory": "OUT"}


def normalize_paths(name: str, args: argparse.Namespace, schemes: Sequence[str] = ()) -> None:
    """Every path-like argument of command `name` in its one internal form (see PATH_ARGS).

    `schemes`: URL schemes the command reaches besides fsspec's (the pipelines: Beam's filesystems).
    """
    for dest in PATH_ARGS.get(name, ()):
        value = getattr(args, dest, None)
        option = POSITIONAL_NAMES.get(dest) or "--" + dest.replace("_", "-")
        if isinstance(value, str):
            setattr(args, dest, fs.normalize(value, option, schemes=schemes))
        elif isinstance(value, list):
            setattr(args, dest, [fs.normalize(v, option, schemes=schemes) for v in value])


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    pass


def _top_parser() -> argparse.ArgumentParser:
    lines = [f"  {name:<10} {help_}" for name, (_, help_, _) in COMMANDS.items()]
    parser = argparse.ArgumentParser(
        prog="transferset",
        description="Knowledge distillation for text classifiers: augment → score → train.",
        epilog="commands:\n" + "\n".join(lines) + "\n\nRun `transferset COMMAND --help` for a command's options.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"transferset {__version__}")
    parser.add_argument("command", nargs="?", choices=list(COMMANDS), metavar="COMMAND")
    return parser


def build_subparser(name: str):
    module_name, help_, passthrough = COMMANDS[name]
    module = importlib.import_module(module_name)
    epilog = getattr(module, "EPILOG", None)
    if passthrough:
        extra = "Any Apache Beam pipeline option is passed through, e.g. --runner FnApiRunner --direct_num_workers 2."
        epilog = f"{epilog}\n\n{extra}" if epilog else extra
    parser = argparse.ArgumentParser(prog=f"transferset {name}", description=help_, epilog=epilog,
                                     formatter_class=_Formatter)
    module.add_arguments(parser)
    return module, parser, passthrough


# A value that starts with '-' but is a number or a list of numbers: -1,2,3 (--layer-map), -0.5, -inf.
_NEGATIVE_VALUE = re.compile(r"^-(\d|\.\d|inf|nan)", re.IGNORECASE)


def join_negative_values(parser: argparse.ArgumentParser, argv: Sequence[str]) -> list[str]:
    """`--flag -1,2,3` as `--flag=-1,2,3` for a flag of `parser` that takes a value: argparse reads a word that
    starts with '-' as an option unless it is a plain negative number, so `--layer-map -1,2,3` was "expected one
    argument" (the flag's value cannot be an option anyway)."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        action = parser._option_string_actions.get(word) if word.startswith("-") and "=" not in word else None
        if action is not None and action.nargs != 0 and i + 1 < len(argv) and _NEGATIVE_VALUE.match(argv[i + 1]):
            out.append(f"{word}={argv[i + 1]}")
            i += 2
            continue
        out.append(word)
        i += 1
    return out


class _DropNoise(logging.Filter):
    # Printed on every Beam import when the GCP extras are absent; irrelevant to local runs.
    def filter(self, record: logging.LogRecord) -> bool:
        return "apitools not found" not in record.getMessage()


def _quiet_logging() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(_DropNoise())
    # Our own INFO lines (the inferred label set, the teacher's forward path) are worth a line each.
    logging.getLogger("transferset").setLevel(logging.INFO)
    if not sys.stderr.isatty():
        # transformers' "Loading weights" / "Writing model shards" bars are noise in a log file (our own
        # progress lines are not bars off a terminal either); on a terminal they stay.
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # read when transformers is imported
        if "transformers" in sys.modules:  # already imported (cli.main called in-process)
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()


def close_process_group() -> None:
    """After a command that ran under torchrun / accelerate launch finished: destroy its process group. Left to
    interpreter exit, Gloo's threads can abort the process (SIGABRT, "terminate called without an active
    exception": pytorch/pytorch#190489) after the work is done, so a finished run exits non-zero. Only on
    success: a rank that failed must not wait in a collective teardown for the others."""
    dist = sys.modules.get("torch.distributed")  # a command that never trained never imported it
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    top = _top_parser()
    if not argv or argv[0] not in COMMANDS:
        top.parse_args(argv[:1] if argv else ["--help"])
        return 2
    name, rest = argv[0], argv[1:]
    _quiet_logging()
    # torch's OpenMP threads wait for work without spinning on a core, unless the environment says otherwise:
    # beside other processes a spinning thread holds the core its own work needs (benchmarks/omp_wait.py: a
    # teacher step 1.8x faster beside two busy one-thread jobs, 1 % slower alone). Read when torch loads.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    module, parser, passthrough = build_subparser(name)
    rest = join_negative_values(parser, rest)
    # intermixed: `run --config X key=v --budget-ms 1 key2=v2` takes both settings, wherever they stand
    if passthrough:
        args, extra = parser.parse_known_intermixed_args(rest)
    else:
        args, extra = parser.parse_intermixed_args(rest), []
    try:
        if extra:
            # Beam drops a flag it does not know with a log line: a typo (--n-iterr) or a second file after
            # a single-path option would otherwise run with the default or the file unread.
            from pipelines.runtime import check_beam_args

            check_beam_args(extra, known=[o for o in parser._option_string_actions if o.startswith("--")],
                            command=name)
        normalize_paths(name, args, getattr(module, "URL_SCHEMES", lambda: ())())
        rc = int(module.run(args, extra) or 0)
        close_process_group()
        return rc
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except ConfigError as exc:  # a usage error: exit 2, as argparse does; a setting's earlier spelling says its own
        from transferset.app.migrate.spellings import explain

        print(f"transferset {name}: error: {explain(str(exc))}", file=sys.stderr)
        return 2
    except UserError as exc:
        print(f"transferset {name}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
