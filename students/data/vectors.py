"""Initial word-vector tables over the teacher's WordPiece vocabulary (`embed_init`).

Every method returns one row per id of the teacher's tokenizer, so the student's tokens, trimming and
export stay as they are whatever the vectors' source:

- teacher: the teacher's input embedding table, PCA'd to the student's width (students.data.tokens).
- word2vec: gensim skip-gram trained on the run's own texts, tokenized into WordPiece ids. Ids the
  texts never show get the teacher's row mapped into the word2vec space by the least-squares linear
  map fitted on the ids they do show, so they stay in the same space as the rest instead of noise.
- model2vec: MinishLab's model2vec distillation done here: each id alone through the teacher's
  encoder, mean of the last layer over the sequence, PCA, then SIF weighting from Zipf ranks.
- contextual: the teacher's encoder read over the run's own texts, each id's output state (the last layer)
  averaged over every place it occurs (Bommasani et al. 2020's pooling over contexts, X2Static's idea),
  PCA'd as `teacher`. A fine-tuned teacher's output states carry what it learned of the task, which a
  context-free input row does not. Ids the texts never show get the teacher's input row mapped into that space
  by the least-squares affine map fitted on the ids they do show (as word2vec's). The table is kept in
  $TRANSFERSET_CACHE/vectors under a digest of its inputs: the next student on that teacher and those texts reads it.
  The cache only saves that pass: one that cannot be written, or a kept file that is not the table, costs the pass.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import uuid
from typing import Iterable, Optional, Sequence

import torch

from students.data.tokens import pca_project, teacher_input_embeddings
from transferset.fs.remote import CACHE_ENV, cache_root
from transferset.models.loading import quiet_transformers
from transferset.runtime.errors import UserError
from transferset.runtime.progress import Progress, log_line

METHODS = ("teacher", "word2vec", "model2vec", "contextual")
SIF_COEFFICIENT = 1e-4  # model2vec's default sif_coefficient
CONTEXT_TEXTS = 20_000  # contextual: the run's first texts the teacher reads (~2 min of MiniLM on one thread)
CONTEXT_BATCH = 64


def embedding_table(tokenizer, teacher_dir: str, width: int, method: str, texts: Iterable[Sequence[str]],
                    seed: int = 0, max_length: int = 128) -> torch.Tensor:
    """(len(tokenizer), width) float table by `method`; `texts`: batches of the run's texts (word2vec and
    contextual); `max_length`: the tokens of a text the teacher reads (contextual)."""
    if method == "teacher":
        return pca_project(teacher_input_embeddings(teacher_dir, len(tokenizer)), width, seed)
    if method == "contextual":
        return pca_project(contextual_table(tokenizer, teacher_dir, texts, max_length), width, seed)
    if method == "word2vec":
        fallback = pca_project(teacher_input_embeddings(teacher_dir, len(tokenizer)), width, seed)
        return word2vec_table(tokenizer, texts, width, fallback, seed)
    if method == "model2vec":
        return model2vec_table(tokenizer, teacher_dir, width, seed)
    raise UserError(f"embed_init {method!r}: unknown; known: {', '.join(METHODS)}, random")


# --------------------------------------------------------------------------- word2vec


def _gensim_word2vec():
    try:
        from gensim.models import Word2Vec
    except ImportError as exc:
        raise UserError("embed_init: word2vec needs gensim: pip install 'transferset[vectors]' "
                        "(or pick embed_init: teacher / model2vec)") from exc
    return Word2Vec


def word2vec_table(tokenizer, texts: Iterable[Sequence[str]], width: int, fallback: torch.Tensor,
                   seed: int = 0, epochs: int = 5) -> torch.Tensor:
    """Skip-gram vectors of the WordPiece ids in `texts`, unit overall std; unseen ids: `fallback` (V, width)
    mapped by least squares from its seen rows onto their word2vec rows."""
    Word2Vec = _gensim_word2vec()
    sentences = [[str(i) for i in ids] for batch in texts if batch
                 for ids in tokenizer(list(batch), add_special_tokens=False)["input_ids"] if ids]
    if not sentences:
        raise UserError("embed_init: word2vec found no text to train on in the transfer set; "
                        "use embed_init: teacher")
    # workers=1 and a fixed seed: gensim is only deterministic single-threaded.
    w2v = Word2Vec(sentences, vector_size=width, sg=1, window=5, min_count=1, epochs=epochs,
                   seed=seed % 2**32,  # numpy's RandomState takes 32 bits; a run's seed can be wider
                   workers=1)
    seen = torch.tensor([int(k) for k in w2v.wv.index_to_key])
    vecs = torch.tensor(w2v.wv.vectors, dtype=torch.float32)
    return mapped_fill(fallback, seen, vecs / vecs.std().clamp(min=1e-8))


def mapped_fill(fallback: torch.Tensor, seen: torch.Tensor, vecs: torch.Tensor) -> torch.Tensor:
    """(V, W): `vecs` (len(seen), W) at the ids `seen`, every other row `fallback`'s (V, F) mapped by the
    least-squares affine map fitted from fallback's rows at `seen` onto `vecs`."""
    # A bias column, so the mapped rows land around the vectors' mean.
    source = torch.cat([fallback, torch.ones(fallback.shape[0], 1)], dim=1)                 # (V, F+1)
    mapping = torch.linalg.lstsq(source[seen].double(), vecs.double()).solution.float()   # (F+1, W)
    out = source @ mapping
    out[seen] = vecs
    return out


