"""`transferset init --data FILE --output my.yaml`: a commented starter run config for your own data.

The same settings are what `transferset run --data FILE` runs on when no YAML is given (`starter`):
the run config's defaults (transferset/config/), the data and its columns, and two students, those of
configs/demo.yaml (a BiLSTM on the gold labels only, and Tang et al.'s BiLSTM distilled from the teacher's
logits; on long texts, LONG_TEXT_WORDS, the distilled one max-pools as the other does), so the report shows what
distillation adds on your data. Columns are checked against the files
before anything is written: a missing one is refused with the list of those present.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import itertools
import os
import statistics
from typing import Any, Callable, Iterator, Optional, Sequence

import yaml

from transferset import fs
from transferset.config import RunConfig, ValidationConfig
from transferset.config.precedence import over
from transferset.runtime import typed
from transferset.runtime.errors import ConfigError
from transferset.sources import DEFAULT_LABEL_COLUMN, DEFAULT_TEXT_COLUMNS, HF_PREFIX, SourceError, detect_format
from transferset.sources import delimited, hf, jsonl, parquet
from transferset.sources.records import refuse_duplicate_columns, text_column_of

# The starter's students: configs/demo.yaml's two (tests/transferset/app/run/test_init.py keeps them equal), each
# the best of its kind on SST-2's validation split (benchmarks/README.md, quality per setting).
STARTER_STUDENTS: dict[str, dict[str, Any]] = {
    "labels_only": {"student": "bilstm", "phases": "joint", "losses": {"ce": 1.0}, "epochs": 8, "patience": 2,
                    "vocab": {"trim_vocab": True, "freeze_embeddings": False}},
    "distilled": {"student": "bilstm", "model": {"shape": "tang"}, "phases": "joint",
                  "losses": {"kd": {"weight": 1.0, "temperature": 2.0}}, "epochs": 5, "patience": 2},
}

# Texts of at least this many words (the median of the train file's first SAMPLE_ROWS rows) are long: there the
# distilled student takes the BiLSTM's default shape (300 units, max-pooled over the text, as the labels-only one)
# instead of Tang's (150, its last states): +0.5 to +1.2 on selection on the long proxy (~55 words) over 3 teachers
# and transfer sets (Tang's with max-pooling: +1.2 and -1.5), where on SST-2's sentences (~7) max-pooling was level
# (docs/results.md, "Where should a budget's minutes go?"; history.md, 2026-12-03)
LONG_TEXT_WORDS = 30
SAMPLE_ROWS = 1000

EPILOG = """examples:
  transferset init --data reviews.csv --text-column review --label-column sentiment --output my.yaml
  transferset run --config my.yaml
  transferset run --data reviews.csv --text-column review --label-column sentiment   # the same, no YAML"""

_READERS = {"tsv": delimited.rows, "csv": delimited.rows, "jsonl": jsonl.rows, "parquet": parquet.rows, "hf": hf.rows}


def is_data_folder(data: str) -> bool:
    """A folder holding train.tsv and dev.tsv (the `data:` of configs/*.yaml), not a file or an hf: split."""
    return not data.startswith(HF_PREFIX) and fs.isdir(data)


def columns_of(path: str) -> list[str]:
    """The column names of a data file (its header, its first JSON object, its schema or its features)."""
    fmt = detect_format(path)
    if fmt == "parquet":
        import pyarrow.parquet as pq

        with fs.open(path, "rb") as fh:
            names = list(pq.ParquetFile(fh).schema_arrow.names)
        refuse_duplicate_columns(path, names, "its schema")
        return names
    if fmt in ("tsv", "csv"):  # the header, even with no row under it
        return delimited.header(path, fmt, fs.open)
    row = _first(path, fmt, lambda r: isinstance(r, dict))
    return list(row) if row is not None else []


@contextlib.contextmanager
def _reading(path: str, fmt: str) -> Iterator[Iterator[Any]]:
    """The rows (a dict or a Reject each) the reader of `fmt` yields, closed when the block ends (a file of millions
    of rows is not read on)."""
    rows = _READERS[fmt](path, fmt, fs.open)
    try:
        yield (row for _, row in rows)
    finally:
        close = getattr(rows, "close", None)
        if close:
            close()


