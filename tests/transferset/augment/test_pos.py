"""transferset/augment/pos.py: a replacement keeps the tag, follows p_pos and the unigram distribution of its tag."""
from collections import Counter

import numpy as np

from sst2_words import sentences, tagged  # noqa: F401 (fixtures)
from transferset.augment import generate
from transferset.augment.pos import PosVocab, build_vocab, pos
from transferset.config import AugmentConfig


def test_pos_replacements_keep_the_tag_and_follow_p_pos(tagged):
    sentences, tags = tagged
    vocab = build_vocab(zip(sentences, tags))
    word_tags = {}
    for ws, ts in zip(sentences, tags):
        for w, t in zip(ws, ts):
            word_tags.setdefault(w, set()).add(t)
    cfg = AugmentConfig(ops=("pos",), n_iter=5, p_pos=0.1, seed=1)
    changed = total = 0
    for i, (ws, ts) in enumerate(zip(sentences, tags)):
        for v in generate(ws, source_id=str(i), cfg=cfg, context={"tags": ts, "pos_vocab": vocab}):
            for old, new, t in zip(ws, v.words, ts):
                total += 1
                if new != old:
                    changed += 1
                    assert t in word_tags[new], (old, new, t)  # drawn from the same tag's words
    # Replacement can draw the same word back, so the change rate sits a little under p_pos.
    assert 0.05 < changed / total < 0.1


def test_pos_draws_follow_the_unigram_distribution():
    vocab = PosVocab.from_counts({("NN", "film"): 3, ("NN", "movie"): 1, ("JJ", "good"): 5})
    rng = np.random.default_rng(0)
    draws = Counter(vocab.draw("NN", u) for u in rng.random(8000))
    assert set(draws) == {"film", "movie"}
    assert abs(draws["film"] / 8000 - 0.75) < 0.02
    assert vocab.draw("VB", 0.5) is None
    out = pos(words=["a", "film"], positions=np.array([0]), rng=rng, tags=["VB", "NN"], pos_vocab=vocab)
    assert out == ["a", "film"]  # a tag unseen in the corpus leaves the word alone
