"""Each augmenter's statistics match its probabilities; same seed → same output."""
from collections import Counter

import numpy as np
import pytest

from transferset.augment import check_ops, generate, get, names, register, variant_rows
from transferset.config import AugmentConfig
from transferset.errors import ConfigError
from transferset.augment.mask import mask
from transferset.augment.ngram import ngram
from transferset.augment.pos import PosVocab, Tagger, build_vocab, pos
from transferset.augment.seeding import rng_for
from transferset.sources import SourceSpec, read_source


@pytest.fixture(scope="module")
def sentences(sst2_dir):
    recs = read_source(SourceSpec(path=str(sst2_dir / "train.tsv"), label_names=("0", "1"), limit=400))
    return [r.text.split() for r in recs]


@pytest.fixture(scope="module")
def tagged(sentences):
    tagger = Tagger(AugmentConfig().spacy_model)
    return sentences, tagger.tag(sentences)


def _words(sentences):
    return sum(len(s) for s in sentences)


def test_registry_names_duplicates_and_unknown():
    assert {"mask", "pos", "ngram", "mlm"} <= set(names())
    with pytest.raises(ValueError, match="already registered"):
        register("mask", kind="word", prob="p_mask")(lambda **_: None)
    with pytest.raises(KeyError, match="known: .*mask"):
        get("nope")
    with pytest.raises(ConfigError, match="augment: ops: unknown augmenter 'shuffle'; known: mask, mlm"):
        check_ops(AugmentConfig(ops=("mask", "shuffle")))


def test_mask_fraction_matches_p_mask(sentences):
    cfg = AugmentConfig(ops=("mask",), n_iter=10, p_mask=0.1, seed=3)
    masked = total = 0
    for i, words in enumerate(sentences):
        for v in generate(words, source_id=str(i), cfg=cfg):
            masked += sum(w == "[MASK]" for w in v.words)
            total += len(words)
    frac = masked / total
    # ~80k words: the standard error is ~0.001, so 0.01 is a tight yet safe band.
    assert abs(frac - 0.1) < 0.01, frac


def test_mask_only_touches_given_positions():
    out = mask(words=["a", "b", "c"], positions=np.array([1]), rng=rng_for(0, "x", 0), mask_token="[MASK]")
    assert out == ["a", "[MASK]", "c"]


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


def test_tang_recipe_mask_and_pos_are_exclusive_per_word(tagged):
    sentences, tags = tagged
    vocab = build_vocab(zip(sentences, tags))
    cfg = AugmentConfig(recipe="tang", n_iter=20, p_ng=0.0, p_mask=0.3, p_pos=0.3, seed=5)
    masked = replaced = total = 0
    for i, (ws, ts) in enumerate(zip(sentences[:200], tags[:200])):
        for v in generate(ws, source_id=str(i), cfg=cfg, context={"tags": ts, "pos_vocab": vocab}):
            assert len(v.words) == len(ws)
            for old, new in zip(ws, v.words):
                total += 1
                masked += new == "[MASK]"
                replaced += new not in ("[MASK]", old)
    assert abs(masked / total - 0.3) < 0.02
    # POS draws only where no mask was drawn: about p_pos of all words, minus same-word draws.
    assert 0.2 < replaced / total < 0.3


def test_same_seed_same_output_other_seed_differs(tagged):
    sentences, tags = tagged
    vocab = build_vocab(zip(sentences, tags))
    ctx = {"tags": tags[7], "pos_vocab": vocab}
    text = " ".join(sentences[7])

    def rows(seed):
        cfg = AugmentConfig(n_iter=20, seed=seed)
        return [(r.id, r.text, r.ops) for r in variant_rows("src7", text, None, cfg=cfg, context=ctx)]

    assert rows(11) == rows(11)
    assert rows(11) != rows(12)
    # A row depends on its own variant index only: asking for fewer variants gives a prefix.
    short = AugmentConfig(n_iter=5, seed=11)
    assert [(r.id, r.text, r.ops) for r in variant_rows("src7", text, None, cfg=short, context=ctx)] == rows(11)[:5]


