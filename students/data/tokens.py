"""Student tokenization and embedding initialisation from the teacher.

Two kinds of tokens: the teacher's WordPiece tokenizer (default; the transformer student needs it
whole, the BiLSTM then shares the teacher's vocabulary and embeddings, whole or, with `trim_vocab`,
trimmed to the ids the transfer set uses), or lowercased words with a vocabulary counted over the
transfer set. A transformer student started from a pretrained checkpoint has a third kind: that
checkpoint's own tokenizer (PretrainedTokens). All are saved inside the model directory, so a
trained student never needs the teacher's files again.

Embeddings can start from the teacher's input embeddings projected to the student's width by
PCA: no GloVe download, and the student starts from vectors the teacher already organised.
"""
from __future__ import annotations

import json
import os
import re
from collections import Counter
from typing import Iterable, Optional, Sequence

import torch

from students.data import teacher_files
from students.data.encoding import ARRAYS, Encoder
from students.data.files import RESAVE, StudentFileError
from transferset.config import StudentConfig
from transferset.contract import schema
from transferset.models.loading import check_remote_code, load_tokenizer
from transferset.runtime.errors import ConfigError, UserError
from transferset.runtime.progress import log_line

WORDS_FILE = "vocab.json"
TOKENIZER_DIR = "tokenizer"
PAD, UNK, SEP = "[PAD]", "[UNK]", "[SEP]"
# A word, or one punctuation mark; the augmenters' mask token ([MASK], lower-cased here) stays one token, so a
# masked position is not read as the words "[", "mask", "]" (the last one the real word).
_WORD = re.compile(r"\[mask\]|\w+|[^\w\s]")
# A word vocabulary keeping fewer of the distinct words seen than this is said in one line (tokens: words).
MIN_KEPT_SHARE = 0.05


class WordPieceTokens:
    kind = "wordpiece"

    def __init__(self, tokenizer, max_length: int, keep: Optional[Sequence[int]] = None):
        self.tokenizer = tokenizer
        self.encoder = Encoder(tokenizer)
        self.max_length = max_length
        self.keep = None if keep is None else sorted(set(int(i) for i in keep))
        self.remap = None
        if self.keep is not None:
            # A trimmed vocabulary: only the WordPiece ids seen in the transfer set get a row of the
            # student's embedding table (most of a 30k table never occurs in one task's text, and
            # its rows would dominate the student's size and every optimiser step). The rest map to [UNK].
            specials = [tokenizer.pad_token_id, tokenizer.unk_token_id, tokenizer.cls_token_id, tokenizer.sep_token_id]
            self.keep = sorted(set(self.keep) | {int(i) for i in specials if i is not None})
            # A byte-level BPE may have no unknown token (GPT-2's): unseen pieces then share the padding row,
            # a zero vector, rather than another piece's meaning.
            unseen = tokenizer.unk_token_id if tokenizer.unk_token_id is not None else tokenizer.pad_token_id
            self.remap = torch.full((len(tokenizer),), self.keep.index(int(unseen or 0)), dtype=torch.long)
            self.remap[torch.tensor(self.keep)] = torch.arange(len(self.keep))
        pad = int(tokenizer.pad_token_id or 0)
        self.pad_id = pad if self.remap is None else int(self.remap[pad])
        self.vocab_size = len(tokenizer) if self.keep is None else len(self.keep)

    def seen_ids(self, texts: Iterable[Sequence[str]]) -> set[int]:
        """WordPiece ids occurring in batches of texts (for a trimmed vocabulary)."""
        seen: set[int] = set()
        for batch in texts:
            for ids in self.tokenizer(list(batch), truncation=True, max_length=self.max_length)["input_ids"]:
                seen.update(ids)
        return seen

    @classmethod
    def from_dir(cls, path: str, max_length: int, keep: Optional[Sequence[int]] = None, *,
                 remedy: str = teacher_files.NO_CODE_TRAIN) -> "WordPieceTokens":
        """The tokenizer at `path`, through the safe loader: one that ships Python code (auto_map) is
        refused, its message ending in `remedy`."""
        try:
            tok = load_tokenizer(path, local_files_only=True, remedy=remedy)
        except UserError:
            raise
        except (OSError, ValueError) as exc:
            raise UserError(f"cannot load the teacher's tokenizer from {path!r}: {exc}; set `tokenizer: PATH` "
                            "in the --config YAML to a directory holding tokenizer.json or vocab.txt") from exc
        return cls(tok, max_length, keep)

    def encode(self, texts: Sequence[str], texts_b: Optional[Sequence[Optional[str]]] = None):
        """→ ids (B, T) long, mask (B, T) bool, type ids (B, T) long; padded to the longest row."""
        pairs = None
        if texts_b is not None and any(t is not None for t in texts_b):
            pairs = [t or "" for t in texts_b]
        enc = {k: torch.from_numpy(v) for k, v in self.encoder(texts, pairs, self.max_length, ARRAYS).items()}
        ids = enc["input_ids"] if self.remap is None else self.remap[enc["input_ids"]]
        return ids, enc["attention_mask"].bool(), enc["token_type_ids"]

    def save(self, model_dir: str) -> dict:
        self.tokenizer.save_pretrained(os.path.join(model_dir, TOKENIZER_DIR))
        return {"kind": self.kind, "max_length": self.max_length, "keep": self.keep}


