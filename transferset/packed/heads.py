"""The packed paths of whole models: sequence classifiers (the teacher's scoring) and masked LMs (the
tinybert recipe's MLM candidates), each with the model's own head modules, each checked against the
model's own forward on probe rows before it is used."""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from transferset.packed.encoder import PackedEncoder
from transferset.packed.families import CLASSIFIERS, FAMILY_BASE, MASKED_LMS, probe_atol, probe_rows, unsupported
from transferset.packed.kernels import layout, pack


class PackedClassifier(PackedEncoder):
    """`forward(input_ids, token_type_ids, lengths, layers, pooling)` on rows packed end to end, for the
    sequence classifiers of every family in CLASSIFIERS."""

    def __init__(self, model, *, onednn: bool = False, rows_hint: Optional[int] = None):
        family = CLASSIFIERS.get(type(model).__name__, "bert")
        super().__init__(getattr(model, FAMILY_BASE[family]), family, onednn=onednn, rows_hint=rows_hint)
        self.model = model

    @classmethod
    def build(cls, model, tokenizer=None, rows_hint: Optional[int] = None
              ) -> tuple[Optional["PackedClassifier"], str]:
        """(PackedClassifier, "") when the model has a packed path that matches its own forward, else
        (None, why). oneDNN's fused linear is tried first where available, then plain addmm."""
        reason = unsupported(model)
        if reason:
            return None, reason
        return cls._build(model, lambda packed: packed.probe_difference(model, tokenizer), probe_atol(model),
                          rows_hint=rows_hint)

    def probe_difference(self, model, tokenizer=None) -> float:
        """Largest |logit| difference between this path and model(**row) on a few probe rows."""
        import torch

        rows = probe_rows(model, tokenizer)
        worst = 0.0
        with torch.inference_mode():
            order = sorted(range(len(rows)), key=lambda i: len(rows[i]["input_ids"]))
            logits, _ = self.score([rows[i] for i in order], layers=(), pooling="cls")
            for at, i in enumerate(order):
                alone = {k: torch.tensor([v], device=self.device) for k, v in self.inputs(rows[i]).items()}
                own = model(**alone).logits[0]
                worst = max(worst, float((own - logits[at]).abs().max()))
        return worst

    def head(self, first):
        """(rows, H) hidden states of each row's first token -> (rows, C) logits, through the model's own
        head modules (dropout is a no-op in eval)."""
        model, family = self.model, self.family
        if family == "bert":
            return model.classifier(model.bert.pooler(first.unsqueeze(1)))
        if family == "distilbert":
            return model.classifier(model.pre_classifier(first).relu_())
        if family == "deberta-v2":
            return model.classifier(model.pooler(first.unsqueeze(1)))
        if family == "modernbert":  # `first` is the pooled state here (cls or mean, the config's pooling)
            return model.classifier(model.head(first))
        return model.classifier(first.unsqueeze(1))  # RoBERTa, ELECTRA, MPNet heads take (B, T, H), use [:, 0]

    def score(self, features: Sequence[dict], layers: Sequence[int], pooling: str):
        """Tokenized rows (dicts with input_ids, maybe token_type_ids) -> `forward` on them packed."""
        ids, types = pack([f["input_ids"] for f in features], [f.get("token_type_ids") for f in features],
                          self.device)
        return self.forward(ids, types, [len(f["input_ids"]) for f in features], layers, pooling)

    def forward(self, input_ids, token_type_ids, lengths: Sequence[int], layers: Sequence[int], pooling: str):
        """input_ids, token_type_ids: (T,) for rows laid end to end, `lengths` tokens each.

        Returns logits (rows, C) and {layer: (rows, H)} pooled hidden states for `layers`
        (hidden_states indices: 0 = embeddings). Rows of equal length should be adjacent (sorted
        rows are): each run of them is one attention call.
        """
        import torch

        lengths, offsets, groups = layout(lengths)
        firsts = torch.from_numpy(offsets).to(self.device)
        pooled = {}
        for k, x in self.states(input_ids, token_type_ids, lengths, offsets, groups):
            if k in layers:
                pooled[k] = self.pool(x, groups, firsts, pooling)
        if self.family == "modernbert" and self.model.config.classifier_pooling == "mean":
            return self.head(self.pool(x, groups, firsts, "mean")), pooled
        return self.head(x.index_select(0, firsts)), pooled  # each row's first token: [CLS] / <s>

    @staticmethod
    def pool(x, groups, firsts, pooling: str):
        """(T, H) packed hidden states -> (rows, H): [CLS] or the mean over each row's tokens."""
        import torch

        if pooling == "cls":
            return x.index_select(0, firsts)
        return torch.cat([x[start:start + rows * length].view(rows, length, -1).mean(dim=1)
                          for start, rows, length in groups])


