"""transferset/augment/ngram.py: kept n-grams are contiguous, n uniform in 1..5."""
from collections import Counter

from transferset.augment.ngram import ngram
from transferset.augment.seeding import rng_for


def test_ngram_lengths_uniform_and_contiguous():
    words = [f"w{i}" for i in range(12)]
    lengths = Counter()
    applied = 0
    n = 6000
    for v in range(n):
        out = ngram(words=words, rng=rng_for(1, "s", v), p_ng=0.25, max_n=5)
        if out != words:
            applied += 1
            lengths[len(out)] += 1
            start = words.index(out[0])
            assert out == words[start:start + len(out)]  # a contiguous n-gram
    assert abs(applied / n - 0.25) < 0.025
    assert set(lengths) == {1, 2, 3, 4, 5}
    for k in range(1, 6):
        assert abs(lengths[k] / applied - 0.2) < 0.04, lengths


def test_ngram_short_sentence_keeps_at_most_its_words():
    out = ngram(words=["only", "two"], rng=rng_for(0, "s", 0), p_ng=1.0, max_n=5)
    assert 1 <= len(out) <= 2