class PretrainedTokens(WordPieceTokens):
    """A pretrained student's own tokenizer, whole: any Hugging Face tokenizer (WordPiece, BPE, SentencePiece).

    The scored set keeps each row's `text` / `text_b`, so a student whose checkpoint has another
    vocabulary than the teacher tokenizes them itself. It is saved next to the model (a plain Hugging
    Face directory: students/families/transformer.py `save`), where `Student.from_pretrained` and
    `AutoTokenizer.from_pretrained` find it.
    """

    kind = "pretrained"

    @classmethod
    def from_pretrained(cls, path: str, max_length: int, name: Optional[str] = None) -> "PretrainedTokens":
        """The tokenizer of the checkpoint at `path` (a directory or hub name; `name`: how the settings call it),
        through the safe loader (a tokenizer that ships Python code is refused)."""
        name = name or path
        try:
            tok = load_tokenizer(path, remedy=teacher_files.NO_CODE_PRETRAINED)
        except UserError:
            raise
        except (OSError, ValueError) as exc:
            raise UserError(f"model: pretrained {name!r}: cannot load its tokenizer ({exc}); the checkpoint needs "
                            "its tokenizer files (tokenizer.json, or vocab.txt / vocab.json + merges.txt)") from exc
        if tok.pad_token_id is None:
            raise UserError(f"model: pretrained {name!r}: its tokenizer has no padding token, which batches need; "
                            "choose a sequence-classification checkpoint (BERT, RoBERTa, DistilBERT, MiniLM...)")
        # Unset limits read as a huge model_max_length; a recorded one is what the positions allow.
        limit = int(tok.model_max_length) if tok.model_max_length and tok.model_max_length < 1_000_000 else max_length
        return cls(tok, min(max_length, limit))


class WordTokens:
    kind = "words"

    def __init__(self, vocab: Sequence[str], max_length: int):
        if list(vocab[:3]) != [PAD, UNK, SEP]:
            raise ValueError(f"a word vocabulary starts with {PAD}, {UNK}, {SEP}")
        self.vocab = list(vocab)
        self.index = {w: i for i, w in enumerate(self.vocab)}
        self.max_length = max_length
        self.pad_id = 0
        self.vocab_size = len(self.vocab)

    @staticmethod
    def split(text: str) -> list[str]:
        return _WORD.findall(text.lower())

    @classmethod
    def build(cls, texts: Iterable[str], max_length: int, min_count: int = 1,
              max_size: int = 50000) -> "WordTokens":
        counts: Counter = Counter()
        for t in texts:
            counts.update(cls.split(t))
        # Ties broken by the word so the vocabulary does not depend on shard order.
        words = sorted((w for w, c in counts.items() if c >= min_count), key=lambda w: (-counts[w], w))
        kept = words[: max(0, max_size - 3)]
        check_kept(counts, len(words), kept, min_count, max_size)
        return cls([PAD, UNK, SEP] + kept, max_length)

    def ids(self, text: str, text_b: Optional[str] = None) -> list[int]:
        words = self.split(text) + ([SEP] + self.split(text_b) if text_b else [])
        out = [self.index.get(w, 1) for w in words][: self.max_length]
        return out or [1]  # an empty text still needs one step for the LSTM

    def encode(self, texts: Sequence[str], texts_b: Optional[Sequence[Optional[str]]] = None):
        rows = [self.ids(t, texts_b[i] if texts_b is not None else None) for i, t in enumerate(texts)]
        T = max(len(r) for r in rows)
        ids = torch.zeros(len(rows), T, dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r)
        mask = ids != self.pad_id
        return ids, mask, torch.zeros_like(ids)

    def save(self, model_dir: str) -> dict:
        with open(os.path.join(model_dir, WORDS_FILE), "w", encoding="utf-8") as fh:
            json.dump(self.vocab, fh, ensure_ascii=False)
        return {"kind": self.kind, "max_length": self.max_length}


