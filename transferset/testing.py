"""Small real teachers and transfer sets for tests, the project's and yours (`from transferset import
testing`); also handy for trying the pipelines quickly.

torch and transformers are imported inside the functions that build models, and nothing here needs a
test framework: importing this module costs what importing transferset costs.

`tiny_classifier` writes a randomly initialised BERT sequence classifier with a WordPiece
tokenizer to a directory through the real `save_pretrained` path, so loading it exercises
exactly what a user's teacher directory goes through.
"""
from __future__ import annotations

import os
import string
from typing import Any, Mapping, Optional, Sequence

WORDS = (
    "the a an and or but of to in on for with is was are be it this that movie film story acting actor plot "
    "good great bad awful terrible fine funny boring dull brilliant not no very too so just more most "
    "i you he she we they one two love hate like best worst ever never all some time life world"
).split()


def write_vocab(path: str, words: Sequence[str] = WORDS) -> str:
    """A WordPiece vocab: special tokens, the given words, single characters and their ## forms."""
    chars = list(string.ascii_lowercase + string.digits + string.punctuation)
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + list(dict.fromkeys(list(words) + chars))
    tokens += ["##" + c for c in string.ascii_lowercase + string.digits]
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("\n".join(tokens) + "\n")
    return path


def tiny_classifier(directory: str, label_names: Sequence[str] = ("0", "1"), *, hidden_size: int = 32,
                    num_layers: int = 2, num_heads: int = 2, seed: int = 0, max_positions: int = 512,
                    save_pickle: bool = False, initializer_range: float = 0.5) -> str:
    """Write a tiny BertForSequenceClassification + tokenizer to `directory`; returns it.

    With `save_pickle` the weights go to pytorch_model.bin (a pickle) instead of safetensors.
    """
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizer

    os.makedirs(directory, exist_ok=True)
    vocab = write_vocab(os.path.join(directory, "vocab.txt"))
    tokenizer = BertTokenizer(vocab=vocab, do_lower_case=True)  # transformers 5: `vocab`, not `vocab_file`
    config = BertConfig(
        vocab_size=len(open(vocab, encoding="utf-8").read().split("\n")) - 1,
        hidden_size=hidden_size, num_hidden_layers=num_layers, num_attention_heads=num_heads,
        intermediate_size=hidden_size * 2, max_position_embeddings=max_positions,
        num_labels=len(label_names),
        # Default larger than BERT's 0.02 so logits differ visibly between rows (a row swap cannot
        # pass an equivalence test); use 0.02 for a model that is to be trained.
        initializer_range=initializer_range,
        id2label={i: str(n) for i, n in enumerate(label_names)},
        label2id={str(n): i for i, n in enumerate(label_names)},
    )
    torch.manual_seed(seed)
    model = BertForSequenceClassification(config).eval()
    if save_pickle:
        model.config.save_pretrained(directory)
        torch.save(model.state_dict(), os.path.join(directory, "pytorch_model.bin"))
    else:
        model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def transfer_rows(texts: Sequence[str], labels: Optional[Sequence[Optional[int]]] = None,
                  texts_b: Optional[Sequence[Optional[str]]] = None, ops: Optional[Sequence[Sequence[str]]] = None,
                  ids: Optional[Sequence[str]] = None) -> list[dict]:
    """Rows of the transfer-set contract (ids derived from the texts unless given)."""
    from transferset.contract import schema
    from transferset.sources import source_id_for

    rows = []
    for i, text in enumerate(texts):
        b = texts_b[i] if texts_b is not None else None
        sid = source_id_for(text, b)
        rows.append({
            schema.ID: ids[i] if ids is not None else f"{sid}-{i}",
            schema.SOURCE_ID: sid,
            schema.TEXT: text,
            schema.TEXT_B: b,
            schema.OPS: list(ops[i]) if ops is not None else [],
            schema.LABEL: labels[i] if labels is not None else None,
        })
    return rows


