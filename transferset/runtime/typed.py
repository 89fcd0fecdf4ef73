"""Plain values (YAML, flags, JSON) into typed dataclasses, with errors a user can act on.

A general toolkit over pydantic: `load` type-checks a mapping against a (nested) dataclass and
reports every problem with its key, the value, the expected type and where it came from.
The settings themselves are in transferset/config/.
"""
from __future__ import annotations

import dataclasses
import json
import math
import typing
from typing import Annotated, Any, Iterator, Mapping, Optional, TypeVar, Union

import pydantic
import yaml

from transferset.runtime.errors import ConfigError, UserError

T = TypeVar("T")


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Annotated:
        return _type_name(typing.get_args(tp)[0])
    if origin is typing.Literal:
        return " or ".join(repr(a) for a in typing.get_args(tp))
    if origin is Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        inner = " or ".join(_type_name(a) for a in args)
        return f"{inner} or null" if len(args) < len(typing.get_args(tp)) else inner
    if origin in (tuple, list):
        args = typing.get_args(tp)
        return f"list of {_type_name(args[0])}" if args else "list"
    if origin is dict:
        return f"mapping of {_type_name(typing.get_args(tp)[1])}"
    if dataclasses.is_dataclass(tp):
        return f"mapping ({tp.__name__})"
    return getattr(tp, "__name__", str(tp))


def _unwrap(tp: Any) -> Any:
    """The type inside Optional[...] and Annotated[...] (the first non-None member of a Union)."""
    while typing.get_origin(tp) in (Union, Annotated):
        tp = [a for a in typing.get_args(tp) if a is not type(None)][0]
    return tp


def _expected(cls: type, loc: tuple) -> Optional[str]:
    """The expected type at `loc` (a pydantic error location) inside dataclass `cls`; None where it is any."""
    tp: Any = cls
    for part in loc:
        tp = _unwrap(tp)
        if dataclasses.is_dataclass(tp) and isinstance(part, str):
            hints = typing.get_type_hints(tp, include_extras=True)
            if part not in hints:
                return None
            tp = hints[part]
        elif typing.get_origin(tp) is dict:
            tp = typing.get_args(tp)[1]
        elif typing.get_origin(tp) in (tuple, list) and isinstance(part, int):
            tp = typing.get_args(tp)[0]
        else:
            break
    return None if tp is Any else _type_name(tp)  # "expected Any" would say nothing (a bound inside `model:`)


def _key(loc: tuple, flag_style: bool) -> str:
    parts = [str(p) for p in loc if not str(p).startswith("function-")]
    if flag_style and parts:
        return "--" + parts[0].replace("_", "-") + "".join(f"[{p}]" for p in parts[1:])
    return ".".join(parts)


def _given(loc: tuple, given: Optional[Mapping[str, str]]) -> Optional[str]:
    """How the user wrote the setting at `loc` when a flag or a key=value set it (`given`: dotted key → the
    flag or override as typed, e.g. "--epochs nan"), else None (it came from `where`)."""
    if not given:
        return None
    parts = [str(p) for p in loc if not str(p).startswith("function-")]
    for n in range(len(parts), 0, -1):
        shown = given.get(".".join(parts[:n]))
        if shown is not None:
            return shown
    return None


def _line(where: str, loc: tuple, flag_style: bool, given: Optional[Mapping[str, str]], value: Any,
          problem: str, show_value: bool = True, cls_name: str = "") -> str:
    """One problem, blamed on what set the value: the flag or key=value as typed, else `where` and the key."""
    shown = _given(loc, given)
    if shown is not None:
        return f"{shown}: {problem}"
    key = _key(loc, flag_style) or cls_name
    return f"{where}: {key} = {value}: {problem}" if show_value else f"{where}: {key}: {problem}"


def format_errors(cls: type, exc: pydantic.ValidationError, where: str, flag_style: bool = False,
                  given: Optional[Mapping[str, str]] = None) -> str:
    lines = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        key = _key(loc, flag_style)
        if err["type"] == "unexpected_keyword_argument":
            parent = _expected(cls, loc[:-1]) if loc[:-1] else cls.__name__
            known = _known_keys(cls, loc[:-1])
            problem = "unknown setting" + (f"; known: {', '.join(known)}" if known else "") + \
                (f" ({parent})" if not known else "")
            # the override that made the unknown key (teachr.epochs=3 makes teachr) is what to correct
            shown = next((g for k, g in (given or {}).items() if f"{k}.".startswith(f"{_key(loc, False)}.")), None)
            lines.append(f"{shown}: {key}: {problem}" if shown else f"{where}: {key}: {problem}")
            continue
        value = err.get("input")
        if err["type"] == "value_error":
            message = str(err.get("ctx", {}).get("error") or err["msg"])
            lines.append(_line(where, loc, flag_style, given, value, message, show_value=False,
                               cls_name=cls.__name__))
            continue
        # a choice's message already lists the choices
        expected = None if err["type"] == "literal_error" else _expected(cls, loc)
        if _numeric(expected) and _non_finite(value):  # NaN fails every bound: say what it is instead
            lines.append(_line(where, loc, flag_style, given, value, f"not a number (expected {expected})"))
            continue
        lines.append(_line(where, loc, flag_style, given, repr(value), err["msg"].lower()
                           + (f" (expected {expected})" if expected else "")))
    return "\n".join(lines)