def check_kept(counts: Counter, frequent: int, kept: Sequence[str], min_count: int, max_size: int) -> None:
    """A word vocabulary that keeps no word is refused: every word [UNK] trains a student that predicts one label
    for every row. One that keeps under MIN_KEPT_SHARE of the distinct words seen (`counts`) trains, said in one
    line. `frequent`: the words seen at least `min_count` times; `kept`: those that fit `max_size`."""
    if not counts:
        raise UserError("tokens: words: the transfer set's texts hold no word to count a vocabulary over")
    if frequent == 0:
        word, top = min(counts.items(), key=lambda wc: (-wc[1], wc[0]))
        raise ConfigError(f"tokens: words: min_count {min_count} keeps no word of the transfer set ({word!r} is "
                          f"seen {top} times, the most of any word): every word would be {UNK} and the student "
                          f"would predict one label for every row; set min_count to {top} or less")
    if not kept:
        raise ConfigError(f"tokens: words: max_vocab {max_size} keeps no word ({PAD} {UNK} {SEP} are its first 3 "
                          f"entries; the transfer set has {len(counts)} distinct words); set max_vocab to at least 4")
    if len(kept) < MIN_KEPT_SHARE * len(counts):
        unknown = 1 - sum(counts[w] for w in kept) / sum(counts.values())
        log_line(f"warning: the word vocabulary keeps {len(kept)} of the {len(counts)} distinct words of the transfer "
                 f"set ({100 * len(kept) / len(counts):.1f} %; min_count {min_count}, max_vocab {max_size}): the rest, "
                 f"{100 * unknown:.1f} % of the words read, are {UNK} to the student; lower min_count or raise max_vocab")


def teacher_wordpiece(cfg: StudentConfig, meta: dict, max_length: int) -> WordPieceTokens:
    """The teacher's WordPiece tokens, whole: from the tokenizer the settings or the scored set name."""
    return WordPieceTokens.from_dir(teacher_files.tokenizer_dir(cfg, meta), max_length)


def load_tokens(model_dir: str, spec: dict):
    """The tokens of a saved student (`spec`: its sidecar's checked `tokens` entry)."""
    if spec["kind"] == WordPieceTokens.kind:
        path = os.path.join(model_dir, TOKENIZER_DIR)
        check_remote_code(path, trust_remote_code=False, remedy=teacher_files.NO_CODE_LOAD)
        try:
            return WordPieceTokens.from_dir(path, spec["max_length"], spec.get("keep"),
                                            remedy=teacher_files.NO_CODE_LOAD)
        except (UserError, ValueError, TypeError, IndexError) as exc:  # TypeError, IndexError: a bad `keep` list
            raise StudentFileError(f"{path}: cannot load the student's tokenizer ({exc}); {RESAVE}") from exc
    if spec["kind"] == WordTokens.kind:
        path = os.path.join(model_dir, WORDS_FILE)
        try:
            with open(path, encoding="utf-8") as fh:
                return WordTokens(json.load(fh), spec["max_length"])
        except (OSError, ValueError, TypeError) as exc:
            raise StudentFileError(f"{path}: cannot read the student's word vocabulary ({exc}); {RESAVE}") from exc
    raise StudentFileError(f"{model_dir}: unknown token kind {spec['kind']!r} in {schema.STUDENT_SIDECAR_FILE} "
                           f"(known: {WordPieceTokens.kind}, {WordTokens.kind}); was it saved by another version of "
                           "transferset?")


