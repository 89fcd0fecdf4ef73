"""transferset/augment/compose.py: the ops a config names are checked, word ops are exclusive per word (Tang
et al.), same seed → same output. Each op's own statistics are in test_mask/test_pos/test_ngram.py."""
import pytest

from sst2_words import sentences, tagged  # noqa: F401 (fixtures)
from transferset.augment import check_ops, generate, get, names, register, variant_rows
from transferset.augment.pos import build_vocab
from transferset.config import AugmentConfig
from transferset.runtime.errors import ConfigError
from transferset.runtime.registry import RegistryError


def test_registry_names_duplicates_and_unknown():
    assert {"mask", "pos", "ngram", "mlm"} <= set(names())
    with pytest.raises(RegistryError, match="already registered"):
        register("mask", kind="word", prob="p_mask")(lambda **_: None)
    with pytest.raises(RegistryError, match="known: .*mask"):
        get("nope")
    with pytest.raises(ConfigError, match="augment: ops: unknown augmenter 'shuffle'; known: join, mask, mlm"):
        check_ops(AugmentConfig(ops=("mask", "shuffle")))


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
