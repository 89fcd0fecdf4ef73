"""Augmenters registered by name, each with the settings it owns and the context it reads.

Two kinds make an example's variants: a "word" augmenter rewrites the words at the positions the composer
chose for it (so word ops are exclusive per word, as mask-or-POS in Tang et al. 2019); a "sequence" augmenter
transforms the whole word list (e.g. n-gram sampling). A third, "rows", makes rows of several originals (join.py):
the pipeline runs it on random buckets of them, apart from the variants.

An op declares its settings as a frozen dataclass (typed fields, defaults, a comment per field):
transferset.config.AugmentConfig is composed of them, so each field is a `--flag` of
`transferset augment` (its comment the `--help`) and a key of the run YAML's `augment:` section.
The op function takes exactly its keyword arguments: `words`, `rng`, `positions` (word ops), and
any of its settings fields and declared context names (transferset.augment.context); the composer
passes those and nothing else.
"""
from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from typing import Callable, Optional

from transferset.runtime.registry import Registry

WORD = "word"
SEQUENCE = "sequence"
ROWS = "rows"
# what an op of each kind is always passed (by the composer; a rows op by the pipeline's buckets)
_GIVEN = {WORD: ("words", "positions", "rng"), SEQUENCE: ("words", "rng"), ROWS: ("rows", "rng")}


@dataclass(frozen=True)
class NoSettings:
    """An op without settings of its own."""


@dataclass(frozen=True)
class Augmenter:
    name: str
    kind: str  # WORD, SEQUENCE or ROWS
    fn: Callable
    settings: type  # frozen dataclass: the AugmentConfig fields this op owns
    prob: Optional[str]  # settings field holding the per-word probability of a WORD op
    needs: tuple[str, ...] = ()  # context the op reads (transferset.augment.context), e.g. "tags", "candidates"
    arguments: tuple[str, ...] = ()  # the keyword arguments of fn the composer fills from settings and context


# Every module of transferset.augment but the machinery's is an op module; ops of other packages come through
# the entry point group (transferset/runtime/registry.py).
MACHINERY = ("compose", "context", "dedup", "registry", "seeding")
REGISTRY: Registry[Augmenter] = Registry("augmenter", "transferset.augmenters", "transferset.augment", MACHINERY)


def register(name: str, *, kind: str, settings: type = NoSettings, prob: str | None = None,
             needs: tuple[str, ...] = ()):
    """Register an op function under `name`; its signature is checked against what it declares."""
    REGISTRY.check_free(name)
    if kind not in _GIVEN:
        raise ValueError(f"augmenter {name!r}: kind must be one of {', '.join(map(repr, _GIVEN))}, not {kind!r}")
    if not (dataclasses.is_dataclass(settings) and settings.__dataclass_params__.frozen):
        raise ValueError(f"augmenter {name!r}: settings must be a frozen dataclass, got {settings!r}")
    fields = {f.name for f in dataclasses.fields(settings)}
    if kind == WORD and prob not in fields:
        raise ValueError(f"word augmenter {name!r} needs `prob`: the field of its settings holding its per-word "
                         f"probability (fields: {sorted(fields)})")

    def deco(fn: Callable) -> Callable:
        params = inspect.signature(fn).parameters
        swallow = [p.name for p in params.values() if p.kind is inspect.Parameter.VAR_KEYWORD]
        if swallow:
            raise ValueError(f"augmenter {name!r}: {fn.__qualname__} takes **{swallow[0]}: an op takes exactly its "
                             f"declared arguments, so a misspelt setting cannot pass unseen")
        loose = [p for p in params.values() if p.kind is not inspect.Parameter.KEYWORD_ONLY]
        if loose:
            raise ValueError(f"augmenter {name!r}: {fn.__qualname__} must take keyword-only arguments, "
                             f"not {', '.join(p.name for p in loose)}")
        missing = [g for g in _GIVEN[kind] if g not in params]
        unknown = [p for p in params if p not in _GIVEN[kind] and p not in fields and p not in needs]
        if missing or unknown:
            raise ValueError(f"augmenter {name!r}: {fn.__qualname__} takes " + "; ".join(
                ([f"no {', '.join(missing)} (a {kind} op always gets {', '.join(_GIVEN[kind])})"] if missing else [])
                + ([f"{', '.join(unknown)}, neither a field of {settings.__name__} nor a declared need"]
                   if unknown else [])))
        REGISTRY.add(name, Augmenter(name, kind, fn, settings, prob, tuple(needs),
                                     tuple(p for p in params if p not in _GIVEN[kind])), by=fn.__module__)
        return fn

    return deco


def get(name: str) -> Augmenter:
    """The op of that name; an unknown one is a RegistryError naming the known ones."""
    return REGISTRY.get(name)


def names() -> list[str]:
    return sorted(REGISTRY.names())


def settings_classes() -> tuple[type, ...]:
    """Every registered op's settings class, once each, in registration order; two classes declaring
    the same field are refused (a field is one flag and one YAML key)."""
    classes = list(dict.fromkeys(op.settings for op in REGISTRY.values() if op.settings is not NoSettings))
    owner: dict[str, type] = {}
    for cls in classes:
        for f in dataclasses.fields(cls):
            if f.name in owner:
                raise ValueError(f"augment setting {f.name!r} is declared by both {owner[f.name].__qualname__} "
                                 f"and {cls.__qualname__}: give one of them another name")
            owner[f.name] = cls
    return tuple(classes)
