"""The transformer student: a k-layer Hugging Face copy of the teacher, initialised from its layers."""
import pytest
import torch

from students.data.tokens import teacher_state
from students.families import transformer, transformer_layers, transformer_maps
from tolerances import assert_reordered  # tests/tolerances.py: a bound from the arithmetic


def _teacher(path):
    from transformers import AutoConfig, AutoModelForSequenceClassification

    return AutoConfig.from_pretrained(path), AutoModelForSequenceClassification.from_pretrained(path).eval()


def test_student_with_all_teacher_layers_reproduces_the_teacher(tiny_teacher4):
    """init first with k = all layers copies every weight: same logits, same [CLS] per layer."""
    from transformers import AutoTokenizer

    tconf, teacher = _teacher(tiny_teacher4)
    student = transformer.make_model(tconf, transformer.TransformerConfig(n_layer=4, init="first"), ["0", "1"])
    copied = transformer.load_teacher(student, teacher_state(tiny_teacher4), [1, 2, 3, 4])
    assert len(copied) == len(list(student.parameters()))  # embeddings, 4 layers, pooler, classifier
    student.eval()
    enc = AutoTokenizer.from_pretrained(tiny_teacher4)(["a good film", "the plot is dull and bad"], padding=True,
                                                       return_tensors="pt")
    with torch.no_grad():
        ref = teacher(**enc, output_hidden_states=True)
        out = transformer_layers.forward(student, enc["input_ids"], enc["attention_mask"].bool(), enc["token_type_ids"])
    # our forward against transformers' modules: the same sums in another order (tests/tolerances.py)
    assert_reordered(out["logits"], ref.logits, layers=4)
    assert out["cls_layers"].shape == (2, 4, 32) and out["repr"].shape == (2, 32)
    for j in range(4):
        assert_reordered(out["cls_layers"][:, j], ref.hidden_states[j + 1][:, 0], layers=j + 1)
    assert_reordered(out["repr"], ref.hidden_states[-1][:, 0], layers=4)


def test_skip_copies_every_second_layer_and_random_copies_nothing(tiny_teacher4):
    tconf, teacher = _teacher(tiny_teacher4)
    state = teacher_state(tiny_teacher4)
    skip = transformer.make_model(tconf, transformer.TransformerConfig(n_layer=2, init="skip"), ["0", "1"])
    transformer.load_teacher(skip, state, transformer_maps.teacher_layer_map(2, 4, "skip"))
    assert skip.config.num_hidden_layers == 2 and skip.config.id2label == {0: "0", 1: "1"}
    for j, k in enumerate([2, 4]):
        torch.testing.assert_close(skip.bert.encoder.layer[j].intermediate.dense.weight,
                                   teacher.bert.encoder.layer[k - 1].intermediate.dense.weight)
    torch.testing.assert_close(skip.bert.embeddings.word_embeddings.weight,
                               teacher.bert.embeddings.word_embeddings.weight)
    torch.testing.assert_close(skip.classifier.weight, teacher.classifier.weight)
    # Without the classifier, and for another label set, the head stays fresh.
    fresh = transformer.make_model(tconf, transformer.TransformerConfig(n_layer=2, copy_classifier=False), ["0", "1"])
    copied = transformer.load_teacher(fresh, state, [2, 4], copy_classifier=False)
    assert "classifier.weight" not in copied and not torch.equal(fresh.classifier.weight, teacher.classifier.weight)
    three = transformer.make_model(tconf, transformer.TransformerConfig(n_layer=2), ["a", "b", "c"])
    assert "classifier.weight" not in transformer.load_teacher(three, state, [2, 4])
    rand = transformer.make_model(tconf, transformer.TransformerConfig(n_layer=2, init="random"), ["0", "1"])
    assert not torch.equal(rand.bert.encoder.layer[0].intermediate.dense.weight,
                           teacher.bert.encoder.layer[1].intermediate.dense.weight)


def test_load_teacher_refuses_weights_of_another_architecture(tiny_teacher4):
    tconf, _ = _teacher(tiny_teacher4)
    student = transformer.make_model(tconf, transformer.TransformerConfig(n_layer=2), ["0", "1"])
    state = {k: v for k, v in teacher_state(tiny_teacher4).items() if "encoder.layer.3." not in k}
    with pytest.raises(ValueError, match=r"teacher weights lack \['bert.encoder.layer.1"):
        transformer.load_teacher(student, state, [2, 4])


def test_base_model_state_without_prefix_loads_too(tiny_teacher4):
    """A teacher saved as BertModel (keys without `bert.`, e.g. MiniLM) maps onto the student."""
    tconf, teacher = _teacher(tiny_teacher4)
    bare = {k[len("bert."):]: v for k, v in teacher_state(tiny_teacher4).items() if k.startswith("bert.")}
    student = transformer.make_model(tconf, transformer.TransformerConfig(n_layer=2), ["0", "1"])
    copied = transformer.load_teacher(student, bare, [2, 4])
    assert "bert.pooler.dense.weight" in copied and "classifier.weight" not in copied
    torch.testing.assert_close(student.bert.encoder.layer[1].output.dense.weight,
                               teacher.bert.encoder.layer[3].output.dense.weight)


@pytest.mark.integration
def test_student_from_all_minilm_layers_reproduces_its_cls_states(minilm):
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    bert = AutoModel.from_pretrained(minilm).eval()
    student = transformer.make_model(AutoConfig.from_pretrained(minilm), transformer.TransformerConfig(n_layer=6),
                                ["0", "1"]).eval()
    transformer.load_teacher(student, teacher_state(minilm), list(range(1, 7)))
    enc = AutoTokenizer.from_pretrained(minilm)(["a gripping , funny film", "dull"], padding=True, return_tensors="pt")
    with torch.no_grad():
        ref = bert(**enc, output_hidden_states=True).hidden_states
        out = transformer_layers.forward(student, enc["input_ids"], enc["attention_mask"].bool(), enc["token_type_ids"])
    for j in range(6):
        assert_reordered(out["cls_layers"][:, j], ref[j + 1][:, 0], layers=j + 1)
