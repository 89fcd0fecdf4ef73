"""Students' forward passes: teacher initialisation, padding independence, tokens, PCA init."""
import numpy as np
import pytest
import torch

from students import bilstm, transformer
from students.tokens import WordPieceTokens, WordTokens, pca_project, teacher_input_embeddings


def test_teacher_layer_map_skip_keeps_every_mth_layer_ending_at_the_top():
    assert transformer.teacher_layer_map(3, 6, "skip") == [2, 4, 6]
    assert transformer.teacher_layer_map(2, 6, "skip") == [3, 6]
    assert transformer.teacher_layer_map(4, 12, "skip") == [3, 6, 9, 12]
    assert transformer.teacher_layer_map(3, 6, "first") == [1, 2, 3]
    with pytest.raises(ValueError, match="7-layer student"):
        transformer.teacher_layer_map(7, 6, "skip")


@pytest.mark.integration
def test_transformer_initialised_from_all_teacher_layers_reproduces_minilm(minilm):
    from transformers import AutoModel, AutoTokenizer

    from students.tokens import teacher_state

    path = minilm
    tok = AutoTokenizer.from_pretrained(path)
    bert = AutoModel.from_pretrained(path).eval()
    c = bert.config
    student = transformer.Transformer(transformer.TransformerConfig(
        vocab_size=c.vocab_size, n_layer=6, n_head=c.num_attention_heads, d_model=c.hidden_size,
        d_ff=c.intermediate_size, teacher_layers=6, init="first")).eval()
    student.load_teacher(teacher_state(path), transformer.teacher_layer_map(6, 6, "first"))
    enc = tok(["a gripping , funny film", "dull"], padding=True, return_tensors="pt")
    with torch.no_grad():
        ref = bert(**enc, output_hidden_states=True).hidden_states
        out = student(enc["input_ids"], enc["attention_mask"].bool(), enc["token_type_ids"])
    for j in range(6):
        torch.testing.assert_close(out["cls_layers"][:, j], ref[j + 1][:, 0], atol=1e-4, rtol=1e-4)
    # "skip" with 3 layers copies teacher layers 2, 4, 6: its first layer is the teacher's second.
    skip = transformer.Transformer(transformer.TransformerConfig(n_layer=3, init="skip")).eval()
    skip.load_teacher(teacher_state(path), [2, 4, 6])
    torch.testing.assert_close(skip.layers[0].intermediate.weight, bert.encoder.layer[1].intermediate.dense.weight)


@pytest.mark.parametrize("pool", ["max", "last"])
def test_bilstm_prediction_does_not_depend_on_padding_or_batch(pool):
    torch.manual_seed(0)
    model = bilstm.BiLSTM(bilstm.BiLSTMConfig(vocab_size=40, embed_dim=8, hidden=6, head_dim=5, pool=pool)).eval()
    ids = torch.tensor([[5, 6, 7, 0, 0, 0], [9, 10, 11, 12, 13, 14]])
    mask = ids != 0
    with torch.no_grad():
        both = model(ids, mask)["logits"]
        alone = model(ids[:1, :3], mask[:1, :3])["logits"]
    torch.testing.assert_close(both[:1], alone, atol=1e-6, rtol=0)
    assert not torch.allclose(both[0], both[1])


def test_bilstm_presets_tang_and_xtremedistil():
    tang = bilstm.BiLSTM(bilstm.BiLSTMConfig(vocab_size=100, **bilstm.PRESETS["tang"]))
    assert tang.embed.embedding_dim == 300 and tang.lstm.hidden_size == 150 and tang.lstm.num_layers == 1
    assert tang.head.out_features == 200 and tang.config.head_act == "relu" and tang.config.pool == "last"
    xd = bilstm.BiLSTM(bilstm.BiLSTMConfig(vocab_size=100, **bilstm.PRESETS["xtremedistil"]))
    assert xd.config.pool == "max" and xd.config.head_act == "gelu" and xd.head.out_features == 384


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


def test_teacher_input_embeddings_read_from_safetensors_without_running_the_teacher(minilm):
    table = teacher_input_embeddings(minilm)
    assert tuple(table.shape) == (30522, 384) and table.dtype == torch.float32