PackedBert = PackedClassifier  # the name from when BERT was the only family


class PackedMaskedLM(PackedEncoder):
    """A masked LM's encoder (every family in MASKED_LMS) on rows packed end to end, its vocabulary head
    on chosen tokens only (the MLM candidates of the tinybert recipe: one masked token per row)."""

    PROBE = ("a {mask} probe sentence", "a short probe sentence")

    def __init__(self, model, *, onednn: bool = False, rows_hint: Optional[int] = None):
        family = MASKED_LMS.get(type(model).__name__, "bert")
        super().__init__(getattr(model, FAMILY_BASE[family]), family, onednn=onednn, rows_hint=rows_hint)
        self.model = model

    def head(self, x):
        """(N, H) -> (N, V) vocabulary logits, through the model's own head modules."""
        model, family = self.model, self.family
        if family == "bert":
            return model.cls(x)
        if family == "electra":
            return model.generator_lm_head(model.generator_predictions(x))
        if family == "distilbert":
            return model.vocab_projector(model.vocab_layer_norm(model.activation(model.vocab_transform(x))))
        return model.lm_head(x)  # RoBERTa/XLM-R/CamemBERT, MPNet

    @classmethod
    def build(cls, model, tokenizer=None) -> tuple[Optional["PackedMaskedLM"], str]:
        reason = unsupported(model, MASKED_LMS, needs_pooler=False)
        if reason:
            return None, reason
        return cls._build(model, lambda packed: packed.probe_difference(model, tokenizer), probe_atol(model))

    def probe_difference(self, model, tokenizer=None) -> float:
        """Largest |logit| difference from model(**row) at the first, the masked and the last token of a
        probe pair, relative to the largest logit (at least 1): vocabulary logits run larger than a
        classifier's."""
        import torch

        if tokenizer is not None:
            masked, original = self.PROBE
            row = self.inputs(dict(tokenizer(masked.format(mask=tokenizer.mask_token), original)))
            ids = row["input_ids"]
            mask = tokenizer.mask_token_id
            at = [0, ids.index(mask) if mask in ids else 1, len(ids) - 1]
        else:
            row = probe_rows(model)[-1]
            at = [0, len(row["input_ids"]) // 2, len(row["input_ids"]) - 1]
        with torch.inference_mode():
            packed = self.logits_at([row] * len(at), at)
            own = model(**{k: torch.tensor([v], device=self.device) for k, v in self.inputs(row).items()}).logits[0]
            expect = own[at]
            scale = max(1.0, float(expect.abs().max()))
            return float((packed - expect).abs().max()) / scale

    def logits_at(self, features: Sequence[dict], positions: Sequence[int]):
        """(rows, V): the vocabulary logits at token `positions[i]` of row i (rows of equal length adjacent)."""
        import torch

        ids, types = pack([f["input_ids"] for f in features], [f.get("token_type_ids") for f in features],
                          self.device)
        lengths, offsets, groups = layout([len(f["input_ids"]) for f in features])
        for _, x in self.states(ids, types, lengths, offsets, groups):
            pass
        at = torch.from_numpy(offsets + np.asarray(positions, dtype=np.int64)).to(self.device)
        return self.head(x.index_select(0, at))