def write_transfer_set(directory: str, shards: Sequence[Sequence[dict]], label_names: Sequence[str],
                       extra_metadata: Optional[Mapping[str, Any]] = None, complete: bool = True) -> str:
    """Write row lists as zstd shards under directory/data with the transfer-set schema and metadata.

    `complete` writes the completion marker too, as a finished `augment` run does (readers
    refuse a set without it unless told otherwise).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from transferset.contract import schema

    data = os.path.join(directory, schema.DATA_DIR)
    os.makedirs(data, exist_ok=True)
    sch = schema.transfer_schema(schema.base_metadata(label_names, **dict(extra_metadata or {})))
    for i, rows in enumerate(shards):
        table = pa.Table.from_pylist(list(rows), schema=sch)
        pq.write_table(table, os.path.join(data, f"shard-{i:05d}.parquet"), compression="zstd")
    if complete:
        open(os.path.join(directory, schema.COMPLETE_MARKER), "w").close()
    return directory


def write_scored_set(directory: str, texts: Sequence[str], logits: Any, hidden: Any,
                     label_names: Sequence[str] = ("0", "1"), *, labels: Optional[Sequence[Optional[int]]] = None,
                     ids: Optional[Sequence[str]] = None, shards: int = 2,
                     extra_metadata: Optional[Mapping[str, Any]] = None, complete: bool = True,
                     members: Optional[Sequence[Any]] = None) -> str:
    """A scored transfer set: the rows of `transfer_rows` with teacher columns from `logits` (N, C) and
    `hidden` (N, H), split over `shards` files plus an empty one (as Beam can write).

    `members`: an ensemble's (N, C) logits per member, written as teacher_logits_{k} (`logits` stays the
    target as given)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from transferset.contract import schema

    logits, hidden = np.asarray(logits, dtype=np.float32), np.asarray(hidden, dtype=np.float32)
    rows = transfer_rows(texts, labels, ids=ids)
    sch = schema.scored_schema(len(label_names), hidden.shape[1],
                               metadata=schema.base_metadata(label_names, **dict(extra_metadata or {})),
                               members=len(members or ()))

    def fixed(values, dtype):
        return pa.FixedSizeListArray.from_arrays(pa.array(values.astype(dtype).reshape(-1)), values.shape[1])

    columns = {name: pa.array([r[name] for r in rows], type=sch.field(name).type) for name in rows[0]}
    columns[schema.TEACHER_LABEL] = pa.array(logits.argmax(1), type=pa.int32())
    columns[schema.TEACHER_LOGITS] = fixed(logits, np.float32)
    columns[schema.TEACHER_HIDDEN] = fixed(hidden, np.float16)
    if members is not None and len(members) > 1:
        for k, member in enumerate(members):
            columns[schema.member_logits_column(k)] = fixed(np.asarray(member, dtype=np.float32), np.float32)
    table = pa.Table.from_arrays([columns[f.name] for f in sch], schema=sch)
    data = os.path.join(directory, schema.DATA_DIR)
    os.makedirs(data, exist_ok=True)
    bounds = np.linspace(0, table.num_rows, shards + 1).astype(int)
    for i, (start, stop) in enumerate([*zip(bounds[:-1], bounds[1:]), (0, 0)]):
        pq.write_table(table.slice(start, stop - start), os.path.join(data, f"part-{i:05d}.parquet"),
                       compression="zstd")
    if complete:
        open(os.path.join(directory, schema.COMPLETE_MARKER), "w").close()
    return directory


# --------------------------------------------------------------------------- tiny teachers of every family
#
# A small student: BiLSTM embeddings and units this wide train in seconds on a tiny scored set.
SMALL_WIDTH = 8


def small_student(width: int = SMALL_WIDTH, **settings) -> dict:
    """The settings of a small, fast BiLSTM student (a `train` config section, for StudentConfig(**...) or a
    YAML file: `write_student_config`): embeddings and LSTM `width` wide, one torch thread, `settings` on top.

    A `model` given is merged into the small one (`model={"head_dim": 16}` keeps the small widths). One
    thread: on a shared 2-core machine two threads spin against other jobs and run an LSTM step ~20x slower.
    """
    model = {"embed_dim": width, "hidden": width, **(settings.pop("model", None) or {})}
    return {"threads": 1, **settings, "model": model}


def write_student_config(path: str, width: int = SMALL_WIDTH, **settings) -> str:
    """`small_student(width, **settings)` as a YAML file at `path` (for `--config`); → the path."""
    import yaml

    with open(path, "w", encoding="utf-8") as fh:
        yaml.safe_dump(small_student(width, **settings), fh)
    return str(path)


# The encoders users bring, each as a folder a user would give transferset: a random sequence classifier
# built from its family's config, with a tokenizer of its family's kind trained on the fly on a few hundred
# sentences (the `tokenizers` library, no download) and wrapped in the transformers class that family's
# checkpoints use, so AutoTokenizer / AutoModelForSequenceClassification.from_pretrained(folder) load it.

# family → tokenizer kind: WordPiece (## pieces, [UNK]), byte-level BPE (Ġ pieces, no unknown piece) or a
# SentencePiece-like Unigram (▁ pieces).
FAMILIES = {
    "bert": "wordpiece",
    "roberta": "bpe",
    "xlm-roberta": "unigram",
    "deberta-v2": "unigram",     # DeBERTa-v3's tokenizer and architecture
    "distilbert": "wordpiece",
    "electra": "wordpiece",
    "mpnet": "wordpiece",
    "modernbert": "bpe",
}