def _numeric(expected: Optional[str]) -> bool:
    return expected is not None and any(t in expected.split() for t in ("float", "int"))


def _non_finite(value: Any) -> bool:
    """Whether `value` is NaN or ±inf, or the text of one ("nan", "inf", as a flag gives it)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return False
    return isinstance(value, float) and not math.isfinite(value)


def _non_finite_values(value: Any, loc: tuple = ()) -> Iterator[tuple[tuple, float]]:
    """(location, value) of every NaN or ±inf float inside a loaded settings object (nested too)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from _non_finite_values(getattr(value, f.name), loc + (f.name,))
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield from _non_finite_values(v, loc + (k,))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _non_finite_values(v, loc + (i,))
    elif _non_finite(value) and not isinstance(value, str):
        yield loc, value


def _known_keys(cls: type, loc: tuple) -> list[str]:
    tp: Any = cls
    for part in loc:
        tp = _unwrap(tp)
        if dataclasses.is_dataclass(tp) and isinstance(part, str):
            tp = typing.get_type_hints(tp, include_extras=True).get(part)
        elif typing.get_origin(tp) is dict:
            tp = typing.get_args(tp)[1]
    tp = _unwrap(tp)
    return [f.name for f in dataclasses.fields(tp)] if dataclasses.is_dataclass(tp) else []


def load(cls: type[T], values: Mapping[str, Any], where: str, flag_style: bool = False,
         given: Optional[Mapping[str, str]] = None) -> T:
    """Build a `cls` from plain values (YAML, flags), type-checked; a ConfigError lists every problem.
    `given`: the settings a flag or a key=value override set (dotted key → as the user typed it), whose
    problems are blamed on that flag or override instead of on `where`."""
    if values is None:
        values = {}
    if not isinstance(values, Mapping):
        raise ConfigError(f"{where}: expected a mapping of settings, got {type(values).__name__} {values!r}")
    try:
        loaded = pydantic.TypeAdapter(cls).validate_python(dict(values))
    except pydantic.ValidationError as exc:
        raise ConfigError(format_errors(cls, exc, where, flag_style, given)) from None
    # A float without bounds takes NaN and inf as pydantic reads them; no setting means either.
    bad = [_line(where, loc, flag_style, given, value, "not a number"
                 + (f" (expected {_expected(cls, loc)})" if _numeric(_expected(cls, loc)) else ""))
           for loc, value in _non_finite_values(loaded)]
    if bad:
        raise ConfigError("\n".join(bad))
    return loaded


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A YAML mapping that names one key twice."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.safe_load that refuses a mapping naming a key twice: YAML requires unique keys, and PyYAML would
    keep the last silently (a second `epochs:` under one student, pasted in, would win unseen)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base` may be overridden on purpose
                    continue
                key, line = self.construct_object(key_node, deep=deep), key_node.start_mark.line + 1
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: the base class says what is wrong with it
                    continue
                if first is not None:
                    raise DuplicateKeyError(None, None, f"`{key}` is set twice (lines {first} and {line}); keep "
                                            "one", key_node.start_mark)
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


def yaml_load(stream: Any) -> Any:
    """yaml.safe_load that refuses a key set twice in one mapping (DuplicateKeyError, with its line)."""
    return yaml.load(stream, Loader=_UniqueKeyLoader)


def read_yaml(path: str, what: str = "config") -> dict[str, Any]:
    """A YAML file of settings as a plain mapping.

    A missing file is a ConfigError like a mistyped flag (the file is how the command was asked for),
    as is a file that is not a YAML mapping of plain values (a parse error, a list, a `!!python/...`
    tag): a usage error (exit 2), raised before anything is written. An unreadable one is a UserError.
    """
    try:
        with open(path, encoding="utf-8") as fh:
            raw = yaml_load(fh)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such {what} file (see configs/ for examples)") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not valid YAML: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read the {what} file: {exc.strerror}") from None
    except DuplicateKeyError as exc:
        raise ConfigError(f"{path}, line {exc.problem_mark.line + 1}: {exc.problem}") from None
    except yaml.constructor.ConstructorError as exc:
        mark = exc.problem_mark
        where = f", line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}: not valid YAML{where}: {exc.problem}; a {what} holds plain values "
                          "(no !!python tags or other objects)") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from None
    except RecursionError:
        raise ConfigError(f"{path}: not valid YAML: nested too deeply") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: a {what} is a YAML mapping of settings, got {type(raw).__name__}")
    return raw


def to_dict(cfg: Any) -> dict[str, Any]:
    """Plain values (lists for tuples) that `load` accepts back: for YAML, JSON and stage hashes."""
    return json.loads(json.dumps(dataclasses.asdict(cfg), default=list))




# --- bounds as part of a setting's type ----------------------------------------------------------
# `load` checks them with the types, and a refusal names the key, the value and the bound
# ("augment.n_iter = -1: input should be greater than or equal to 0"). Settings classes of the
# config and of the augment ops use them alike.

def AtLeast(low: int) -> Any:
    return Annotated[int, pydantic.Field(ge=low)]


Probability = Annotated[float, pydantic.Field(ge=0, le=1)]
Positive = Annotated[float, pydantic.Field(gt=0)]
NonNegative = Annotated[float, pydantic.Field(ge=0)]
