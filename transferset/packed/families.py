"""The classes the packed path serves, by family, and why any other takes the padded path; the probe rows
a packed path is checked on."""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np


PROBE_TEXTS = ("a short probe", "a somewhat longer probe sentence , to check the packed forward pass")
PROBE_PAIR = ("the first part", "and a second one")
PROBE_ATOL = 1e-4
# Weights in bfloat16 (a teacher scored at precision bf16): the packed path and the model's own forward round
# differently, 7.8e-3 apart on MPNet's logits; a wrong layout is off by the logits' own size.
PROBE_ATOL_BF16 = 0.05


def probe_atol(model) -> float:
    """How far the packed path's probe logits may be from the model's own, by the model's weights' dtype."""
    import torch

    return PROBE_ATOL if next(model.parameters()).dtype == torch.float32 else PROBE_ATOL_BF16


# The classes served padding-free, by family. A family is one embedding recipe and one layer layout;
# the classifier and MLM heads are the model's own modules. Encoder module names differ per family
# (bert, roberta, ...), hence the attribute of the base model alongside.
FAMILY_BASE = {"bert": "bert", "roberta": "roberta", "electra": "electra", "distilbert": "distilbert",
               "mpnet": "mpnet", "deberta-v2": "deberta", "modernbert": "model"}
CLASSIFIERS = {
    "BertForSequenceClassification": "bert",
    "RobertaForSequenceClassification": "roberta",
    "XLMRobertaForSequenceClassification": "roberta",
    "CamembertForSequenceClassification": "roberta",
    "ElectraForSequenceClassification": "electra",
    "DistilBertForSequenceClassification": "distilbert",
    "MPNetForSequenceClassification": "mpnet",
    "DebertaV2ForSequenceClassification": "deberta-v2",
    "ModernBertForSequenceClassification": "modernbert",
}
MASKED_LMS = {
    "BertForMaskedLM": "bert",
    "RobertaForMaskedLM": "roberta",
    "XLMRobertaForMaskedLM": "roberta",
    "CamembertForMaskedLM": "roberta",
    "ElectraForMaskedLM": "electra",
    "DistilBertForMaskedLM": "distilbert",
    "MPNetForMaskedLM": "mpnet",
}
PRUNED_BERT = ("transferset.models.pruning", "PrunedBertForSequenceClassification")
# Families people fine-tune that take the padded path, and why (the log says it).
NOT_SERVED = {
    "ModernBertForMaskedLM": "ModernBERT's MLM (its head and sparse prediction) has no packed path yet",
    "DebertaV2ForMaskedLM": "DeBERTa-v2's MLM head (tied to the embeddings, two head layouts) has no packed path yet",
    "DebertaFor": "DeBERTa v1 (a different disentangled attention) has no packed path",
}


def family_of(model, served: Optional[dict] = None) -> Optional[str]:
    """The family of `model` when its class is served (`served`: CLASSIFIERS by default), else None.
    A subclass or a remote-code class with the same name is not served: its forward may differ."""
    name = type(model).__name__
    served = CLASSIFIERS if served is None else served
    if served is CLASSIFIERS and (type(model).__module__, name) == PRUNED_BERT:
        # a head-pruned BERT (transferset.models.pruning): BERT's modules, narrower per layer; each packed layer
        # reads its head count from its own attention module, and the probe checks it
        return "bert"
    if name not in served or not type(model).__module__.startswith("transformers.models."):
        return None
    return served[name]


def unsupported(model, kind=None, needs_pooler: bool = True) -> Optional[str]:
    """Why `model` has no packed path, or None when it has one. `kind`: the classes served, CLASSIFIERS
    (default) or MASKED_LMS."""
    import torch

    served = kind or CLASSIFIERS
    family = family_of(model, served)
    if family is None:
        name = type(model).__name__
        known = next((why for key, why in NOT_SERVED.items() if name.startswith(key)), None)
        return (f"{name}: {known}" if known else
                f"{name} is not served padding-free (served: {', '.join(sorted(served))})")
    config = model.config
    if getattr(config, "is_decoder", False) or getattr(config, "add_cross_attention", False):
        return "a decoder (causal or cross attention)"
    base = getattr(model, FAMILY_BASE[family])
    if family == "bert" and needs_pooler and base.pooler is None:
        return "the model has no pooler"
    if family == "deberta-v2" and getattr(base.encoder, "conv", None) is not None:
        return "a DeBERTa-v2 with a convolution after its first layer (conv_kernel_size) has no packed path"
    if family == "modernbert" and config.classifier_pooling not in ("cls", "mean"):
        return f"ModernBERT's classifier_pooling {config.classifier_pooling!r} has no packed path"
    odd = sorted({type(m).__name__ for m in model.modules()
                  if isinstance(m, torch.nn.Linear) and type(m) is not torch.nn.Linear})
    if odd:
        return f"its linear layers are {', '.join(odd)} (quantized or wrapped)"
    return None


def probe_rows(model, tokenizer=None, texts: Sequence[str] = PROBE_TEXTS, pair=PROBE_PAIR) -> list[dict]:
    """Rows to check a packed path on: the tokenizer's encodings of the probe texts (real special
    tokens), or, without a tokenizer, seeded random ids of a few lengths (two of equal length: one
    attention call over two rows), with a second segment where the model has token types."""
    if tokenizer is not None:
        return [dict(tokenizer(t)) for t in texts] + [dict(tokenizer(*pair))]
    config = model.config
    rng = np.random.default_rng(0)
    pad = getattr(config, "pad_token_id", None)
    rows = []
    for n in (3, 9, 9, 17):
        ids = rng.integers(0, config.vocab_size, size=n)
        if pad is not None:
            ids[ids == pad] = (pad + 1) % config.vocab_size  # a pad id inside a row would shift RoBERTa's positions
        rows.append({"input_ids": ids.tolist()})
    if family_of(model, {**CLASSIFIERS, **MASKED_LMS}) in ("bert", "electra") \
            and getattr(config, "type_vocab_size", 1) > 1:
        for row in rows:
            n = len(row["input_ids"])
            row["token_type_ids"] = [0] * (n // 2) + [1] * (n - n // 2)
    return rows