# Special tokens in vocabulary order, as each family's checkpoints have them; `None` marks where the trained
# pieces go (ModernBERT's specials come after its BPE vocabulary, the mask after XLM-R's and DeBERTa's).
_SPECIALS = {
    "bert": ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", None],
    "distilbert": ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", None],
    "electra": ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", None],
    "mpnet": ["<s>", "<pad>", "</s>", "[UNK]", None, "<mask>"],
    "roberta": ["<s>", "<pad>", "</s>", "<unk>", "<mask>", None],
    "xlm-roberta": ["<s>", "<pad>", "</s>", "<unk>", None, "<mask>"],
    "deberta-v2": ["[PAD]", "[CLS]", "[SEP]", "[UNK]", None, "[MASK]"],
    "modernbert": [None, "[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"],
}


def read_sentences(path: str, n: int = 400) -> list[str]:
    """The first `n` texts of a TSV with a `sentence` column (SST-2's train.tsv), to train tokenizers on."""
    import csv

    with open(path, encoding="utf-8", newline="") as fh:
        rows = csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE)
        return [row["sentence"] for _, row in zip(range(n), rows)]


def train_tokenizer(family: str, texts: Sequence[str], vocab_size: int = 600):
    """A transformers fast tokenizer of `family`'s kind and special tokens, trained on `texts` (a second).

    The trained pieces are handed to the family's own tokenizer class, which builds its normaliser,
    pre-tokenizer and post-processor as for a real checkpoint (byte-level BPE: Ġ pieces; Unigram: ▁ pieces).
    """
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; known: {', '.join(FAMILIES)}")
    layout = _SPECIALS[family]
    specials = [t for t in layout if t is not None]
    lead = layout[:layout.index(None)]   # the specials before the trained pieces get the first ids
    tail = layout[layout.index(None) + 1:]
    trained = _train_pieces(FAMILIES[family], texts, vocab_size, specials, lead, tail)
    return _family_tokenizer(family, specials, **trained)


def _train_pieces(kind: str, texts: Sequence[str], vocab_size: int, specials: list, lead, tail) -> dict:
    """The trained vocabulary of a tokenizer `kind`, `tail` specials after it: {vocab, merges} (wordpiece,
    bpe) or {pieces} (unigram: (piece, score) pairs), as the family's tokenizer class takes them."""
    import json

    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    if kind == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token=next(t for t in specials if "UNK" in t)))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=lead,
                                                                 show_progress=False))
        vocab = tok.get_vocab()
        for t in tail:
            vocab.setdefault(t, len(vocab))
        return {"vocab": vocab}
    if kind == "bpe":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=lead,
                                                           initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                           show_progress=False))
        model = json.loads(tok.to_str())["model"]
        vocab = dict(model["vocab"])
        merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
        for t in tail:
            vocab.setdefault(t, len(vocab))
        return {"vocab": vocab, "merges": merges}
    unk = next(t for t in specials if "unk" in t.lower())
    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.train_from_iterator(texts, trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=lead,
                                                           unk_token=unk, show_progress=False))
    pieces = [(p, float(s)) for p, s in json.loads(tok.to_str())["model"]["vocab"]]
    return {"pieces": pieces + [(t, 0.0) for t in tail]}


def _family_tokenizer(family: str, specials: list, vocab=None, merges=None, pieces=None):
    """`family`'s own tokenizer class over trained pieces (see `_train_pieces`)."""
    if family in ("bert", "distilbert", "electra"):
        from transformers import BertTokenizer, DistilBertTokenizer, ElectraTokenizer

        cls = {"bert": BertTokenizer, "distilbert": DistilBertTokenizer, "electra": ElectraTokenizer}[family]
        return cls(vocab=vocab, do_lower_case=True)
    if family == "mpnet":
        from transformers import MPNetTokenizer

        return MPNetTokenizer(vocab=vocab, do_lower_case=True)
    if family == "roberta":
        from transformers import RobertaTokenizer

        return RobertaTokenizer(vocab=vocab, merges=merges)
    if family == "xlm-roberta":
        from transformers import XLMRobertaTokenizer

        return XLMRobertaTokenizer(vocab=pieces)
    if family == "deberta-v2":
        from transformers import DebertaV2Tokenizer

        return DebertaV2Tokenizer(vocab=pieces)
    # ModernBERT's checkpoints ship a plain fast tokenizer: byte-level BPE, [CLS] A [SEP] (B [SEP]).
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.add_special_tokens(specials)
    bpe.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    return PreTrainedTokenizerFast(tokenizer_object=bpe, unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
                                   pad_token="[PAD]", mask_token="[MASK]",
                                   model_input_names=["input_ids", "attention_mask"])