def _first(path: str, fmt: str, wanted: Callable[[Any], bool]) -> Any:
    """The first row (a dict or a Reject) the reader yields for which `wanted` holds, or None."""
    with _reading(path, fmt) as rows:
        return next((row for row in rows if wanted(row)), None)


def has_rows(path: str) -> bool:
    """Whether a data file holds at least one row (or line, readable or not) besides its header."""
    fmt = detect_format(path)
    if fmt == "parquet":
        import pyarrow.parquet as pq

        with fs.open(path, "rb") as fh:
            return pq.ParquetFile(fh).metadata.num_rows > 0
    return _first(path, fmt, lambda r: True) is not None


def check_columns(path: str, text_column: Optional[str], label_column: Optional[str], where: str = "") -> None:
    """Refuse a file that lacks the text or label column, naming it and listing the columns present, and a
    file with no rows."""
    try:
        present = columns_of(path)
        empty = not has_rows(path)
    except SourceError as exc:  # it says which file: `key=` names the setting, as the run's other checks do
        raise ConfigError(f"{where.removesuffix(': ')}={exc}" if where else str(exc)) from None
    listed = ", ".join(present) or "none"
    if empty:
        what = f"has a header ({listed}) but no data rows" if present else "is empty: no header, no rows"
        raise ConfigError(f"{where}{path} {what}; give a file with labeled rows")
    if not present:  # rows, but not one that parses (JSONL): its first problem says why
        bad = _first(path, detect_format(path), lambda r: True)
        raise ConfigError(f"{where}{path}: no row can be read to find its columns; line {bad.line}: {bad.reason}")
    if text_column and text_column not in present:
        raise ConfigError(f"{where}{path} has no text column {text_column!r}; its columns: {listed} "
                          "(choose one with --text-column)")
    if not text_column and not any(c in present for c in DEFAULT_TEXT_COLUMNS):
        raise ConfigError(f"{where}{path} has no {' or '.join(map(repr, DEFAULT_TEXT_COLUMNS))} column; its "
                          f"columns: {listed} (name the text column with --text-column)")
    if label_column and label_column not in present:
        raise ConfigError(f"{where}{path} has no label column {label_column!r}; its columns: {listed} "
                          "(choose one with --label-column)")


def train_file(data: str) -> str:
    """The train split of `data`: a file as it is, hf:NAME[:CONFIG] → hf:NAME[:CONFIG]:train."""
    return f"{data}:train" if data.startswith(HF_PREFIX) else data


def check_data(cfg) -> None:
    """Every data file of a run (RunConfig) holds the columns the run reads (its augment: section's, which the
    teacher's flags set alike): checked before the first stage. A data folder's files are checked too."""
    if not cfg.data:
        return
    cols = cfg.augment.column_kwargs()
    label = cols["label_column"]
    if is_data_folder(cfg.data):
        files = [("data", fs.join(cfg.data, "train.tsv")), *([] if cfg.dev else [("data", fs.join(cfg.data, "dev.tsv"))])]
    else:
        files = [("data", train_file(cfg.data))]
    files += [(k, getattr(cfg, k)) for k in ("dev", "test") if getattr(cfg, k)]
    for key, path in files:
        # a file that is not there is the run's own check to refuse (resolve_data names what a folder needs)
        if path.startswith(HF_PREFIX) or fs.exists(path):
            check_columns(path, cols["text_column"], label, where=f"{key}: ")


def data_settings(data: str, *, text_column: Optional[str] = None, label_column: Optional[str] = None,
                  dev: Optional[str] = None, test: Optional[str] = None) -> dict[str, Any]:
    """The run-config keys that the data flags set (a mapping to merge into a raw config).

    The teacher and the transfer set read the same columns; a train file with no dev file has the selection
    split carved from it (`validation:`, its defaults), as configs/demo.yaml carves it from SST-2's train."""
    raw: dict[str, Any] = {"data": data}
    if dev:
        raw["dev"] = dev
    if test:
        raw["test"] = test
    columns = {k: v for k, v in (("text_column", text_column), ("label_column", label_column)) if v}
    if columns:
        raw["teacher"] = dict(columns)
        raw["augment"] = dict(columns)
    if not dev and not is_data_folder(data) and not data.startswith(HF_PREFIX):
        raw["validation"] = {}
    return raw


