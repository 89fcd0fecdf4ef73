"""BiLSTM student (Mukherjee & Awadallah 2019, XtremeDistil; the `tang` shape: Tang et al. 2019).

embeddings → BiLSTM returning sequences → max-pool over time → Dense + GELU to the teacher's
hidden width (the representation head, trained against `teacher_hidden`) → classifier.

The `tang` shape (`model: {shape: tang}`) is the Distilled BiLSTM: 300-d embeddings, one layer of 150 units per
direction, the concatenated last states (no max-pool), FC 200 + ReLU, classifier.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, fields

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.func import functional_call

from students.data import iter_texts
from students.data.files import RESAVE, StudentFileError
from students.data.teacher_files import no_teacher_dir
from students.families import Batch, Built, Context, Family, frozen_embeddings, model_values, register
from students.families.bilstm_onnx import BiLSTMGraph
from students.data.tokens import (WordPieceTokens, WordTokens, load_tokens, pca_project, teacher_input_embeddings,
                             teacher_wordpiece, word_vectors_from_wordpiece)
from students.data.vectors import contextual_table, embedding_table
from transferset.config import STUDENT_PRESETS, StudentConfig
from transferset.contract import schema
from transferset.runtime.errors import UserError
from transferset.runtime.progress import log_line


@dataclass
class BiLSTMConfig:
    vocab_size: int = 30522   # the teacher's WordPiece vocabulary (MiniLM / BERT uncased)
    embed_dim: int = 300      # Tang et al. and XtremeDistil both use 300-d word vectors
    hidden: int = 300         # LSTM units per direction (XtremeDistil: 600 in total)
    layers: int = 1
    pool: str = "max"         # "max": max over time (XtremeDistil); "last": final states (Tang)
    head_dim: int = 384       # representation width = teacher hidden width, so repr MSE applies
    head_act: str = "gelu"    # "gelu" (XtremeDistil) or "relu" (Tang)
    num_classes: int = 2
    dropout: float = 0.1
    pad_id: int = 0
    sparse: bool = False      # the table's gradients sparse, learnt by lazy Adam (check_sparse)


# The named shapes (`model: {shape: NAME}`), under the rest of `model:`.
SHAPES = {
    # Tang et al. 2019: 300-d, 1 BiLSTM layer of 150 per direction, FC 200 + ReLU.
    "tang": dict(embed_dim=300, hidden=150, layers=1, pool="last", head_dim=200, head_act="relu"),
    # Mukherjee & Awadallah 2019: BiLSTM(600) returning sequences, max-pool, Dense+GELU(teacher width).
    "xtremedistil": dict(embed_dim=300, hidden=300, layers=1, pool="max", head_act="gelu"),
}


def config_fields() -> set[str]:
    return {f.name for f in fields(BiLSTMConfig)}


class BiLSTM(nn.Module):
    def __init__(self, config: BiLSTMConfig):
        super().__init__()
        if config.pool not in ("max", "last"):
            raise ValueError(f"pool must be 'max' or 'last', got {config.pool!r}")
        if config.head_act not in ("gelu", "relu"):
            raise ValueError(f"head_act must be 'gelu' or 'relu', got {config.head_act!r}")
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.embed_dim, padding_idx=config.pad_id,
                                  sparse=config.sparse)
        self.lstm = nn.LSTM(config.embed_dim, config.hidden, num_layers=config.layers, batch_first=True,
                            bidirectional=True, dropout=config.dropout if config.layers > 1 else 0.0)
        self.head = nn.Linear(2 * config.hidden, config.head_dim)
        self.classifier = nn.Linear(config.head_dim, config.num_classes)
        self.drop = nn.Dropout(config.dropout)
        # One-direction, one-layer LSTMs without weights of their own (meta device), one per input
        # width, kept out of the module's registry: each call lends one of them one direction of
        # `self.lstm`, so the parameters and state-dict keys stay nn.LSTM's and saved students load.
        widths = {config.embed_dim} | ({2 * config.hidden} if config.layers > 1 else set())
        self._one_way = {w: nn.LSTM(w, config.hidden, batch_first=True, device="meta") for w in widths}

    def param_groups(self) -> dict[str, list[nn.Parameter]]:
        """students.families.GROUPS → parameters."""
        return {
            "embeddings": list(self.embed.parameters()),
            "encoder": list(self.lstm.parameters()),
            "head": list(self.head.parameters()),
            "classifier": list(self.classifier.parameters()),
        }

    def _direction(self, x: torch.Tensor, layer: int, reverse: bool) -> torch.Tensor:
        """One direction of one layer of `self.lstm` over padded rows: (B, T, D) → (B, T, H)."""
        suffix = f"_l{layer}" + ("_reverse" if reverse else "")
        weights = {f"{name}_l0": getattr(self.lstm, name + suffix)
                   for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")}
        one_way = self._one_way[x.shape[-1]]
        one_way.train(self.training)  # not a submodule: model.train() / eval() do not reach it
        out, _ = functional_call(one_way, weights, (x,))
        return out

    def encode(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The bidirectional LSTM over right-padded rows → (outputs (B, T, 2H), last states (B, 2H)).

        A row must not depend on what else is in its batch (save → load → identical predictions),
        so padding must never reach a real position. The forward direction runs over the padded
        rows as they are (padding comes after every real token); the backward direction runs over
        each row reversed within its own length, so it too starts at the row's last real token.
        Both run on padded tensors: ~1.5× faster on a CPU than a packed sequence, same values.
        """
        B, T, _ = x.shape
        if not self.training and bool((lengths == T).all()):
            # No row is padded (always so at batch 1): nn.LSTM's own bidirectional call gives the same
            # values without the reversal gathers, ~2x faster per call on a CPU. Training keeps the path
            # below, whose dropout draws between layers are the ones every seed was measured with.
            out, _ = self.lstm(x)                                                      # (B, T, 2H)
            H = self.config.hidden
            return out, torch.cat([out[:, -1, :H], out[:, 0, H:]], dim=-1)             # (B, 2H)
        t = torch.arange(T, device=x.device).unsqueeze(0)                           # (1, T)
        # Reverses positions 0..L-1 of each row, leaves the padding in place; its own inverse.
        rev = torch.where(t < lengths.unsqueeze(1), lengths.unsqueeze(1) - 1 - t, t)  # (B, T)
        last = (lengths - 1).view(B, 1, 1)
        for layer in range(self.config.layers):
            if layer:
                x = F.dropout(x, self.config.dropout, self.training)
            fwd = self._direction(x, layer, reverse=False)                             # (B, T, H)
            bwd_rev = self._direction(x.gather(1, rev.unsqueeze(-1).expand_as(x)), layer, reverse=True)
            bwd = bwd_rev.gather(1, rev.unsqueeze(-1).expand_as(bwd_rev))              # (B, T, H)
            x = torch.cat([fwd, bwd], dim=-1)                                          # (B, T, 2H)
        H = self.config.hidden
        last_fwd = fwd.gather(1, last.expand(B, 1, H)).squeeze(1)                      # (B, H)
        last_bwd = bwd_rev.gather(1, last.expand(B, 1, H)).squeeze(1)                  # (B, H) = position 0
        return x, torch.cat([last_fwd, last_bwd], dim=-1)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
        lengths = mask.sum(1).clamp(min=1)                              # (B,)
        x = self.drop(self.embed(ids))                                  # (B, T, E)
        out, last = self.encode(x, lengths)                             # (B, T, 2H), (B, 2H)
        if self.config.pool == "max":
            valid = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0) < lengths.unsqueeze(1)
            pooled = out.masked_fill(~valid.unsqueeze(-1), float("-inf")).max(dim=1).values  # (B, 2H)
        else:
            pooled = last                                               # (B, 2H) last layer, both directions
        z = self.head(self.drop(pooled))                                # (B, D)
        rep = F.gelu(z) if self.config.head_act == "gelu" else F.relu(z)
        logits = self.classifier(self.drop(rep))                        # (B, C)
        return {"logits": logits, "repr": rep}

    def init_embeddings(self, weight: torch.Tensor) -> None:
        """Copy precomputed vectors (e.g. the teacher's, projected by PCA) into the embedding table."""
        copy_vectors(self.embed, weight, self.config.pad_id)


