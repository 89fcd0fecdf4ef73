"""Random encoders of each family the packed forward serves, built from their configs (no download, no
tokenizer): the packed-path tests and `benchmarks/score.py --family` use them.

`build(family, kind, layers=..., hidden=...)`; `ids_rows(...)` makes token-id rows without a tokenizer.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

# family -> (config class, classifier class, masked-LM class) names in transformers
FAMILIES = {
    "bert": ("BertConfig", "BertForSequenceClassification", "BertForMaskedLM"),
    "roberta": ("RobertaConfig", "RobertaForSequenceClassification", "RobertaForMaskedLM"),
    "xlm-roberta": ("XLMRobertaConfig", "XLMRobertaForSequenceClassification", "XLMRobertaForMaskedLM"),
    "camembert": ("CamembertConfig", "CamembertForSequenceClassification", "CamembertForMaskedLM"),
    "electra": ("ElectraConfig", "ElectraForSequenceClassification", "ElectraForMaskedLM"),
    "distilbert": ("DistilBertConfig", "DistilBertForSequenceClassification", "DistilBertForMaskedLM"),
    "mpnet": ("MPNetConfig", "MPNetForSequenceClassification", "MPNetForMaskedLM"),
    "deberta-v2": ("DebertaV2Config", "DebertaV2ForSequenceClassification", "DebertaV2ForMaskedLM"),
    "modernbert": ("ModernBertConfig", "ModernBertForSequenceClassification", "ModernBertForMaskedLM"),
    "deberta": ("DebertaConfig", "DebertaForSequenceClassification", "DebertaForMaskedLM"),  # v1: not served
}
# The width each family is usually fine-tuned at, for a 6-layer model of it (MiniLM, distilroberta,
# ELECTRA-small, DistilBERT, MPNet-base, DeBERTa-v3-xsmall, ModernBERT-base).
USUAL_WIDTH = {"bert": 384, "roberta": 768, "xlm-roberta": 768, "camembert": 768, "electra": 256,
               "distilbert": 768, "mpnet": 768, "deberta-v2": 384, "modernbert": 768, "deberta": 768}
PAD = 1  # RoBERTa-style pad id (position ids count from PAD + 1); BERT-style families use 0


def config(family: str, *, layers: int = 2, hidden: int = 32, heads: Optional[int] = None, vocab: int = 120,
           labels: int = 2, seed_max_positions: int = 130, initializer_range: float = 0.2):
    import transformers

    heads = heads or (max(1, hidden // 64) if hidden >= 128 else 4)
    cls = getattr(transformers, FAMILIES[family][0])
    # Weights ten times their init scale: logits of order 1, as a trained model's, so a 1e-4 check has teeth.
    common = dict(vocab_size=vocab, num_labels=labels, initializer_range=initializer_range)
    if family == "distilbert":
        return cls(n_layers=layers, dim=hidden, n_heads=heads, hidden_dim=4 * hidden, pad_token_id=0,
                   max_position_embeddings=seed_max_positions, **common)
    if family == "modernbert":
        return cls(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                   intermediate_size=2 * hidden, max_position_embeddings=seed_max_positions, pad_token_id=0,
                   global_attn_every_n_layers=2, local_attention=16, bos_token_id=1, eos_token_id=2,
                   cls_token_id=1, sep_token_id=2, **common)
    kw = dict(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
              intermediate_size=4 * hidden, **common)
    if family in ("roberta", "xlm-roberta", "camembert", "mpnet"):
        return cls(pad_token_id=PAD, max_position_embeddings=seed_max_positions + PAD + 1, type_vocab_size=1,
                   **kw) if family != "mpnet" else cls(pad_token_id=PAD, max_position_embeddings=seed_max_positions
                                                       + PAD + 1, **kw)
    if family == "electra":
        # embedding_size below hidden_size: the embeddings_project path of ELECTRA-small's discriminator
        return cls(embedding_size=max(16, hidden // 2), max_position_embeddings=seed_max_positions, **kw)
    if family == "deberta":
        return cls(relative_attention=True, pos_att_type=["p2c", "c2p"], max_position_embeddings=seed_max_positions,
                   pad_token_id=0, **kw)
    if family == "deberta-v2":
        # DeBERTa-v3's settings: relative attention with log buckets, c2p and p2c, shared keys, no
        # absolute positions, no token types
        return cls(relative_attention=True, pos_att_type=["p2c", "c2p"], position_buckets=16,
                   max_relative_positions=seed_max_positions, share_att_key=True, norm_rel_ebd="layer_norm",
                   position_biased_input=False, type_vocab_size=0, max_position_embeddings=seed_max_positions,
                   pad_token_id=0, **kw)
    return cls(max_position_embeddings=seed_max_positions, type_vocab_size=2, **kw)


def build(family: str, kind: str = "classifier", seed: int = 0, **kwargs):
    """A random model of `family` in eval mode; `kind`: classifier or mlm."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cls = getattr(transformers, FAMILIES[family][1 if kind == "classifier" else 2])
    model = cls(config(family, **kwargs)).eval()
    if family == "mpnet":
        # A trained MPNet's relative position bias is of order 1; at its init scale (0.02) a path that
        # left it out would still pass a 1e-4 check.
        with torch.no_grad():
            model.mpnet.encoder.relative_attention_bias.weight.normal_(0.0, 1.0)
    return model


def ids_rows(model, lengths, seed: int = 0, token_types: bool = False) -> list[dict]:
    """Token-id rows of the given lengths: random ids that are never the pad id (a pad id inside a row
    would shift RoBERTa's positions), a second segment of token type 1 when `token_types`."""
    rng = np.random.default_rng(seed)
    vocab = model.config.vocab_size
    pad = getattr(model.config, "pad_token_id", None)
    rows = []
    for n in lengths:
        ids = rng.integers(3, vocab, size=n)
        if pad is not None:
            ids[ids == pad] = (pad + 1) % vocab or 2
        row = {"input_ids": ids.tolist()}
        if token_types:
            row["token_type_ids"] = [0] * (n // 2) + [1] * (n - n // 2)
        rows.append(row)
    return rows


def build_for_tokenizer(family: str, tokenizer, kind: str = "classifier", seed: int = 0, **kwargs):
    """A random model of `family` that takes this tokenizer's ids: its vocabulary size and pad id. A
    WordPiece tokenizer marks the second segment of a pair with token type 1, so RoBERTa-style
    configs get two token types here (a RoBERTa tokenizer gives none)."""
    import torch
    import transformers

    cfg = config(family, vocab=len(tokenizer), **kwargs)
    cfg.pad_token_id = tokenizer.pad_token_id
    if family in ("roberta", "xlm-roberta", "camembert"):
        cfg.type_vocab_size = 2
    torch.manual_seed(seed)
    return getattr(transformers, FAMILIES[family][1 if kind == "classifier" else 2])(cfg).eval()
