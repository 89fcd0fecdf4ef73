"""transferset.models.pruning: attention heads ranked, removed and loaded again, on tiny real BERT classifiers."""
import numpy as np
import pytest
import torch

from transferset import testing
from transferset.models import loading, pruning
from transferset.teacher.scoring import Teacher
from tolerances import tiny_bert

TEXTS = ["a good movie", "the worst film ever made , dull and too long", "i love this story", "not funny at all"]
HEADS, SIZE = 4, 8  # tiny_classifier(hidden_size=32, num_heads=4): head size 8


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = testing.tiny_classifier(str(tmp_path_factory.mktemp("tiny")), num_heads=HEADS, num_layers=2)
    model = loading.load_classifier(path).eval()
    tokenizer = loading.load_tokenizer(path)
    return path, model, tokenizer


def inputs(tokenizer):
    return tokenizer(TEXTS, padding=True, return_tensors="pt")


def head_rows(head: int) -> slice:
    return slice(head * SIZE, (head + 1) * SIZE)


def test_pruning_keeps_exactly_the_original_slices_of_the_kept_heads(tiny):
    _, model, _ = tiny
    pruned = pruning.prune_heads(model, {0: [1, 3], 1: [0]})
    assert pruned.config.kept_heads == [[0, 2], [1, 2, 3]]
    old, new = model.state_dict(), pruned.state_dict()
    for layer, kept in enumerate(pruned.config.kept_heads):
        prefix = f"bert.encoder.layer.{layer}.attention."
        for proj in ("query", "key", "value"):
            for part in ("weight", "bias"):
                key = f"{prefix}self.{proj}.{part}"
                assert new[key].shape[0] == len(kept) * SIZE
                assert torch.equal(new[key], torch.cat([old[key][head_rows(h)] for h in kept]))
        key = f"{prefix}output.dense.weight"
        assert torch.equal(new[key], torch.cat([old[key][:, head_rows(h)] for h in kept], dim=1))
        assert torch.equal(new[f"{prefix}output.dense.bias"], old[f"{prefix}output.dense.bias"])
    untouched = [k for k in old if ".attention.self." not in k and ".attention.output.dense.weight" not in k]
    assert untouched and all(torch.equal(old[k], new[k]) for k in untouched)
    assert model.bert.encoder.layer[0].attention.self.query.out_features == HEADS * SIZE  # the input is left whole


def test_the_pruned_model_is_the_original_with_those_heads_masked(tiny):
    _, model, tokenizer = tiny
    batch = inputs(tokenizer)
    pruned = pruning.prune_heads(model, {0: [1, 3], 1: [0]})
    with torch.no_grad():
        whole = model(**batch).logits
        with pruning.head_gates(model, {0: torch.tensor([1.0, 0, 1, 0]), 1: torch.tensor([0.0, 1, 1, 1])}):
            masked = model(**batch).logits
        out = pruned(**batch).logits
    # pruned matmuls have other shapes than the masked ones: reordered sums (tests/tolerances.py)
    assert torch.allclose(out, masked, atol=tiny_bert(masked.numpy()), rtol=0)
    assert (out - whole).abs().max() > 0.1  # the removed heads mattered: the equality above says something


def test_pruning_a_pruned_model_again_removes_original_head_indices(tiny):
    _, model, tokenizer = tiny
    batch = inputs(tokenizer)
    twice = pruning.prune_heads(pruning.prune_heads(model, {0: [1]}), {0: [3], 1: [2]})
    once = pruning.prune_heads(model, {0: [1, 3], 1: [2]})
    assert twice.config.kept_heads == once.config.kept_heads == [[0, 2], [0, 1, 3]]
    with torch.no_grad():
        assert torch.equal(twice(**batch).logits, once(**batch).logits)
    with pytest.raises(ValueError, match=r"heads \[1\] are not in the model"):
        pruning.prune_heads(twice, {0: [1]})


def test_importance_is_the_sum_over_rows_of_each_rows_absolute_gradient(tiny):
    _, model, tokenizer = tiny
    batch = dict(inputs(tokenizer), labels=torch.tensor([1, 0, 1, 0]))
    together = pruning.head_importance(model, [batch])
    alone = sum(pruning.head_importance(model, [{k: v[i:i + 1] for k, v in batch.items()}]) for i in range(len(TEXTS)))
    # a batch of 4 against 4 batches of one: the forward's and the backward's sums (as many again) reordered,
    # on gradients of the scale of the importances (tests/tolerances.py)
    np.testing.assert_allclose(together, alone, rtol=0, atol=2 * tiny_bert(alone))
    # Against the gradient of one gate vector shared by the batch: |Σ_rows| is not Σ_rows |.|.
    gates = {layer: torch.ones(HEADS, requires_grad=True) for layer in range(2)}
    with pruning.head_gates(model, gates):
        torch.nn.functional.cross_entropy(model(**inputs(tokenizer)).logits, batch["labels"], reduction="sum").backward()
    shared = np.stack([gates[layer].grad.abs().numpy() for layer in range(2)])
    assert np.all(shared <= together + 2 * tiny_bert(together)) and not np.allclose(shared, together)