def copy_vectors(embed: nn.Embedding, weight: torch.Tensor, pad_id: int) -> None:
    """Copy `weight` (V, E) into `embed`'s table, the pad row zero (the BiLSTM's and the static student's)."""
    if weight.shape != embed.weight.shape:
        raise ValueError(f"embedding init has shape {tuple(weight.shape)}, "
                         f"the model needs {tuple(embed.weight.shape)}")
    with torch.no_grad():
        embed.weight.copy_(weight)
        embed.weight[pad_id].zero_()


# --------------------------------------------------------------------------- the family: build, save, load


def student_tokens(ctx: Context):
    """→ (the student's tokens, the teacher's WordPiece tokens when its tokenizer or embeddings are needed).

    Shared with the static family (students/families/static.py): both embed the same tokens."""
    cfg = ctx.cfg
    wordpiece = None
    if cfg.vocab.tokens == "wordpiece" or cfg.vocab.embed_init != "random":
        wordpiece = teacher_wordpiece(cfg, ctx.meta, ctx.max_length)
    if cfg.vocab.tokens == "words":
        texts = (t for batch in iter_texts(ctx.transfer_dir) for t in batch)
        return WordTokens.build(texts, ctx.max_length, cfg.vocab.min_count, cfg.vocab.max_vocab), wordpiece
    if cfg.vocab.trim_vocab:
        keep = wordpiece.seen_ids(iter_texts(ctx.transfer_dir))
        return WordPieceTokens(wordpiece.tokenizer, ctx.max_length, keep=keep), wordpiece
    return wordpiece, wordpiece