def family_config(family: str, tokenizer, label_names: Sequence[str] = ("0", "1"), *, hidden_size: int = 32,
                  num_layers: int = 4, num_heads: int = 2, max_length: int = 64, initializer_range: float = 0.5):
    """A tiny config of `family` whose special-token ids and vocabulary fit `tokenizer`."""
    from transformers import AutoConfig

    labels = {"num_labels": len(label_names), "id2label": {i: str(n) for i, n in enumerate(label_names)},
              "label2id": {str(n): i for i, n in enumerate(label_names)}}
    vocab = len(tokenizer)
    common = dict(vocab_size=vocab, hidden_size=hidden_size, num_hidden_layers=num_layers,
                  num_attention_heads=num_heads, intermediate_size=2 * hidden_size,
                  max_position_embeddings=max_length, initializer_range=initializer_range,
                  pad_token_id=tokenizer.pad_token_id, **labels)
    if family in ("roberta", "xlm-roberta", "mpnet"):
        # Positions count from pad_token_id + 1, as in their checkpoints (514 = 512 + 2).
        common["max_position_embeddings"] = max_length + tokenizer.pad_token_id + 1
    if family in ("roberta", "xlm-roberta"):
        common.update(type_vocab_size=1, bos_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id)
    if family == "deberta-v2":
        # DeBERTa-v3: relative attention, no token types, and more embedding rows than tokens (128,100 for
        # 128,001 tokens), which a student reading the teacher's table must cut to the tokenizer.
        common.update(vocab_size=vocab + 7, type_vocab_size=0, relative_attention=True, position_buckets=16,
                      max_relative_positions=-1, norm_rel_ebd="layer_norm", pos_att_type=["p2c", "c2p"],
                      position_biased_input=False, share_att_key=True)
    if family == "distilbert":
        common = dict(vocab_size=vocab, dim=hidden_size, n_layers=num_layers, n_heads=num_heads,
                      hidden_dim=2 * hidden_size, max_position_embeddings=max_length,
                      initializer_range=initializer_range, pad_token_id=tokenizer.pad_token_id, **labels)
    if family == "electra":
        common["embedding_size"] = hidden_size // 2  # ELECTRA-small's embeddings are narrower than its layers
    if family == "modernbert":
        # Global attention every third layer, a sliding window on the others (one shorter than the rows, so
        # it matters); more embedding rows than tokens (50,368 for 50,280), as ModernBERT-base has.
        common.update(vocab_size=vocab + 5, global_attn_every_n_layers=3, local_attention=8,
                      cls_token_id=tokenizer.cls_token_id, sep_token_id=tokenizer.sep_token_id,
                      bos_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id,
                      initializer_cutoff_factor=2.0, attn_implementation="sdpa")
    return AutoConfig.for_model(family, **common)


def tiny_family_classifier(directory: str, family: str, texts: Sequence[str], label_names: Sequence[str] = ("0", "1"),
                           *, hidden_size: int = 32, num_layers: int = 4, num_heads: int = 2, seed: int = 0,
                           vocab_size: int = 600, max_length: int = 64, initializer_range: float = 0.5,
                           tokenizer=None) -> str:
    """Write a random `family` sequence classifier and its trained tokenizer to `directory`; returns it.

    `texts`: what the tokenizer is trained on (a few hundred sentences of the task: read_sentences);
    `tokenizer`: one already trained (train_tokenizer), to share between teachers of a family.
    """
    import torch
    from transformers import AutoModelForSequenceClassification

    os.makedirs(directory, exist_ok=True)
    tok = tokenizer if tokenizer is not None else train_tokenizer(family, texts, vocab_size)
    tok.model_max_length = max_length
    config = family_config(family, tok, label_names, hidden_size=hidden_size, num_layers=num_layers,
                           num_heads=num_heads, max_length=max_length, initializer_range=initializer_range)
    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_config(config).eval()
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory


def tiny_family_mlm(directory: str, family: str, texts: Sequence[str], *, hidden_size: int = 32, num_layers: int = 2,
                    num_heads: int = 2, seed: int = 0, vocab_size: int = 600, max_length: int = 64) -> str:
    """Write a random `family` masked LM (e.g. RoBERTa's, for the augment `mlm` op) and its trained tokenizer."""
    import torch
    from transformers import AutoModelForMaskedLM

    os.makedirs(directory, exist_ok=True)
    tok = train_tokenizer(family, texts, vocab_size)
    tok.model_max_length = max_length
    config = family_config(family, tok, hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads,
                           max_length=max_length, initializer_range=0.5)
    torch.manual_seed(seed)
    AutoModelForMaskedLM.from_config(config).eval().save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory


def tree_hashes(directory: str) -> dict[str, str]:
    """Every file under `directory` (its path inside it) → the SHA-256 of its bytes: a folder byte for byte."""
    import hashlib

    found = {}
    for root, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as fh:
                found[os.path.relpath(path, directory)] = hashlib.sha256(fh.read()).hexdigest()
    return found
