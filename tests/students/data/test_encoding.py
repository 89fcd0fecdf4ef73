"""students/data/encoding.py: the tokenizer's Rust backend called directly gives transformers' arrays, for every
family's tokenizer, on real SST-2 rows, at batch 1 and in padded batches; where it would not, transformers'
call stays the one used."""
import numpy as np
import pytest

from students.data.encoding import Encoder, hf_arrays
from students.data.tokens import WordPieceTokens
from transferset import testing

NAMES = ("input_ids", "attention_mask", "token_type_ids")
LENGTH = 24  # below many SST-2 rows' length: truncation is exercised on real text


@pytest.fixture(scope="module")
def dev_texts(sst2_dir):
    return testing.read_sentences(str(sst2_dir / "dev.tsv"), 200)


def same_arrays(encoder, tokenizer, texts, batch_sizes=(1, 5, 64)):
    """Every batch of `texts` at each batch size: encoder's arrays == transformers'; how many were truncated."""
    truncated = 0
    for bs in batch_sizes:
        for start in range(0, len(texts), bs):
            batch = texts[start:start + bs]
            got, want = encoder(batch, None, LENGTH, NAMES), hf_arrays(tokenizer, batch, None, LENGTH, NAMES)
            for name in NAMES:
                assert got[name].dtype == np.int64 and np.array_equal(got[name], want[name]), (bs, start, name)
            truncated += int((want["attention_mask"].sum(1) == LENGTH).sum())
    return truncated


@pytest.mark.parametrize("family", sorted(testing.FAMILIES))
def test_the_direct_call_gives_transformers_arrays_for_every_family(family, sst2_sentences, dev_texts):
    tokenizer = testing.train_tokenizer(family, sst2_sentences)
    encoder = Encoder(tokenizer)
    assert encoder.backend(LENGTH) is not None  # the shortcut is taken, not the fallback
    assert same_arrays(encoder, tokenizer, dev_texts) > 50


def test_the_packaged_minilm_tokenizer_with_left_truncation_and_padding(minilm, dev_texts):
    tokens = WordPieceTokens.from_dir(minilm, max_length=LENGTH)
    tokenizer = tokens.tokenizer
    right = Encoder(tokenizer)(dev_texts[:64], None, LENGTH, NAMES)
    tokenizer.truncation_side = tokenizer.padding_side = "left"
    encoder = Encoder(tokenizer)
    assert encoder.backend(LENGTH) is not None
    same_arrays(encoder, tokenizer, dev_texts)
    left = encoder(dev_texts[:64], None, LENGTH, NAMES)
    assert not np.array_equal(left["input_ids"], right["input_ids"])  # the sides were honoured, not ignored
    assert (left["attention_mask"][:, -1] == 1).all() and (right["attention_mask"][:, 0] == 1).all()


def test_pairs_go_through_transformers(minilm, dev_texts):
    tokenizer = WordPieceTokens.from_dir(minilm, max_length=LENGTH).tokenizer
    encoder = Encoder(tokenizer)
    pairs = dev_texts[::-1][:32]
    got = encoder(dev_texts[:32], pairs, LENGTH, NAMES)
    want = hf_arrays(tokenizer, dev_texts[:32], pairs, LENGTH, NAMES)
    assert all(np.array_equal(got[n], want[n]) for n in NAMES)
    assert (got["token_type_ids"] == 1).any()  # the second texts are there
    assert encoder._backends == {}  # no backend was even set up


def test_a_tokenizer_whose_direct_call_would_differ_keeps_transformers_call(minilm, dev_texts):
    """A tokenizer whose Python call does more than its backend (here: shifted ids) is caught by the
    probe check, and every batch then goes through that call."""
    tokenizer = WordPieceTokens.from_dir(minilm, max_length=LENGTH).tokenizer
    base = type(tokenizer)

    class Shifted(base):
        def __call__(self, *args, **kwargs):
            enc = super().__call__(*args, **kwargs)
            enc["input_ids"] = enc["input_ids"] + 1
            return enc

    tokenizer.__class__ = Shifted
    encoder = Encoder(tokenizer)
    assert encoder.backend(LENGTH) is None
    got = encoder(dev_texts[:8], None, LENGTH, NAMES)
    assert np.array_equal(got["input_ids"], hf_arrays(tokenizer, dev_texts[:8], None, LENGTH, NAMES)["input_ids"])
    tokenizer.__class__ = base
    assert np.array_equal(got["input_ids"] - 1, hf_arrays(tokenizer, dev_texts[:8], None, LENGTH, NAMES)["input_ids"])


def test_wordpiece_tokens_encode_as_before(minilm, dev_texts):
    """The students' encode (ids, mask, type ids as torch tensors) on the direct call: transformers' arrays."""
    tokens = WordPieceTokens.from_dir(minilm, max_length=LENGTH)
    for batch in (dev_texts[:1], dev_texts[:64]):
        ids, mask, types = tokens.encode(batch)
        want = hf_arrays(tokens.tokenizer, batch, None, LENGTH, NAMES)
        assert np.array_equal(ids.numpy(), want["input_ids"]) and mask.dtype.is_floating_point is False
        assert np.array_equal(mask.numpy(), want["attention_mask"].astype(bool))
        assert np.array_equal(types.numpy(), want["token_type_ids"])
    assert tokens.encoder.backend(LENGTH) is not None


def test_direct_false_always_takes_transformers_call(minilm, dev_texts):
    """The benchmarks' baseline (benchmarks/latency.py --tokenizer-baseline): the same arrays, no backend."""
    tokenizer = WordPieceTokens.from_dir(minilm, max_length=LENGTH).tokenizer
    encoder = Encoder(tokenizer, direct=False)
    assert encoder.backend(LENGTH) is None
    same_arrays(encoder, tokenizer, dev_texts[:64])
