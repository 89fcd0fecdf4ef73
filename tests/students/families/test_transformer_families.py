"""The transformer student cut from a teacher of each encoder family (transferset.testing.FAMILIES): layers
copied by the layer map whatever the family calls its layer list, parameter groups per layer, the attention
capture of the layer losses, dropout and shape settings under each family's own config names."""
import functools
from types import SimpleNamespace

import pytest
import torch

import builders as testing
from students.data.tokens import teacher_input_embeddings, teacher_state
from students.families import transformer, transformer_layers, transformer_maps
from students.losses import layers as layer_losses

FAMILIES = tuple(testing.FAMILIES)
PAIRS = (["a gripping , beautifully acted film", "dull"], ["the story", "not bad at all , really"])


@functools.lru_cache(maxsize=None)
def _teacher(path):
    """(config, model, tokenizer) of a teacher folder, loaded once: no test changes them."""
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    return (AutoConfig.from_pretrained(path), AutoModelForSequenceClassification.from_pretrained(path).eval(),
            AutoTokenizer.from_pretrained(path))


def _inputs(tok):
    enc = tok(*PAIRS, padding=True, return_tensors="pt", return_token_type_ids=True)
    return enc["input_ids"], enc["attention_mask"].bool(), enc["token_type_ids"]


@pytest.mark.parametrize("family", FAMILIES)
def test_a_student_with_every_layer_of_the_teacher_is_the_teacher(family, family_teacher):
    """init first with all four layers: every parameter copied, and the teacher's logits and [CLS] states."""
    tconf, teacher, tok = _teacher(family_teacher(family))
    student = transformer.make_model(tconf, transformer.TransformerConfig(n_layer=4, init="first"), ["0", "1"],
                                     layers=[1, 2, 3, 4])
    copied = transformer.load_teacher(student, teacher_state(family_teacher(family)), [1, 2, 3, 4])
    assert len(copied) == len(list(student.parameters()))
    student.eval()
    ids, mask, types = _inputs(tok)
    with torch.no_grad():
        out = transformer_layers.forward(student, ids, mask, types)
        ref = transformer_layers.forward(teacher, ids, mask, types)
    torch.testing.assert_close(out["logits"], ref["logits"])
    torch.testing.assert_close(out["cls_layers"], ref["cls_layers"])
    assert out["cls_layers"].shape == (2, 4, 32)


@pytest.mark.parametrize("family", FAMILIES)
def test_skip_copies_every_second_layer_of_each_family(family, family_teacher):
    tconf, teacher, tok = _teacher(family_teacher(family))
    layer_map = transformer_maps.teacher_layer_map(2, 4, "skip")
    student = transformer.make_model(tconf, transformer.TransformerConfig(n_layer=2), ["0", "1"], layers=layer_map)
    transformer.load_teacher(student, teacher_state(family_teacher(family)), layer_map)
    ours, theirs = transformer_layers.encoder_layers(student), transformer_layers.encoder_layers(teacher)
    assert len(ours) == 2 and student.config.num_hidden_layers == 2
    for j, k in enumerate(layer_map):
        mine, source = ours[j].state_dict(), theirs[k - 1].state_dict()
        # ModernBERT's first layer has no attention norm (its embeddings end with one): a deeper layer moved
        # there leaves its norm behind.
        dropped = {"attn_norm.weight"} if family == "modernbert" and j == 0 else set()
        assert mine and set(mine) == set(source) - dropped
        for name in mine:
            torch.testing.assert_close(mine[name], source[name], msg=f"{family} layer {j} {name}")
    torch.testing.assert_close(student.get_input_embeddings().weight, teacher.get_input_embeddings().weight)
    if getattr(tconf, "layer_types", None) is not None:
        # ModernBERT: each layer keeps its attention (global or sliding window) from the teacher layer it copies.
        assert student.config.layer_types == [tconf.layer_types[k - 1] for k in layer_map]
        assert [m.attn.config.layer_types[i] for i, m in enumerate(ours)] == student.config.layer_types
    # The cut student runs on pairs of the family's tokenizer.
    ids, mask, types = _inputs(tok)
    with torch.no_grad():
        assert torch.isfinite(transformer_layers.forward(student.eval(), ids, mask, types)["logits"]).all()


@pytest.mark.parametrize("family", FAMILIES)
def test_parameter_groups_hold_one_group_per_layer_in_each_family(family, family_teacher):
    tconf, _, _ = _teacher(family_teacher(family))
    model = transformer.make_model(tconf, transformer.TransformerConfig(n_layer=2, init="random"), ["0", "1"])
    groups = transformer.param_groups(model)
    assert list(groups) == ["embeddings", "encoder.1", "encoder.2", "head", "classifier"]
    layers = transformer_layers.encoder_layers(model)
    for j in (1, 2):
        # Encoder-wide parameters (DeBERTa's relative embeddings, MPNet's attention bias) go with the top layer.
        assert {id(p) for p in layers[j - 1].parameters()} <= {id(p) for p in groups[f"encoder.{j}"]}
    assert {id(p) for p in model.get_input_embeddings().parameters()} <= {id(p) for p in groups["embeddings"]}
    everything = [id(p) for g in groups.values() for p in g]
    assert sorted(everything) == sorted(id(p) for p in model.parameters())