def test_words_per_variant_gives_long_examples_more_variants_and_the_same_ones(tagged):
    """ceil(W / words_per_variant) variants, at most n_iter, at least 1; each the n_iter set's variant of that index."""
    sentences, tags = tagged
    vocab = build_vocab(zip(sentences, tags))
    cfg = AugmentConfig(n_iter=6, seed=3, words_per_variant=4)
    seen = set()
    for k, words in enumerate(sentences[:40]):
        ctx = {"tags": tags[k], "pos_vocab": vocab}
        text = " ".join(words)
        rows = [(r.id, r.text) for r in variant_rows(f"s{k}", text, None, cfg=cfg, context=ctx)]
        want = min(6, max(1, -(-len(words) // 4)))
        assert len(rows) == want
        every = [(r.id, r.text) for r in variant_rows(f"s{k}", text, None, cfg=AugmentConfig(n_iter=6, seed=3),
                                                      context=ctx)]
        assert rows == every[:want]
        seen.add(want)
    assert {1, 6} < seen or len(seen) >= 3  # the sentences span short and long ones
    # the rule itself, at its edges; unlabeled text caps at its own number, and 0 stays 0
    cfg = AugmentConfig(n_iter=10, words_per_variant=4, unlabeled_n_iter=2)
    assert [cfg.variants_for(True, w) for w in (0, 1, 4, 5, 8, 9, 39, 40, 41, 400)] == [1, 1, 1, 2, 2, 3, 10, 10, 10, 10]
    assert [cfg.variants_for(False, w) for w in (3, 5, 100)] == [1, 2, 2]
    assert AugmentConfig(n_iter=0, words_per_variant=4).variants_for(True, 50) == 0
    assert AugmentConfig(n_iter=7).variants_for(True, 50) == 7


def test_config_rejects_bad_settings():
    with pytest.raises(ValueError, match="unknown recipe"):
        AugmentConfig(recipe="eda")
    with pytest.raises(ConfigError, match=r"sum to 1.2 > 1 for ops \('mask', 'pos'\)"):
        check_ops(AugmentConfig(p_mask=0.7, p_pos=0.5))
    check_ops(AugmentConfig(p_mask=0.7, p_pos=0.5, ops=("mask", "ngram")))  # pos not used: its p does not count


def test_rows_cross_the_dedup_grouping_packed_and_keyed_by_a_digest_of_the_normalized_text():
    from transferset.augment.compose import original_row
    from transferset.augment.dedup import dedup_digest, dedup_key, pack, resolve, resolve_packed, unpack

    original = original_row("train.tsv:3", "A  Fine film", "and cast", 1)
    variant = next(iter(variant_rows("train.tsv:3", "a fine film", "and cast", cfg=AugmentConfig(n_iter=1, seed=0),
                                     context={"tags": ["DET", "ADJ", "NOUN"]})))
    for row in (original, variant):
        assert unpack(pack(row)) == (row, 1) and unpack(pack(row, 3)) == (row, 3) and len(pack(row)) < 200
    # texts equal once normalized share a key; another text or another second sentence does not
    assert dedup_digest("A  Fine film", "and cast") == dedup_digest("a fine film", "AND cast")
    assert len({dedup_digest("a fine film", "and cast"), dedup_digest("a fine film"),
                dedup_digest("a fine film", "and crew"), dedup_digest("a fine flim", "and cast")}) == 4
    assert dedup_key("A  Fine film") == "a fine film"
    assert resolve([variant, original], False) == (original, 1, 0)
    assert resolve_packed([pack(variant, 2), pack(original)], False) == (original, 2, 0)
    assert resolve_packed([pack(variant, 2), pack(original)], True) == (None, 0, 3)
    assert resolve_packed([], False) == (None, 0, 0)


def test_collapsing_an_examples_repeats_first_keeps_the_winner_and_every_count():
    """dedup.collapse then resolve_packed (two rounds) == resolve over all rows at once (one round)."""
    import random

    from transferset.augment.compose import Row
    from transferset.augment.dedup import collapse, dedup_digest, pack, resolve, resolve_packed

    rnd = random.Random(0)
    texts = ["a fine film", "A  fine film", "dull", "a fine", "fine film"]
    examples = [[Row(f"id{rnd.randrange(10**6)}", f"s{e}", rnd.choice(texts), None, (), None, rnd.choice([-1, 0, 1, 2]))
                 for _ in range(rnd.randrange(1, 8))] for e in range(40)]
    everything = [r for rows in examples for r in rows]
    collapsed = [c for rows in examples for c in collapse(rows)]
    assert len(collapsed) < len(everything)  # repeats inside an example were collapsed
    for excluded in (False, True):
        for text in texts:
            d = dedup_digest(text)
            one_round = resolve([r for r in everything if dedup_digest(r.text) == d], excluded)
            two_rounds = resolve_packed([pack(row, n) for digest, row, n in collapsed if digest == d], excluded)
            assert two_rounds == one_round
    assert sum(n for _, _, n in collapse(examples[0])) == len(examples[0])


def test_dedup_through_bucket_files_equals_resolve_over_all_rows(tmp_path):
    """SpillWriter then dedup_spilled per bucket == resolve over every row at once, with the counts."""
    import random

    import pyarrow.ipc as ipc

    from transferset.augment.compose import Row
    from transferset.augment.dedup import SpillWriter, bucket_of, dedup_digest, dedup_spilled, pack, resolve

    rnd = random.Random(1)
    texts = [f"text {i}" for i in range(60)]
    rows = [Row(f"id{i}", f"s{i % 7}", rnd.choice(texts), None, (), None, rnd.choice([-1, 0, 1])) for i in range(500)]
    writer = SpillWriter(str(tmp_path / "spill"), buckets=4, flush_rows=16)
    written = [w for row in rows for w in [writer.add(dedup_digest(row.text), pack(row))] if w] + writer.close()
    assert len(written) == writer.files > 4  # buckets flushed at 16 rows, then the rest at close
    paths = {}
    for bucket, path in written:
        table = ipc.open_file(str(path)).read_all()
        assert 0 < table.num_rows <= 16 and {bucket_of(d, 4) for d in table.column("digest").to_pylist()} == {bucket}
        paths.setdefault(bucket, []).append(path)
    assert sum(ipc.open_file(p).read_all().num_rows for ps in paths.values() for p in ps) == len(rows)
    excluded = {dedup_digest("text 3"), dedup_digest("text 40")}
    got = [r for ps in paths.values() for r in dedup_spilled(ps, excluded)]
    want = [resolve([r for r in rows if r.text == t], dedup_digest(t) in excluded) for t in texts
            if any(r.text == t for r in rows)]
    assert sorted(got, key=str) == sorted(want, key=str)
    kept = [w for w, _, _ in got if w is not None]
    assert len(kept) + sum(d for _, d, _ in got) + sum(x for _, _, x in got) == len(rows)  # every row accounted for
    assert sum(x for _, _, x in got) == sum(r.text in ("text 3", "text 40") for r in rows) > 0
