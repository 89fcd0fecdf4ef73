"""BERT-MLM word replacement (TinyBERT, Jiao et al. 2020).

Alphabetic non-stopword words that are a single wordpiece get the model's top-M
predictions for their masked position, with the input `[CLS] masked [SEP] original [SEP]`.
A chosen eligible word is replaced by a candidate drawn uniformly from its top M.

Public tools run one masked position per forward pass. Here the masked copies of many
examples share each forward pass, and the vocabulary head runs only at the masked
positions, not at every token. A BERT, RoBERTa-style, ELECTRA, DistilBERT or MPNet MLM on a CPU runs
padding-free (transferset.packed:
the pairs laid end to end, no padding token anywhere); other models on padded, length-sorted batches.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

import numpy as np

from transferset.augment.context import RowContext, register_context
from transferset.augment.registry import WORD, register
from transferset.runtime.typed import AtLeast, Probability


@dataclass(frozen=True)
class MlmSettings:
    p_mlm: Probability = 0.4  # per eligible word: probability of one of the top-M MLM candidates
    mlm_model: str = "bert-base-uncased"  # any AutoModelForMaskedLM: local directory or hub name
    allow_pickle: bool = False  # accept pickle weights (pytorch_model.bin) for the MLM: only files you trust
    trust_remote_code: bool = False  # run Python code shipped with the MLM: only models you trust
    mlm_top_k: AtLeast(1) = 15  # M candidates per word
    mlm_max_length: AtLeast(4) = 128  # MLM input tokens per row (the masked sentence and the original)
    mlm_batch_size: AtLeast(1) = 64  # rows per MLM forward pass (their masked copies share it)
    torch_threads: Optional[int] = None  # torch threads per worker for the MLM (None: torch's; use cores / workers)

    # settings no row depends on; the safety switches change what may load, not what a loaded model writes
    EXECUTION = ("mlm_batch_size", "torch_threads", "allow_pickle", "trust_remote_code")



@register("mlm", kind=WORD, settings=MlmSettings, prob="p_mlm", needs=("candidates",))
def mlm(*, words: Sequence[str], positions: np.ndarray, rng: np.random.Generator,
        candidates: Mapping[int, Sequence[str]]) -> list[str]:
    out = list(words)
    draws = rng.random(len(positions))
    for i, u in zip(positions, draws):
        cands = candidates.get(int(i))
        if cands:
            out[int(i)] = cands[min(int(u * len(cands)), len(cands) - 1)]
    return out


def _stop_words() -> frozenset[str]:
    from spacy.lang.en.stop_words import STOP_WORDS

    return frozenset(STOP_WORDS)


class MlmCandidates:
    """Top-M MLM replacement candidates for every eligible word of many sentences at once."""

    def __init__(self, model: str, *, top_k: int, batch_size: int, max_length: int,
                 device: str | None = None, trust_remote_code: bool = False, threads: int | None = None,
                 forward: str = "auto", allow_pickle: bool = False):
        if forward not in ("auto", "packed", "padded"):  # before the model loads
            raise ValueError(f"forward: choose auto, packed or padded, not {forward!r}")
        import torch

        from transferset.models import loading
        from transferset.runtime.threads import set_torch_threads

        set_torch_threads(threads)  # oversubscribed threads slow a forward pass tenfold on a busy machine

        self.torch = torch
        # The teacher's refusals (pickle weights, shipped code): an MLM is a model file like any other.
        model = loading.check_model_dir(model, what="--mlm-model", allow_pickle=allow_pickle,
                                        trust_remote_code=trust_remote_code)
        self.tokenizer = loading.load_tokenizer(model, trust_remote_code=trust_remote_code)
        self.model = loading.load_masked_lm(model, allow_pickle=allow_pickle,
                                            trust_remote_code=trust_remote_code).eval()
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.model.to(self.device)
        self.top_k, self.batch_size, self.max_length = top_k, batch_size, max_length
        self.stop_words = _stop_words()
        # Ids a candidate must never be: special tokens and word continuations ("##ing" in WordPiece;
        # in byte-level BPE and SentencePiece, whose word-initial pieces carry a marker ("Ġfilm",
        # "▁film"), every piece without it).
        vocab = self.tokenizer.get_vocab()
        self.word_start = word_start_marker(vocab)
        banned = set(self.tokenizer.all_special_ids)
        banned.update(i for tok, i in vocab.items() if self.word_of(tok) is None)
        self.banned = torch.tensor(sorted(banned), dtype=torch.long)
        self._head = self._find_head()
        # On a CPU, the MLMs packed.py serves run padding-free, every matmul on real tokens only;
        # the padded forward of a length-sorted batch still spends about half its tokens on padding
        # (the pairs are [CLS] masked [SEP] original [SEP]).
        self.packed, self.packed_reason = None, f"device {self.device}"
        if forward != "padded" and (forward == "packed" or self.device == "cpu"):
            from transferset.packed import PackedMaskedLM

            self.packed, self.packed_reason = PackedMaskedLM.build(self.model, self.tokenizer)
            if forward == "packed" and self.packed is None:
                raise ValueError(f"forward packed: not available for {model}: {self.packed_reason}")
        logging.getLogger("transferset").info("MLM forward pass: %s", self.forward_path if self.packed is not None
                                              else f"padded ({self.packed_reason})")

    def _find_head(self):
        """The vocabulary head, so it can run on masked positions only; None: use the full model."""
        for name in ("cls", "lm_head", "predictions"):
            head = getattr(self.model, name, None)
            if head is not None:
                return head
        return None

    def word_of(self, token: str) -> Optional[str]:
        """The word a vocabulary piece stands for when it is a whole alphabetic word's first piece, else None."""
        if self.word_start:
            if not token.startswith(self.word_start):
                return None
            token = token[len(self.word_start):]
        elif token.startswith("##"):
            return None
        return token if token.isalpha() else None

    def eligible(self, words: Sequence[str]) -> list[int]:
        out = []
        for i, w in enumerate(words):
            # After a space, as inside a sentence: byte-level BPE gives "Ġfilm" there, "film" at the start.
            pieces = self.tokenizer.tokenize(" " + w if self.word_start else w)
            if w.isalpha() and w.lower() not in self.stop_words and len(pieces) == 1:
                out.append(i)
        return out

    def _queries(self, sentences: Sequence[Sequence[str]]):
        mask = self.tokenizer.mask_token
        for s, words in enumerate(sentences):
            original = " ".join(words)
            for i in self.eligible(words):
                masked = " ".join(mask if j == i else w for j, w in enumerate(words))
                yield s, i, masked, original, words[i]

    @property
    def forward_path(self) -> str:
        """'packed' (padding-free path, packed.py) or 'padded' (the model's own forward)."""
        return "packed" if self.packed is not None else "padded"

    def _forward(self, masked: list[str], original: list[str]):
        """Logits over the vocabulary at the (first) mask position of each pair: (B, V)."""
        if self.packed is not None:
            return self._forward_packed(masked, original)
        torch = self.torch
        enc = self.tokenizer(masked, original, padding=True, truncation="only_second",
                             max_length=self.max_length, return_tensors="pt").to(self.device)
        is_mask = enc["input_ids"] == self.tokenizer.mask_token_id  # (B, T)
        first = is_mask.float().argmax(dim=1)  # (B,)
        rows = torch.arange(len(masked), device=self.device)
        if self._head is not None:
            hidden = self.model.base_model(**enc).last_hidden_state  # (B, T, H)
            return self._head(hidden[rows, first])  # (B, V)
        return self.model(**enc).logits[rows, first]  # (B, V)

    def _forward_packed(self, masked: list[str], original: list[str]):
        """`_forward` on the pairs laid end to end: the same logits, no padding tokens."""
        torch = self.torch
        enc = self.tokenizer(masked, original, truncation="only_second", max_length=self.max_length)
        rows = [{k: enc[k][i] for k in enc} for i in range(len(masked))]
        mask_id = self.tokenizer.mask_token_id
        # Rows of equal length adjacent: each run of them is one attention call.
        order = sorted(range(len(rows)), key=lambda i: len(rows[i]["input_ids"]))
        first = [rows[i]["input_ids"].index(mask_id) if mask_id in rows[i]["input_ids"] else 0 for i in order]
        logits = self.packed.logits_at([rows[i] for i in order], first)  # (B, V) in `order`
        out = torch.empty_like(logits)
        out[torch.tensor(order, device=logits.device)] = logits
        return out

    def candidates(self, sentences: Sequence[Sequence[str]], *,
                   batch_size: int | None = None) -> list[dict[int, list[str]]]:
        """For each sentence: {word position: top-M candidate words} for its eligible words."""
        torch = self.torch
        bs = batch_size or self.batch_size
        out: list[dict[int, list[str]]] = [dict() for _ in sentences]
        # Sorted by length so each forward pass pads little; results are keyed, order is free.
        queries = sorted(self._queries(sentences), key=lambda q: len(q[3]))
        with torch.inference_mode():
            for start in range(0, len(queries), bs):
                chunk = queries[start:start + bs]
                logits = self._forward([q[2] for q in chunk], [q[3] for q in chunk]).float()
                self._collect(chunk, logits, out)
        return out

    def _collect(self, chunk, logits, out) -> None:
        torch = self.torch
        logits[:, self.banned.to(logits.device)] = float("-inf")
        # One extra so the original word can be left out and M still remain.
        top = torch.topk(logits, self.top_k + 1, dim=1).indices.cpu().tolist()
        for (s, i, _, _, word), ids in zip(chunk, top):
            toks = [self.word_of(t) for t in self.tokenizer.convert_ids_to_tokens(ids)]
            out[s][i] = [t for t in toks if t is not None and t != word.lower() and t != word][: self.top_k]

    def candidates_one_at_a_time(self, sentences: Sequence[Sequence[str]]) -> list[dict[int, list[str]]]:
        """Baseline of public tools: one masked position per forward pass, full-vocabulary logits
        at every token. Kept for the benchmark and for equivalence tests."""
        torch = self.torch
        out: list[dict[int, list[str]]] = [dict() for _ in sentences]
        with torch.inference_mode():
            for q in self._queries(sentences):
                enc = self.tokenizer([q[2]], [q[3]], truncation="only_second", max_length=self.max_length,
                                     return_tensors="pt").to(self.device)
                logits = self.model(**enc).logits[0]  # (T, V)
                pos = int((enc["input_ids"][0] == self.tokenizer.mask_token_id).nonzero()[0, 0])
                self._collect([q], logits[pos:pos + 1].float().clone(), out)
        return out


def word_start_marker(vocab: Mapping[str, int]) -> str:
    """The mark of a word's first piece in this vocabulary: "Ġ" (byte-level BPE: RoBERTa, GPT-2), "▁"
    (SentencePiece: XLM-R, CamemBERT, DeBERTa-v3), or "" (WordPiece, which marks continuations instead)."""
    counts = {mark: sum(1 for tok in vocab if tok.startswith(mark)) for mark in ("Ġ", "▁")}
    mark = max(counts, key=counts.get)
    return mark if counts[mark] > 0.1 * len(vocab) else ""


def _load_candidates(s: MlmSettings) -> MlmCandidates:
    return MlmCandidates(s.mlm_model, top_k=s.mlm_top_k, batch_size=s.mlm_batch_size,
                         max_length=s.mlm_max_length, threads=s.torch_threads,
                         allow_pickle=s.allow_pickle, trust_remote_code=s.trust_remote_code)


register_context(RowContext("candidates", "MLMCandidates", load=_load_candidates,
                            compute=lambda model, sentences, s: model.candidates(sentences),
                            batch_size="mlm_batch_size", min_batch_size=8))