@pytest.mark.parametrize("family", FAMILIES)
def test_attention_capture_and_the_layer_losses_work_in_each_family(family, family_teacher):
    """Q, K and V of each captured layer, (B, heads, L, d_k), for separate projections and fused ones (ModernBERT's
    Wqkv); the TinyBERT and MiniLM losses between a cut student and its teacher are finite."""
    tconf, teacher, tok = _teacher(family_teacher(family))
    student = transformer.make_model(tconf, transformer.TransformerConfig(n_layer=2), ["0", "1"], layers=[2, 4])
    transformer.load_teacher(student, teacher_state(family_teacher(family)), [2, 4])
    ids, mask, types = _inputs(tok)
    with torch.no_grad():
        t = transformer_layers.forward(teacher, ids, mask, types, states=[2, 4])
        s = transformer_layers.forward(student.eval(), ids, mask, types, states=[1, 2])
    assert sorted(t["qkv"]) == [2, 4] and sorted(s["qkv"]) == [1, 2]
    for q, k, v in t["qkv"].values():
        assert q.shape == k.shape == v.shape == (2, 2, ids.shape[1], 16)
    # The student's layer 2 is the teacher's layer 4 with the same input only at layer 1 → 2 of the teacher;
    # what must hold anywhere: the losses are finite and the same states give zero.
    ts = layer_losses.States(t["hidden_states"], t["qkv"])
    ss = layer_losses.States(s["hidden_states"], s["qkv"])
    for loss in (layer_losses.attention_mse, layer_losses.dist_kl):
        assert float(loss(ts.scores(4), ts.scores(4), mask)) == pytest.approx(0.0, abs=1e-6)
        assert torch.isfinite(loss(ss.scores(2), ts.scores(4), mask))
    assert torch.isfinite(layer_losses.value_kl(ss.values(2), ts.values(4), mask))
    assert torch.isfinite(layer_losses.hidden_mse(s["hidden_states"][2], t["hidden_states"][4], mask))


@pytest.mark.parametrize("family", FAMILIES)
def test_dropout_and_a_narrower_shape_reach_each_familys_config(family, family_teacher):
    tconf, teacher, _ = _teacher(family_teacher(family))
    cfg = transformer.TransformerConfig(n_layer=2, init="random", dropout=0.3, hidden_size=16, num_attention_heads=2,
                                        intermediate_size=24)
    assert transformer.reshaped(cfg, tconf) == ["hidden_size", "intermediate_size"]
    model = transformer.make_model(tconf, cfg, ["0", "1"])
    assert model.config.hidden_size == 16
    assert transformer.shape_value(model.config, "intermediate_size") == 24
    # Every dropout of the encoder (the classifier heads have their own settings).
    assert {m.p for m in model.base_model.modules() if isinstance(m, torch.nn.Dropout)} == {0.3}
    # A narrower student's embeddings start from the teacher's on its principal axes (any family's table name).
    done = transformer.project_embeddings(model, teacher_state(family_teacher(family)))
    table = teacher.get_input_embeddings().weight
    assert any(name.endswith(("word_embeddings.weight", "tok_embeddings.weight")) for name in done)
    if table.shape[1] >= 16:
        from students.data.tokens import pca_basis

        torch.testing.assert_close(model.get_input_embeddings().weight.detach(), table.detach() @ pca_basis(table, 16))


@pytest.mark.parametrize("family", ["deberta-v2", "modernbert"])
def test_the_teachers_embedding_rows_beyond_its_tokenizer_are_cut(family, family_teacher):
    """DeBERTa-v3 and ModernBERT checkpoints have more embedding rows than tokens: the BiLSTM's table has one per token."""
    from transformers import AutoTokenizer

    path = family_teacher(family)
    tokens = len(AutoTokenizer.from_pretrained(path))
    full = teacher_input_embeddings(path)
    assert full.shape[0] > tokens
    torch.testing.assert_close(teacher_input_embeddings(path, tokens), full[:tokens])
    # Fewer rows than tokens: the tokenizer is not the teacher's, said with the remedy.
    from transferset.runtime.errors import UserError

    with pytest.raises(UserError, match=rf"have {full.shape[0]} rows and the tokenizer {full.shape[0] + 1} tokens.*"
                                        r"set `tokenizer:`.*embed_init: random"):
        teacher_input_embeddings(path, full.shape[0] + 1)


def test_a_family_whose_layers_cannot_be_found_is_refused_with_what_to_do():
    class Odd(torch.nn.Module):
        base_model_prefix = "odd"

        def __init__(self):
            super().__init__()
            self.odd = torch.nn.Module()
            self.odd.blocks = torch.nn.ModuleList([torch.nn.Linear(2, 2)])
            self.config = SimpleNamespace(num_hidden_layers=1)

        @property
        def base_model(self):
            return self.odd

    with pytest.raises(ValueError, match=r"Odd: its layers are in none of encoder.layer, transformer.layer, layers.*"
                                         r"init: random.*pretrained"):
        transformer.load_teacher(Odd(), {}, [1])
    assert list(transformer.param_groups(Odd())) == ["embeddings", "encoder", "head", "classifier"]
