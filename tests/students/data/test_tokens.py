"""Student tokens and embedding initialisation from the teacher."""
import numpy as np
import pytest
import torch

from students.data.tokens import WordPieceTokens, WordTokens, pca_project, teacher_input_embeddings


def test_pca_project_orders_components_by_variance_and_scales_to_unit_std():
    g = torch.Generator().manual_seed(0)
    # Variance 9 along axis 2, 1 along axis 0, 0.01 along axis 1.
    table = torch.randn(500, 3, generator=g) * torch.tensor([1.0, 0.1, 3.0])
    out = pca_project(table, 2)
    assert out.shape == (500, 2)
    assert out.std().item() == pytest.approx(1.0, rel=1e-5)
    var = out.var(0)
    assert var[0] > 5 * var[1]
    # The first component is (up to sign) the high-variance axis.
    corr = np.corrcoef(out[:, 0].numpy(), table[:, 2].numpy())[0, 1]
    assert abs(corr) > 0.99
    wide = pca_project(table, 5)
    assert wide.shape == (500, 5) and torch.equal(wide[:, :2], pca_project(table, 3)[:, :2])


def test_trimmed_wordpiece_maps_unseen_ids_to_unk_and_keeps_teacher_rows(minilm):
    tokens = WordPieceTokens.from_dir(minilm, max_length=16)
    seen = tokens.seen_ids([["a good film"]])
    trimmed = WordPieceTokens(tokens.tokenizer, 16, keep=seen)
    assert trimmed.vocab_size == len(set(seen) | {0, 100, 101, 102})  # + [PAD] [UNK] [CLS] [SEP]
    ids, mask, _ = trimmed.encode(["a good film", "a terrible film"])
    full, _, _ = tokens.encode(["a good film", "a terrible film"])
    unk = trimmed.keep.index(tokens.tokenizer.unk_token_id)
    assert ids[1, 2].item() == unk                        # "terrible" was never seen
    assert [trimmed.keep[i] for i in ids[0][mask[0]].tolist()] == full[0][mask[0]].tolist()
    assert trimmed.pad_id == trimmed.keep.index(0)


def test_word_tokens_vocabulary_is_counted_and_deterministic():
    tok = WordTokens.build(["The film, the end.", "the film"], max_length=4)
    assert tok.vocab[:6] == ["[PAD]", "[UNK]", "[SEP]", "the", "film", ","]
    ids, mask, _ = tok.encode(["the film rocks !", ""])
    assert ids[0].tolist() == [3, 4, 1, 1] and ids[1].tolist() == [1, 0, 0, 0]
    assert mask.sum(1).tolist() == [4, 1]


def test_the_augmenters_mask_token_is_one_word_and_not_the_word_mask():
    tok = WordTokens.build(["a [MASK] film", "the mask [ slips ]"], max_length=8)
    assert WordTokens.split("a [MASK] film") == ["a", "[mask]", "film"]
    assert WordTokens.split("the mask [ slips ]") == ["the", "mask", "[", "slips", "]"]
    ids, _, _ = tok.encode(["[MASK] mask"])
    assert ids[0, 0] != ids[0, 1] and tok.vocab[ids[0, 0]] == "[mask]" and tok.vocab[ids[0, 1]] == "mask"


def test_teacher_input_embeddings_read_from_safetensors_without_running_the_teacher(minilm):
    table = teacher_input_embeddings(minilm)
    assert tuple(table.shape) == (30522, 384) and table.dtype == torch.float32


def test_trimmed_byte_level_bpe_without_an_unknown_token_maps_unseen_pieces_to_padding(sst2_sentences):
    """GPT-2-style byte-level BPE has no unknown token: trimming must still work (unseen pieces → the zero row)."""
    import builders as testing

    tok = testing.train_tokenizer("roberta", sst2_sentences)
    tok.unk_token = None
    assert tok.unk_token_id is None
    full = WordPieceTokens(tok, 16)
    seen = full.seen_ids([["a good film"]])
    trimmed = WordPieceTokens(tok, 16, keep=seen)
    assert trimmed.vocab_size == len(set(seen) | {tok.pad_token_id})
    ids, mask, _ = trimmed.encode(["a good film", "a terrible film"])
    whole, _, _ = full.encode(["a good film", "a terrible film"])
    assert [trimmed.keep[i] for i in ids[0][mask[0]].tolist()] == whole[0][mask[0]].tolist()
    unseen = [i for i, t in zip(ids[1][mask[1]].tolist(), whole[1][mask[1]].tolist()) if t not in seen]
    assert unseen and set(unseen) == {trimmed.pad_id}


def test_word_tokens_over_texts_of_no_word_are_refused():
    from transferset.runtime.errors import UserError

    with pytest.raises(UserError, match="hold no word"):
        WordTokens.build(["", "  \n"], max_length=4)
