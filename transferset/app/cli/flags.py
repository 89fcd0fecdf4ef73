"""Command-line flags from a settings dataclass: one `--field-name` per field, `--help` from its comment.

`add_arguments` builds the flags, `from_args` turns the flags the user gave (on top of a YAML
base, under key=value overrides: transferset/config/precedence.py) into the dataclass through `typed.load`,
so a flag and a YAML key are checked alike.

Kept of ours rather than tyro, jsonargparse or OmegaConf (read in their documentation, not tried in code): the flags
keep the names the docs and users' commands use (a section's field is `--trim-vocab`, where tyro and jsonargparse
spell a nested field `--vocab.trim-vocab` unless told otherwise type by type), and the layers around them (a YAML
file, key=value words, a student's family and preset defaults) merge in the one order of config/precedence.py;
OmegaConf's dotlist merge would do the key=value layer alone, with no flags or help.
"""
from __future__ import annotations

import argparse
import dataclasses
import inspect
import io
import math
import threading
import tokenize
import typing
from typing import Any, Mapping, Optional, Sequence, TypeVar

from transferset.config import BeamConfig
from transferset.config.precedence import apply_override, over
from transferset.fs.output import OVERWRITE_HELP
from transferset.runtime.typed import _type_name, _unwrap, load

T = TypeVar("T")


