"""MLM candidates from a RoBERTa-style masked LM: a byte-level BPE vocabulary ("Ġ" marks a word's first
piece), served padding-free. The tokenizer is trained on SST-2 sentences in the test (no download)."""
import itertools

import pytest

from transferset.augment.mlm import MlmCandidates, word_start_marker


@pytest.fixture(scope="module")
def roberta_mlm_dir(tmp_path_factory, sst2_dir):
    import torch
    from tokenizers import AddedToken, ByteLevelBPETokenizer
    from transformers import RobertaConfig, RobertaForMaskedLM, RobertaTokenizerFast

    with open(sst2_dir / "train.tsv", encoding="utf-8") as fh:
        sentences = [line.split("\t")[0] for line in itertools.islice(fh, 1, 3001)]
    d = tmp_path_factory.mktemp("roberta_mlm")
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(sentences, vocab_size=800, min_frequency=2,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"], show_progress=False)
    bpe.save_model(str(d))
    # transformers 5 takes the files as `vocab` and `merges`; <mask> absorbs the space before it, as RoBERTa's does
    tok = RobertaTokenizerFast(vocab=str(d / "vocab.json"), merges=str(d / "merges.txt"),
                               mask_token=AddedToken("<mask>", lstrip=True, rstrip=False))
    assert tok.tokenize(" film") == ["Ġfilm"] and tok("a <mask> film")["input_ids"][2] == tok.mask_token_id
    torch.manual_seed(0)
    cfg = RobertaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=130, pad_token_id=tok.pad_token_id,
                        initializer_range=0.2)
    RobertaForMaskedLM(cfg).save_pretrained(d)
    tok.save_pretrained(d)
    return str(d)


def test_roberta_style_candidates_are_whole_words_and_the_packed_path_gives_the_padded_ones(roberta_mlm_dir):
    packed = MlmCandidates(roberta_mlm_dir, top_k=5, batch_size=8, max_length=64)
    padded = MlmCandidates(roberta_mlm_dir, top_k=5, batch_size=8, max_length=64, forward="padded")
    assert packed.forward_path == "packed" and packed.word_start == "Ġ"
    sentences = [s.split() for s in ("the movie is a charming and funny story", "a dull film with bad acting",
                                     "this is the best film of the year")]
    got, want = packed.candidates(sentences), padded.candidates(sentences)
    assert got == want
    assert sum(len(table) for table in got) >= 5  # eligible words found in every sentence
    for words, table in zip(sentences, got):
        for i, cands in table.items():
            # whole words, never a piece with its marker or a continuation, never the word itself
            assert len(cands) == 5 and all(c.isalpha() and words[i] not in (c, c.lower()) for c in cands), cands
    assert "film" in packed.tokenizer.tokenize(" film")[0] and packed.eligible(["the", "film"]) == [1]


def test_word_start_marker_of_each_vocabulary_kind():
    assert word_start_marker({"Ġfilm": 0, "Ġthe": 1, "ing": 2}) == "Ġ"
    assert word_start_marker({"▁film": 0, "▁the": 1, "ing": 2}) == "▁"
    assert word_start_marker({"film": 0, "the": 1, "##ing": 2}) == ""