# --------------------------------------------------------------------------- contextual


@torch.inference_mode()
def contextual_outputs(teacher_dir: str, tokenizer, texts: Iterable[Sequence[str]], max_length: int,
                       limit: int = CONTEXT_TEXTS, batch_size: int = CONTEXT_BATCH) -> tuple[torch.Tensor, torch.Tensor]:
    """(sums (V, H) of each id's last-layer output states, counts (V,) of its occurrences) over the first `limit`
    of `texts`, each text read whole by the teacher's encoder (up to `max_length` tokens); special tokens and
    padding count for no id."""
    from transformers import AutoModel

    with quiet_transformers():  # the classifier's head is left out on purpose: no load report about it
        model = AutoModel.from_pretrained(teacher_dir).eval()
    flat = sorted(first_texts(texts, limit), key=len)  # a batch of similar lengths pads little
    special = torch.tensor(sorted(set(tokenizer.all_special_ids)), dtype=torch.long)
    sums = torch.zeros(len(tokenizer), model.config.hidden_size, dtype=torch.float64)
    counts = torch.zeros(len(tokenizer), dtype=torch.float64)
    progress = Progress("embed_init contextual: the run's texts through the teacher's encoder", unit="texts",
                        total=len(flat))
    for start in range(0, len(flat), batch_size):
        enc = tokenizer(flat[start:start + batch_size], truncation=True, max_length=max_length, padding=True,
                        return_tensors="pt")
        hidden = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).last_hidden_state  # (B, L, H)
        real = enc["attention_mask"].bool() & ~torch.isin(enc["input_ids"], special)                      # (B, L)
        ids = enc["input_ids"][real]
        sums.index_add_(0, ids, hidden[real].double())
        counts.index_add_(0, ids, torch.ones(len(ids), dtype=torch.float64))
        progress.update(min(batch_size, len(flat) - start))
    progress.close()
    return sums, counts


def first_texts(texts: Iterable[Sequence[str]], limit: int) -> list[str]:
    """The first `limit` texts of `texts` (batches of texts)."""
    flat: list[str] = []
    for batch in texts:
        flat.extend(batch[:limit - len(flat)])
        if len(flat) >= limit:
            break
    return flat


def contextual_table(tokenizer, teacher_dir: str, texts: Iterable[Sequence[str]], max_length: int,
                     limit: int = CONTEXT_TEXTS) -> torch.Tensor:
    """(len(tokenizer), H): each id's mean output state over the run's texts; unseen ids mapped from the
    teacher's input rows (`mapped_fill`). Kept in the cache folder under a key of the teacher's weights, its
    vocabulary, the texts read and `max_length` (`contextual_cache`): a second student on the same teacher and
    transfer set (another seed, a search's next rung) reads it instead of a pass of the teacher."""
    flat = first_texts(texts, limit)
    cached = contextual_cache(tokenizer, teacher_dir, flat, max_length)
    table = read_kept(cached, (len(tokenizer), teacher_width(teacher_dir)))
    if table is not None:
        log_line(f"embed_init contextual: these texts' vectors through this teacher, reused from {cached}")
        return table
    sums, counts = contextual_outputs(teacher_dir, tokenizer, [flat], max_length, limit)
    seen = torch.nonzero(counts > 0).flatten()
    if len(seen) == 0:
        raise UserError("embed_init: contextual found no text in the transfer set for the teacher to read; "
                        "use embed_init: teacher")
    means = (sums[seen] / counts[seen, None]).float()
    table = mapped_fill(teacher_input_embeddings(teacher_dir, len(tokenizer)), seen, means)
    keep(table, cached)
    return table


def teacher_width(teacher_dir: str) -> int:
    """The width of the teacher's output states: a contextual table's columns."""
    from transformers import AutoConfig  # heavy: loaded only by embed_init contextual

    return int(AutoConfig.from_pretrained(teacher_dir).hidden_size)


def read_kept(cached: str, shape: tuple[int, int]) -> Optional[torch.Tensor]:
    """The table kept at `cached` when it is a float table of `shape` whose every value is finite; else None, what
    was wrong said in one line naming the file (made again and written over): a cache only saves time, so a file
    that is not this table (cut short, of other inputs, damaged) must not reach the student."""
    if not os.path.exists(cached):
        return None
    try:
        table = torch.load(cached, weights_only=True)
    except (RuntimeError, OSError, EOFError, pickle.UnpicklingError) as exc:
        why = f"unreadable ({exc})"
    else:
        if not isinstance(table, torch.Tensor):
            why = f"holds a {type(table).__name__}, not a tensor"
        elif tuple(table.shape) != shape or not table.is_floating_point():
            why = f"holds a tensor of shape {tuple(table.shape)} ({table.dtype}), not the {shape} float table"
        elif not bool(torch.isfinite(table).all()):
            why = f"holds {int((~torch.isfinite(table)).sum())} values that are not finite (NaN or inf)"
        else:
            return table
    log_line(f"embed_init contextual: {cached} {why}; made again")
    return None


