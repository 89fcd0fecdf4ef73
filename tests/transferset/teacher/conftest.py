import pytest

from transferset.teacher import testing


@pytest.fixture(scope="session")
def tiny_teacher(tmp_path_factory):
    """A tiny randomly initialised BERT classifier saved with save_pretrained (safetensors)."""
    return testing.tiny_classifier(str(tmp_path_factory.mktemp("tiny_teacher")))


@pytest.fixture(scope="session")
def reference(tiny_teacher):
    """The plain Hugging Face path the scorer must agree with: model(**tokenizer(text)) one row at a time."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_teacher)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_teacher).eval()

    def run(text, text_b=None, max_length=128):
        with torch.no_grad():
            enc = tok(text, text_b, truncation=True, max_length=max_length, return_tensors="pt")
            out = model(**enc, output_hidden_states=True)
        return out.logits[0].numpy(), [h[0].numpy() for h in out.hidden_states]  # (C,), [(T, H)] per layer

    return run