def field_help(cls: type) -> dict[str, str]:
    """The comment on (or just above) each field: the dataclass's own documentation, found in the class
    that declares the field (AugmentConfig's op settings are declared by the ops' settings classes)."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            out.update(_own_field_help(klass))
    return out


# inspect.getsourcelines parses the class's module with ast, which CPython 3.11 does not make safe for two
# threads at once ("SystemError: AST constructor recursion depth mismatch"): two commands started together
# in one process (a caller's threads, the test of concurrent `score` runs) build their flags under this lock,
# and each class's help is read once.
_HELP_LOCK = threading.Lock()
_HELP: dict[type, dict[str, str]] = {}


def _own_field_help(cls: type) -> dict[str, str]:
    with _HELP_LOCK:
        if cls not in _HELP:
            _HELP[cls] = _read_field_help(cls)
        return dict(_HELP[cls])


def _read_field_help(cls: type) -> dict[str, str]:
    try:
        lines, _ = inspect.getsourcelines(cls)
    except (OSError, TypeError):
        return {}
    names = {f.name for f in dataclasses.fields(cls)}
    out: dict[str, str] = {}
    pending: list[str] = []
    for tok_line in _logical_lines("".join(lines)):
        code, comment = tok_line
        if not code:
            if comment:
                pending.append(comment)
            else:
                pending = []
            continue
        name = code.split(":", 1)[0].strip()
        if name in names and ":" in code:
            # A field's own comment wins; lines above it document it only when it has none
            # (otherwise they are a section heading, e.g. "# loss weights").
            text = comment or " ".join(pending)
            if text:
                out[name] = text
        pending = []
    return out


def _logical_lines(source: str) -> list[tuple[str, str]]:
    """(code, comment) per physical line; a comment-only line has empty code."""
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    out = []
    for i, line in enumerate(source.splitlines(), start=1):
        code = line.split("#", 1)[0].strip() if i in comments else line.strip()
        out.append((code, comments.get(i, "")))
    return out


def _choices(tp: Any) -> tuple:
    """The values a Literal setting takes (() for any other type)."""
    return typing.get_args(_unwrap(tp)) if typing.get_origin(_unwrap(tp)) is typing.Literal else ()


def _metavar(tp: Any) -> str:
    choices = _choices(tp)
    if choices:
        return "{" + ",".join(map(str, choices)) + "}"
    name = _type_name(tp)
    if name.startswith("list of"):
        return "A,B"
    return {"int": "N", "float": "X", "str": "TEXT"}.get(name.replace(" or null", ""), "VALUE")


def _is_bool(tp: Any) -> bool:
    tp = _unwrap(tp)
    return tp is bool


def _is_mapping(tp: Any) -> bool:
    tp = _unwrap(tp)
    return typing.get_origin(tp) is dict or dataclasses.is_dataclass(tp)


def add_arguments(parser, cls: type, *, title: Optional[str] = None, skip: tuple[str, ...] = (),
                  defaults: Optional[Mapping[str, Any]] = None) -> None:
    """One flag per field of `cls` (mappings excepted): --field-name, help from the field's comment.

    Every flag defaults to argparse.SUPPRESS: a flag not given leaves no attribute, so the
    dataclass default (or a YAML value) stands and `from_args` knows what the user set.
    `--help` shows the dataclass default (or `defaults`, where a command documents another).
    """
    group = parser.add_argument_group(title) if title else parser
    helps = field_help(cls)
    hints = typing.get_type_hints(cls, include_extras=True)
    for f in dataclasses.fields(cls):
        if f.name not in skip and _section(hints[f.name]) is not None:
            _add_section(parser, cls, f, _section(hints[f.name]))
        if f.name in skip or _is_mapping(hints[f.name]):
            continue
        default = (defaults or {}).get(f.name, f.default if f.default is not dataclasses.MISSING else None)
        shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
        help_text = helps.get(f.name, "")
        help_text = f"{help_text} (default: {shown})" if help_text else f"default: {shown}"
        _add_flag(group, "--" + f.name.replace("_", "-"), f.name, hints[f.name], help_text)


def _add_flag(group, flag: str, dest: str, tp: Any, help_text: str) -> None:
    """One setting's flag, not given unless typed (argparse.SUPPRESS): a yes-or-no one a switch (`--allow-incomplete`,
    `--no-trim-vocab`), any other taking its value."""
    kind = dict(action=argparse.BooleanOptionalAction) if _is_bool(tp) else dict(metavar=_metavar(tp))
    group.add_argument(flag, dest=dest, default=argparse.SUPPRESS, help=help_text.replace("%", "%%"), **kind)


def _section(tp: Any) -> Optional[type]:
    """The settings class of a nested section field (e.g. `engine: EngineConfig`), else None."""
    tp = _unwrap(tp)
    return tp if dataclasses.is_dataclass(tp) else None


def _add_section(parser, cls: type, f: dataclasses.Field, section: type) -> None:
    """A section's fields as flags of their own (`--precision bf16` sets `engine: {precision: bf16}`), titled by
    the section; a name the command's own settings use already gets the section's prefix (`--engine-NAME`)."""
    default = f.default_factory() if f.default_factory is not dataclasses.MISSING else section()
    group = parser.add_argument_group(f"{f.name} section ({section.__name__}; `{f.name}:` in YAML)")
    helps, hints = field_help(section), typing.get_type_hints(section, include_extras=True)
    for g in dataclasses.fields(section):
        shown = getattr(default, g.name)
        _add_flag(group, _section_flag(cls, f.name, g.name), f"{f.name}.{g.name}", hints[g.name],
                  f"{helps.get(g.name, '')} (default: {shown})".strip())


def _section_flag(cls: type, section: str, name: str) -> str:
    """The flag of a section's field: its own name, or the section's prefix when `cls` has a field of that name."""
    own = {g.name for g in dataclasses.fields(cls)}
    return "--" + (f"{section}-{name}" if name in own else name).replace("_", "-")


def _as_typed(flag: str, value: Any) -> str:
    """A flag as the user typed it, for a message that blames it (`--epochs nan`, `--no-shuffle`)."""
    if isinstance(value, bool):
        return flag if value else "--no-" + flag[2:]
    return f"{flag} {value}"


def from_args(cls: type[T], args: Any, base: Optional[Mapping[str, Any]] = None, where: str = "command line",
              overrides: Sequence[str] = ()) -> T:
    """`cls` from the layers the user gave, in the order of config/precedence.py: `base` (e.g. a --config YAML),
    the flags over it, the key=value `overrides` over them; type-checked. A bad value is blamed on its flag or
    override as typed (`--epochs nan`), one of the base on `where`."""
    flagged, typed_flags = flag_values(cls, args)
    values = over(base or {}, flagged)
    for item in overrides:
        apply_override(values, item)
        typed_flags[item.split("=", 1)[0]] = item
    return load(cls, values, where, flag_style=base is None, given=typed_flags)


def flag_values(cls: type, args: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """The settings of `cls` the flags in `args` set (a section's under its name: {engine: {warmup: 0.2}}), and each
    as the user typed it (dotted key → `--warmup 0.2`)."""
    values: dict[str, Any] = {}
    typed_flags: dict[str, str] = {}

    def given(value, tp):
        # "none" / "null" unsets a setting, but where "none" is one of its choices (--tracker none) it is that choice
        unset = isinstance(value, str) and value.lower() in ("none", "null") and value not in _choices(tp)
        return None if unset else value

    hints = typing.get_type_hints(cls, include_extras=True)
    for f in dataclasses.fields(cls):
        if hasattr(args, f.name):
            values[f.name] = given(getattr(args, f.name), hints[f.name])
            typed_flags[f.name] = _as_typed("--" + f.name.replace("_", "-"), getattr(args, f.name))
        section = _section(hints[f.name])
        if section is not None:
            inner = typing.get_type_hints(section, include_extras=True)
            flags = {g.name: given(getattr(args, f"{f.name}.{g.name}"), inner[g.name])
                     for g in dataclasses.fields(section) if hasattr(args, f"{f.name}.{g.name}")}
            typed_flags.update({f"{f.name}.{g}": _as_typed(_section_flag(cls, f.name, g), getattr(args, f"{f.name}.{g}"))
                                for g in flags})
            if flags:
                values[f.name] = flags
    return values, typed_flags


def finite_float(text: str) -> float:
    """argparse type of a float flag declared outside a settings class: NaN and ±inf are refused as not a number
    (float() takes them, and every bound check then fails with a message about the bound)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r}: not a number")
    return value


def add_runner_arguments(parser: argparse.ArgumentParser) -> None:
    """The `beam:` settings as flags, and --overwrite, for the pipeline commands."""
    g = parser.add_argument_group("Beam")
    add_arguments(g, BeamConfig)
    g.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