def keep(table: torch.Tensor, cached: str) -> None:
    """Write `table` at `cached` for the next student on these inputs. A cache that cannot be written (a read-only
    folder, TRANSFERSET_CACHE naming a file, a full disk) costs only that time: said in one line, and training goes
    on."""
    partial = f"{cached}.tmp-{uuid.uuid4().hex}"  # renamed when whole: a killed write leaves no table behind
    try:
        os.makedirs(os.path.dirname(cached), exist_ok=True)
        torch.save(table, partial)
        os.replace(partial, cached)
    except (OSError, RuntimeError) as exc:  # RuntimeError: how torch.save's writer reports a failed write
        with contextlib.suppress(OSError):
            os.remove(partial)
        reason = (exc.strerror if isinstance(exc, OSError) and exc.strerror
                  else (str(exc).strip().splitlines() or [type(exc).__name__])[0])
        log_line(f"embed_init contextual: the table is not kept in {os.path.dirname(cached)} ({reason}): the next "
                 f"student on these texts makes it again; point {CACHE_ENV} at a folder you can write to keep it")


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def contextual_cache(tokenizer, teacher_dir: str, texts: Sequence[str], max_length: int) -> str:
    """The cache file (under $TRANSFERSET_CACHE/vectors) of the contextual table these inputs make: its name a
    digest of the teacher folder's weight files and config, the tokenizer's vocabulary, the texts and
    `max_length`."""
    h = hashlib.sha256(f"contextual v1 {max_length} {len(texts)}".encode())
    for name in sorted(os.listdir(teacher_dir)):
        path = os.path.join(teacher_dir, name)
        if os.path.isfile(path) and (name == "config.json" or name.endswith(WEIGHT_SUFFIXES)):
            h.update(name.encode())
            with open(path, "rb") as fh:
                h.update(hashlib.file_digest(fh, "sha256").digest())
    h.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
    for text in texts:
        h.update(text.encode("utf-8") + b"\0")
    return os.path.join(cache_root(), "vectors", f"contextual-{h.hexdigest()[:32]}.pt")


# --------------------------------------------------------------------------- model2vec


@torch.inference_mode()
def encoder_token_outputs(teacher_dir: str, tokenizer, batch_size: int = 1024) -> torch.Tensor:
    """(len(tokenizer), H): each id alone through the teacher's encoder, the last layer averaged over the sequence.

    As model2vec's create_output_embeddings_from_model: the sequence is [SEP] id [CLS] (their note: the
    reversed special tokens did better on their benchmarks) and the mean covers all three positions.
    """
    from transformers import AutoModel

    model = AutoModel.from_pretrained(teacher_dir).eval()
    tok = tokenizer
    if tok.cls_token_id is None or tok.sep_token_id is None:
        raise UserError(f"{teacher_dir}: the tokenizer has no [CLS]/[SEP] token, which embed_init: model2vec "
                        "wraps each token in; use embed_init: teacher")
    tokens = len(tokenizer)
    ids = torch.arange(tokens)
    seqs = torch.stack([torch.full_like(ids, tok.sep_token_id), ids, torch.full_like(ids, tok.cls_token_id)], 1)
    out = []
    # minutes for a 12-layer teacher on one CPU thread: a line every 30 s says how far it got
    progress = Progress("embed_init model2vec: ids through the teacher's encoder", unit="ids", total=tokens)
    for start in range(0, tokens, batch_size):
        batch = seqs[start:start + batch_size]
        hidden = model(input_ids=batch, attention_mask=torch.ones_like(batch)).last_hidden_state  # (B, 3, H)
        out.append(hidden.float().mean(1))
        progress.update(len(batch))
    progress.close()
    return torch.cat(out)


def sif_weights(rows: int, sif: float = SIF_COEFFICIENT) -> torch.Tensor:
    """model2vec's _post_process_embeddings: the id's Zipf probability p = (1/(id+2)) / sum over ids of
    1/(id+2) (ids taken as frequency ranks), weight sif / (sif + p)."""
    inv_rank = 1.0 / torch.arange(2, rows + 2, dtype=torch.float64)
    return (sif / (sif + inv_rank / inv_rank.sum())).float()


def model2vec_table(tokenizer, teacher_dir: str, width: int, seed: int = 0) -> torch.Tensor:
    """model2vec's static vectors of the teacher's vocabulary at `width`, (len(tokenizer), width)."""
    outputs = encoder_token_outputs(teacher_dir, tokenizer)
    return pca_project(outputs, width, seed) * sif_weights(outputs.shape[0])[:, None]