def build(ctx: Context) -> Built:
    """The BiLSTM and its tokens, its embeddings initialised from the teacher's unless `embed_init: random`."""
    cfg = ctx.cfg
    tokens, wordpiece = student_tokens(ctx)
    fixed = {"vocab_size": tokens.vocab_size, "num_classes": len(ctx.label_names), "pad_id": tokens.pad_id}
    model = shaped(cfg, fixed, ctx.hidden_width)
    config = model.config
    if cfg.vocab.embed_init != "random":
        model.init_embeddings(initial_vectors(ctx, tokens, wordpiece, config.embed_dim))
    return Built(model, tokens, config, config.head_dim, [])


def shaped(cfg: StudentConfig, fixed: dict, hidden_width: int) -> BiLSTM:
    """The BiLSTM of these settings, untrained (Family.shaped): its named shape (`model: {shape: tang}`, SHAPES) <
    the rest of `model:` < `fixed`. An unknown shape, or a preset (a transformer recipe's settings), is refused here,
    so `run`'s plan, which times this model, refuses it before the teacher."""
    if cfg.preset:
        raise UserError(not_a_preset(cfg.preset))
    model = dict(cfg.model)
    shape = model.pop("shape", None)
    if shape is not None and shape not in SHAPES:
        raise UserError(f"unknown bilstm shape {shape!r} (model: {{shape: NAME}}); known: {', '.join(SHAPES)}")
    defaults = {"head_dim": hidden_width, **SHAPES.get(shape or "", {})}
    try:
        model = BiLSTM(BiLSTMConfig(**model_values(defaults, model, config_fields(), "BiLSTM", fixed)))
    except ValueError as exc:
        raise UserError(f"bilstm student: {exc}") from exc
    check_sparse(model.config.sparse, cfg)
    return model


def not_a_preset(name: str) -> str:
    """Why a BiLSTM takes no `preset: NAME`, and what to write."""
    if name in SHAPES:
        return f"`preset: {name}` is a BiLSTM shape: write `model: {{shape: {name}}}` (a preset is a transformer's)"
    if name in STUDENT_PRESETS:
        return f"preset {name!r} is a transformer preset: drop `student: bilstm`"
    return (f"unknown preset {name!r}: the BiLSTM takes none (its shapes, `model: {{shape: NAME}}`: "
            f"{', '.join(SHAPES)}; the transformer's presets: {', '.join(STUDENT_PRESETS)})")


def check_sparse(sparse: bool, cfg: StudentConfig) -> None:
    """`model: {sparse: true}` makes the word table's gradients sparse: a step of lazy Adam
    (torch.optim.SparseAdam, students/trainer.py) reads and writes the rows a batch used, where AdamW reads and
    writes the whole table. Without weight decay on the table, and only for a table that trains."""
    if sparse and frozen_embeddings(cfg):
        raise UserError("model: {sparse: true} is for a word table that trains; this one is fixed (set "
                        "`vocab: {freeze_embeddings: false}`, or drop `sparse`)")