def merge(base: dict, extra: dict) -> dict:
    """`extra`'s keys over `base`'s, section by section (a copy): the data flags over the file, in the order of
    transferset/config/precedence.py."""
    return over(base, extra)


def run_dir_for(data: str) -> str:
    """runs/NAME, NAME from the data's file or dataset name (reviews.csv → runs/reviews)."""
    name = data[len(HF_PREFIX):].split(":")[0] if data.startswith(HF_PREFIX) else data.rstrip("/")
    stem = os.path.splitext(os.path.basename(name))[0] or "run"
    return f"runs/{stem}"


def starter(data: str, **columns_and_files: Optional[str]) -> dict[str, Any]:
    """The starter run config for `data` (a raw mapping, type-checked by load_config): what `run --data`
    runs on without a YAML, and what `init` writes; on long texts (LONG_TEXT_WORDS) the distilled student takes the
    BiLSTM's default, max-pooled shape."""
    students = copy.deepcopy(STARTER_STUDENTS)
    words = median_words(data, columns_and_files.get("text_column"))
    if words is not None and words >= LONG_TEXT_WORDS:
        students["distilled"]["model"] = {}
    raw = merge({"run_dir": run_dir_for(data), "students": students}, data_settings(data, **columns_and_files))
    if raw.get("validation") == {}:  # spelled out, so the file shows what to change (the values: config.py's)
        raw["validation"] = typed.to_dict(ValidationConfig())
    return raw


def median_words(data: str, text_column: Optional[str]) -> Optional[float]:
    """The median words per row of the train file's first SAMPLE_ROWS rows (a data folder's train.tsv); None for a
    hub dataset or a file with no text to count."""
    if data.startswith(HF_PREFIX):
        return None
    path = fs.join(data, "train.tsv") if is_data_folder(data) else data
    with _reading(path, detect_format(path)) as rows:
        texts = (row.get(text_column_of(text_column, row)) for row in rows if isinstance(row, dict))
        strings = (text for text in texts if isinstance(text, str))
        counts = [len(text.split()) for text in itertools.islice(strings, SAMPLE_ROWS)]
    return float(statistics.median(counts)) if counts else None


def _dump(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=1000).strip().removesuffix("...").strip()


def starter_yaml(data: str, output: str, command: str, **columns_and_files: Optional[str]) -> str:
    """The starter config as a commented YAML file written to `output`; `command`: the init command that wrote it."""
    raw = starter(data, **columns_and_files)
    lines = [f"# transferset run --config {output}",
             f"# Written by `{command}`. A setting given on the command line wins: key=value, e.g. teacher.epochs=1.",
             "# Every setting, its default and bound: docs/configuration.md (transferset/config/).",
             "# A relative path here (run_dir) is read from the folder `transferset run` starts in, as on the command "
             "line;", "# the data paths are absolute, so this file runs from any folder.",
             f"run_dir: {_dump(raw['run_dir'])}  # every stage writes into a folder of it; a rerun reuses what is done",
             f"data: {_dump(raw['data'])}  # the train file (TSV, CSV, JSONL, Parquet), or hf:NAME[:CONFIG]"]
    if "dev" in raw:
        lines.append(f"dev: {_dump(raw['dev'])}  # the selection split: the teacher's best epoch, early stopping")
    if "test" in raw:
        lines.append(f"test: {_dump(raw['test'])}  # scored once by every model at the end; no choice sees it")
    if "validation" in raw:
        lines += ["# no dev file: the selection split is `rows` train rows held out (seeded; auto: 10 % of the rows, "
                  "at most 2,000; by: sentence draws whole sentences; stratify: null draws per class when needed)",
                  f"validation: {_dump(raw['validation'])}"]
    for section, comment in (("teacher", "fine-tuned on the labeled rows; model: any Hugging Face encoder"),
                             ("augment", "the transfer set: tang (mask, POS, n-gram) or tinybert (MLM) variants")):
        lines.append(f"{section}:  # {comment}")
        for k, v in (raw.get(section) or {}).items():
            lines.append(f"  {k}: {_dump(v)}")
        if not raw.get(section):
            lines[-1] = f"{section}: {{}}  # {comment}"
    lines.append("students:  # each trained from the scored transfer set; the report compares them with the teacher")
    for name, settings in raw["students"].items():
        lines.append(f"  {name}: {_dump(settings)}")
    return "\n".join(lines) + "\n"


