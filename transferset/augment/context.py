"""What ops read besides the words: context computed once per example or once per corpus.

An op names the context it needs (`register(..., needs=("tags", "pos_vocab"))`); the module that
provides a context registers it here. A pipeline computes the contexts the configured ops need from
these declarations alone, so a new op that needs a new model adds no pipeline code:

- a RowContext is a value per example that a model computes for a batch of examples (the POS
  tags, the MLM candidates): the model loads once per worker;
- a CorpusContext is one value for the whole input, counted from every example and its row
  context (the POS vocabulary: the unigram distribution of each tag's words).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence, Union

from transferset.augment import registry
from transferset.runtime.registry import Registry


@dataclass(frozen=True)
class RowContext:
    name: str  # the key ops read it under (an op's keyword argument)
    label: str  # the pipeline step computing it: a stable step name (e.g. "TagPOS")
    load: Callable[[Any], Any]  # augment settings → the model, once per worker
    compute: Callable[[Any, Sequence[Sequence[str]], Any], list]  # (model, word lists, settings) → a value each
    batch_size: str  # the augment setting holding the examples per compute call
    min_batch_size: int = 1  # the smallest batch worth a call (capped by the batch size)


@dataclass(frozen=True)
class CorpusContext:
    name: str  # the key ops read it under
    label: str  # the pipeline step combining it
    needs: tuple[str, ...]  # the row contexts `add` reads
    add: Callable[[Any, Sequence[str], Mapping[str, Any]], Any]  # (accumulator, words, row context) → accumulator
    build: Callable[[Any], Any]  # the merged accumulator → the value ops read
    create: Callable[[], Any] = dict  # an empty accumulator; accumulators merge with `merge`
    merge: Callable[[Any, Any], Any] = lambda a, b: {**a, **b}


Context = Union[RowContext, CorpusContext]
# The modules that provide contexts are the op modules (registered when the ops are discovered) and those of
# the `transferset.augment_contexts` entry point group.
CONTEXTS: Registry[Context] = Registry("augment context", "transferset.augment_contexts")


def register_context(context: Context) -> Context:
    return CONTEXTS.add(context.name, context)


def get_context(name: str) -> Context:
    registry.REGISTRY.discover()  # the op modules register the contexts they provide
    return CONTEXTS.get(name)


def contexts_for(ops: Sequence[str]) -> list[Context]:
    """The contexts the ops need, each once, every one after those it reads (row contexts first)."""
    wanted: dict[str, Context] = {}

    def want(name: str) -> None:
        ctx = get_context(name)
        for upstream in getattr(ctx, "needs", ()):
            want(upstream)
        wanted.setdefault(name, ctx)

    for op in ops:
        for name in registry.get(op).needs:
            want(name)
    return sorted(wanted.values(), key=lambda c: isinstance(c, CorpusContext))