def initial_vectors(ctx: Context, tokens, wordpiece, dim: int) -> torch.Tensor:
    """The student's table (V, dim) from `embed_init`, one row per token of `tokens` (a word's: the mean of its
    WordPiece rows): the teacher's input embeddings PCA'd to `dim`, or word2vec / model2vec vectors
    (students/data/vectors.py). The static family's too."""
    if ctx.teacher_dir is None:
        raise no_teacher_dir(ctx.meta, f"embed_init: {ctx.cfg.vocab.embed_init}", "`vocab: {embed_init: random}`")
    method, started = ctx.cfg.vocab.embed_init, time.perf_counter()
    # teacher and contextual: PCA after trimming / pooling into words, on the axes of the rows the student keeps
    if method == "teacher":
        table = teacher_input_embeddings(ctx.teacher_dir, len(wordpiece.tokenizer))  # (V_wp, H_t)
    elif method == "contextual":
        table = contextual_table(wordpiece.tokenizer, ctx.teacher_dir, iter_texts(ctx.transfer_dir),
                                 ctx.max_length)                                          # (V_wp, H_t)
    else:
        table = embedding_table(wordpiece.tokenizer, ctx.teacher_dir, dim, method,
                                iter_texts(ctx.transfer_dir), ctx.seed)                   # (V_wp, dim)
    if method != "teacher":
        log_line(f"embed_init {method}: {table.shape[0]} vectors in {time.perf_counter() - started:.1f}s")
    if isinstance(tokens, WordTokens):
        table = word_vectors_from_wordpiece(tokens.vocab, wordpiece.tokenizer, table)
    elif tokens.keep is not None:
        table = table[torch.tensor(tokens.keep)]                           # (V_kept, H)
    return pca_project(table, dim, ctx.seed) if method in ("teacher", "contextual") else table


def forward_batch(model: BiLSTM, batch: Batch) -> dict[str, torch.Tensor]:
    return model(batch["ids"], batch["mask"])


def save(model_dir: str, model: BiLSTM, tokens) -> dict:
    """Weights as safetensors and the tokens' files; → the sidecar's entries."""
    from safetensors.torch import save_file

    # LSTM weights can be views of one flat buffer; safetensors wants contiguous, unshared tensors.
    state = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    save_file(state, os.path.join(model_dir, schema.WEIGHTS_FILE))
    return {"tokens": tokens.save(model_dir)}


def load(model_dir: str, sidecar: dict):
    """→ (model, tokens, config) of a directory written by `save` (`sidecar`: its checked sidecar)."""
    return load_student(model_dir, sidecar, BiLSTMConfig, BiLSTM, "BiLSTM")


def load_student(model_dir: str, sidecar: dict, config_class, model_class, what: str):
    """→ (model, tokens, config) of a `save`d student of `model_class(config_class(**settings))` (the BiLSTM's
    and the static family's files: safetensors weights, the tokens' files, the settings in the sidecar)."""
    from safetensors.torch import load_file

    where = os.path.join(model_dir, schema.STUDENT_SIDECAR_FILE)
    settings = sidecar["model"]
    if not isinstance(settings, dict):
        raise StudentFileError(f"{where}: model is {schema.cut(settings, 100)}, where a {what} student records its "
                               f"model settings (an object); {RESAVE}")
    try:
        config = config_class(**settings)
        model = model_class(config)
    except (TypeError, ValueError) as exc:  # unknown or missing settings, a bad choice of pooling / activation
        raise StudentFileError(f"{where}: the model settings {schema.cut(settings, 200)} do not fit a {what} "
                               f"student ({exc}); was it saved by another version of transferset? {RESAVE}") from exc
    weights = os.path.join(model_dir, schema.WEIGHTS_FILE)
    if not os.path.isfile(weights):
        raise StudentFileError(f"{weights}: missing; {RESAVE}")
    try:
        model.load_state_dict(load_file(weights))
    except RuntimeError as exc:  # missing tensors, or shapes other than the settings give
        raise StudentFileError(f"{weights}: the weights do not fit the settings in {where} "
                               f"({schema.cut(str(exc), 300)}); {RESAVE}") from exc
    return model, load_tokens(model_dir, sidecar["tokens"]), config


def export_graph(model: BiLSTM, tokens) -> nn.Module:
    """The ONNX graph of the student: one ONNX LSTM per layer, a trimmed vocabulary's remapping inside it."""
    return BiLSTMGraph(model, tokens.remap)


# The learning rate's curve a BiLSTM trains with, from the schedule table (benchmarks/README.md, "Learning-rate
# schedule": the demo's scored set, 3 seeds each, SST-2 dev, a split no choice saw): a linear warm-up over 10 % of
# each phase's steps, then a linear decay, 1.4 points over the constant rate (81.8 ± 0.9 against 80.3 ± 0.7), more
# than the seeds' spread. (A transformer keeps the constant rate, at which the 3-layer tinybert student was no
# worse: students/families/transformer.py.)
BILSTM_ENGINE = {"schedule": "linear", "warmup": 0.1}

FAMILY = register(Family("bilstm", build=build, forward=forward_batch, param_groups=BiLSTM.param_groups, save=save,
                         load=load, default_lr=2e-3, export_graph=export_graph, engine=BILSTM_ENGINE,
                         teacher_vectors=True, shaped=shaped))