def add_data_arguments(parser: argparse.ArgumentParser, *, required: bool) -> None:
    """--data and its columns and files: shared by `init` and `run`."""
    g = parser.add_argument_group("your data")
    g.add_argument("--data", required=required, metavar="PATH",
                   help="the train file (.tsv/.csv/.jsonl/.parquet), hf:NAME[:CONFIG] (its train split), or a "
                        "folder holding train.tsv and dev.tsv")
    g.add_argument("--text-column", metavar="NAME",
                   help=f"the text column (default: {' or '.join(DEFAULT_TEXT_COLUMNS)})")
    g.add_argument("--label-column", metavar="NAME", help=f"the label column (default: {DEFAULT_LABEL_COLUMN})")
    g.add_argument("--dev", metavar="PATH",
                   help="labeled selection file (best epoch, early stopping); default: carved from the train file")
    g.add_argument("--test", metavar="PATH", help="labeled test file, scored once by every model at the end")


def data_kwargs(args: argparse.Namespace) -> dict[str, Optional[str]]:
    return {k: getattr(args, k, None) for k in ("text_column", "label_column", "dev", "test")}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_data_arguments(parser, required=True)
    parser.add_argument("--output", required=True, metavar="YAML", help="the starter config to write")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --output file")


def command_line(argv: Sequence[str]) -> str:
    return " ".join(["transferset", "init", *argv])


def absolute(path: str) -> str:
    """A local path made absolute (an hf: split and a URL as they are)."""
    return path if path.startswith(HF_PREFIX) or fs.is_remote(path) else os.path.abspath(path)


def check_output(output: str, overwrite: bool) -> None:
    """Refuse an --output that cannot be the YAML file written: a folder, one below a file, an existing file
    without --overwrite."""
    if os.path.isdir(output):
        raise ConfigError(f"--output {output} is a folder: give the path of the YAML file to write, e.g. "
                          f"{os.path.join(output, 'run.yaml')}")
    if os.path.lexists(output) and not overwrite:
        raise ConfigError(f"--output {output} exists: choose another file, or add --overwrite")
    parent = os.path.dirname(output)
    while parent and not os.path.isdir(parent):
        if os.path.lexists(parent):
            raise ConfigError(f"--output {output}: {parent} is a file, not a folder; choose another --output")
        parent = os.path.dirname(parent)


def run(args: argparse.Namespace, extra) -> int:
    for flag in ("data", "dev", "test"):
        path = getattr(args, flag, None)
        if path and not path.startswith(HF_PREFIX) and not fs.exists(path):
            raise ConfigError(f"--{flag} {path}: no such file")
    check_output(args.output, args.overwrite)
    kwargs = data_kwargs(args)
    argv = ["--data", args.data, *[f"--{k.replace('_', '-')} {v}" for k, v in kwargs.items() if v],
            "--output", args.output]
    # the YAML's relative paths are read from the folder `run` starts in: its data paths are written absolute
    kwargs.update({k: absolute(kwargs[k]) for k in ("dev", "test") if kwargs.get(k)})
    text = starter_yaml(absolute(args.data), args.output, command_line(argv), **kwargs)
    cfg = typed.load(RunConfig, yaml.safe_load(text), where=args.output)  # type-checked as `run --config` will
    check_data(cfg)
    parent = os.path.dirname(args.output)
    with fs.writing_into(args.output):  # a folder this user cannot write: one line, exit 2
        if parent:
            os.makedirs(parent, exist_ok=True)  # a YAML in a folder not made yet: the folder is made, as an editor does
        with open(args.output, "w", encoding="utf-8") as fh:
            fh.write(text)
    print(f"wrote {args.output}: run it with `transferset run --config {args.output}`")
    return 0