def test_the_ranking_picks_the_heads_that_cannot_change_the_output(tiny):
    path, _, tokenizer = tiny
    model = loading.load_classifier(path).eval()
    with torch.no_grad():  # heads (0, 2) and (1, 1) write nothing: zero columns of the output projection
        model.bert.encoder.layer[0].attention.output.dense.weight[:, head_rows(2)] = 0
        model.bert.encoder.layer[1].attention.output.dense.weight[:, head_rows(1)] = 0
    batch = dict(inputs(tokenizer), labels=torch.tensor([1, 0, 1, 0]))
    importance = pruning.head_importance(model, [batch])
    assert importance[0, 2] == importance[1, 1] == 0.0
    assert (np.delete(importance.reshape(-1), [2, HEADS + 1]) > 0).all()
    assert pruning.least_important(importance, 2) == {0: [2], 1: [1]}
    # "predicted" (the model's own labels) ranks them last too
    assert pruning.least_important(pruning.head_importance(model, [batch], loss="predicted"), 2) == {0: [2], 1: [1]}


def test_least_important_normalises_per_layer_and_keeps_a_head_in_every_layer():
    importance = np.array([[10.0, 20.0, 30.0, 40.0],   # large gradients
                           [0.1, 0.2, 0.3, 0.04]])     # small ones: raw ranking would empty this layer
    assert pruning.least_important(importance, 3, normalize=False) == {1: [0, 1, 3]}
    # normalised (each row / its L2 norm): 10/54.8 = .18 < .2/.38 ... the two layers interleave
    assert pruning.least_important(importance, 3) == {0: [0], 1: [0, 3]}
    assert pruning.least_important(np.zeros((2, 4)), 6) == {0: [0, 1, 2], 1: [0, 1, 2]}
    with pytest.raises(ValueError, match="at most 6 can go"):
        pruning.least_important(importance, 7)
    assert pruning.heads_to_remove(0.25, 72) == 18 and pruning.heads_to_remove(5, 72) == 5
    with pytest.raises(ValueError, match="a number of heads"):
        pruning.heads_to_remove(2.5, 72)


def test_a_pruned_model_saves_and_loads_again_and_predicts_the_same(tiny, tmp_path):
    from transformers import AutoModelForSequenceClassification

    _, model, tokenizer = tiny
    batch = inputs(tokenizer)
    pruned = pruning.prune_heads(model, {0: [0, 1, 2], 1: [3]})
    pruned.save_pretrained(str(tmp_path))
    tokenizer.save_pretrained(str(tmp_path))
    again = loading.load_classifier(str(tmp_path)).eval()  # transferset's loader
    auto = AutoModelForSequenceClassification.from_pretrained(str(tmp_path)).eval()  # transformers' own, registered
    assert type(again).__name__ == type(auto).__name__ == "PrunedBertForSequenceClassification"
    assert again.config.kept_heads == [[3], [0, 1, 2]]
    assert again.bert.encoder.layer[0].attention.self.query.out_features == SIZE
    with torch.no_grad():
        expect = pruned(**batch).logits
        assert torch.equal(again(**batch).logits, expect) and torch.equal(auto(**batch).logits, expect)
    assert sum(p.numel() for p in again.parameters()) < sum(p.numel() for p in model.parameters())


def test_the_packed_scorer_serves_a_pruned_teacher_and_its_probe_checks_it(tiny, tmp_path):
    _, model, tokenizer = tiny
    pruned = pruning.prune_heads(model, {0: [1, 3], 1: [0]})
    pruned.save_pretrained(str(tmp_path))
    tokenizer.save_pretrained(str(tmp_path))
    packed = Teacher.load(str(tmp_path), forward="packed")
    assert packed.packed is not None
    padded = Teacher.load(str(tmp_path), forward="padded")
    want = padded.predict(TEXTS).logits
    np.testing.assert_allclose(packed.predict(TEXTS).logits, want, atol=tiny_bert(want), rtol=0)  # reordered sums: tests/tolerances.py
    with torch.no_grad():
        want = pruned(**inputs(tokenizer)).logits.numpy()
        np.testing.assert_allclose(padded.predict(TEXTS).logits, want, atol=tiny_bert(want), rtol=0)  # reordered sums: tests/tolerances.py
    # The probe is what guards it: a packed layer reading the unpruned head count would differ, and is refused.
    from transferset import packed as packed_path

    broken = pruning.prune_heads(model, {0: [1, 3], 1: [0]})
    broken.bert.encoder.layer[0].attention.self.num_attention_heads = 1  # a wrong head count in the packed layer
    built, why = packed_path.PackedBert.build(broken, tokenizer)
    assert built is None and "probe" in why