def teacher_state(teacher_dir: str) -> dict[str, torch.Tensor]:
    """The teacher's weights (safetensors only: a pickle could run code)."""
    from safetensors.torch import load_file

    teacher_files.refuse_remote_code(teacher_dir)
    path = os.path.join(teacher_dir, schema.WEIGHTS_FILE)
    if not os.path.isfile(path):
        raise UserError(f"{teacher_dir}: no model.safetensors; initialising from the teacher needs its "
                        "safetensors weights (or set embed_init: random / init: random in --config)")
    return load_file(path)


# The input embedding table of each family's checkpoints, by the end of its name: BERT and its kin
# (RoBERTa, XLM-R, DeBERTa, DistilBERT, ELECTRA, MPNet: *.embeddings.word_embeddings), ModernBERT
# (model.embeddings.tok_embeddings), decoder-style names (embed_tokens, wte).
INPUT_EMBEDDINGS = ("embeddings.word_embeddings.weight", "embeddings.tok_embeddings.weight", "embed_tokens.weight",
                    "wte.weight")


def teacher_input_embeddings(teacher_dir: str, tokens: Optional[int] = None) -> torch.Tensor:
    """The teacher's input embedding table, (V, H); with `tokens` (the tokenizer's size), its first `tokens` rows.

    Checkpoints pad the table beyond their tokenizer (DeBERTa-v3: 128,100 rows for 128,001 tokens;
    ModernBERT-base: 50,368 for 50,280) so that its size divides well on accelerators; no token id reaches
    those rows, and a student's table has one row per token.
    """
    from safetensors import safe_open

    teacher_files.refuse_remote_code(teacher_dir)
    path = os.path.join(teacher_dir, schema.WEIGHTS_FILE)
    if not os.path.isfile(path):
        teacher_state(teacher_dir)  # raises the explanatory error
    with safe_open(path, framework="pt") as fh:
        names = list(fh.keys())
        keys = next((sorted(k for k in names if k.endswith(end)) for end in INPUT_EMBEDDINGS
                     if any(k.endswith(end) for k in names)), [])
        if not keys:
            raise UserError(f"{path}: no input embedding table (a tensor named *{', *'.join(INPUT_EMBEDDINGS)}); "
                            "set embed_init: random in --config")
        table = fh.get_tensor(keys[0]).float()
    if tokens is not None:
        if table.shape[0] < tokens:
            raise UserError(f"{path}: the teacher's input embeddings ({keys[0]}) have {table.shape[0]} rows and "
                            f"the tokenizer {tokens} tokens, so they do not belong together: set `tokenizer:` in "
                            "--config to the teacher's own tokenizer, or embed_init: random")
        table = table[:tokens]
    return table


def pca_basis(table: torch.Tensor, dim: int) -> torch.Tensor:
    """The top-min(dim, H) principal axes of the rows of `table` (V, H), as columns (H, k), largest variance first."""
    x = table - table.mean(0, keepdim=True)                       # (V, H)
    cov = x.T @ x / max(1, x.shape[0] - 1)                       # (H, H)
    _, vecs = torch.linalg.eigh(cov)                             # ascending eigenvalues
    return vecs[:, -min(dim, x.shape[1]):].flip(-1)


def pca_project(table: torch.Tensor, dim: int, seed: int = 0) -> torch.Tensor:
    """Rows of `table` (V, H) on its top-`dim` principal axes, scaled to unit overall std, (V, dim).

    When dim > H the extra columns are random: the teacher has no more directions to give.
    """
    x = table - table.mean(0, keepdim=True)                       # (V, H)
    k = min(dim, x.shape[1])
    out = x @ pca_basis(table, dim)                               # (V, k), largest variance first
    out = out / out.std().clamp(min=1e-8)
    if dim > k:
        g = torch.Generator().manual_seed(seed)
        out = torch.cat([out, torch.randn(x.shape[0], dim - k, generator=g)], dim=1)
    return out


def word_vectors_from_wordpiece(words: Sequence[str], wordpiece, table: torch.Tensor) -> torch.Tensor:
    """One vector per word: the mean of its WordPiece rows in `table` (V_wp, H) → (len(words), H)."""
    out = torch.zeros(len(words), table.shape[1])
    enc = wordpiece(list(words), add_special_tokens=False)["input_ids"]
    for i, ids in enumerate(enc):
        if ids:
            out[i] = table[ids].mean(0)
    return out
