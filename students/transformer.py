"""Small Transformer student (BERT-PKD, Sun et al. 2019): the teacher's own Hugging Face
architecture with k layers.

The student is `AutoModelForSequenceClassification.from_config(teacher config)` with
`num_hidden_layers = k` and the task's label names, so a trained student is a normal Hugging Face
model directory (`from_pretrained`, `pipeline("text-classification")` load it without transferset).
It starts from the teacher: embeddings, every m-th teacher layer ("skip", m = teacher layers // k,
so the top teacher layer is always kept) or the first k ("first"), the pooler and, when its shape
fits, the classifier; or from random weights ("random", the teacher's architecture only).
It uses the teacher's full vocabulary and tokenizer: a trimmed one would make the saved directory
something other than a plain Hugging Face model.

Or, with `model: {pretrained: NAME_OR_DIR}`, the student is a pretrained checkpoint of any width and
depth (MiniLM, a 4-layer BERT, DistilRoBERTa) with a fresh head for the task's labels and its own
tokenizer, which reads the cached text. repr / pkd then compare through a projection to the teacher's
width (students.family.projection) that is trained with the student and not saved with it; pkd maps the
student's layers onto the teacher's by the skip rule, with the teacher's depth from the scored set.
"""
from __future__ import annotations

import contextlib
import copy
import inspect
import os
from dataclasses import dataclass, fields
from typing import Mapping, Optional, Sequence

import torch
import torch.nn as nn

from students.family import (Batch, Built, Context, Family, StudentFileError, model_values, projection,
                             read_json_object, register)
from students.teacher_files import (NO_CODE_LOAD, NO_CODE_PRETRAINED, NO_CODE_TRAIN, checkpoint, no_teacher_dir,
                                    pkd_columns, teacher_depth)
from students.tokens import PretrainedTokens, WordPieceTokens, pca_basis, teacher_state, teacher_wordpiece
from transferset import schema
from transferset.config import STUDENT_PRESETS
from transferset.errors import UserError
from transferset.loading import check_remote_code, quiet_transformers, register_ours


@dataclass
class TransformerConfig:
    n_layer: int = 3                # k: half of a 6-layer MiniLM teacher
    init: str = "skip"              # "skip" (PKD), "first" (first k teacher layers) or "random"
    copy_classifier: bool = True    # also copy the teacher's classifier when its shape fits
    dropout: Optional[float] = None  # hidden and attention dropout (None: the teacher's)
    teacher_layers: int = 6         # layers of the teacher it is initialised / distilled from (set from its config)
    # start from this pretrained checkpoint instead of the teacher (hub name or directory, e.g.
    # sentence-transformers/all-MiniLM-L6-v2): its own layers, width and tokenizer; n_layer is then
    # recorded from it, and init / copy_classifier / dropout, which describe a copy of the teacher, are refused
    pretrained: Optional[str] = None
    # A narrower student built from the teacher's config (e.g. TinyBERT4: hidden_size 312, 12 heads,
    # intermediate_size 1200); None: the teacher's. Another width than the teacher's means random init.
    hidden_size: Optional[int] = None
    num_attention_heads: Optional[int] = None
    intermediate_size: Optional[int] = None


INITS = ("skip", "first", "random")
# Settings of a student copied from the teacher, which a pretrained checkpoint does not take.
TEACHER_COPY = ("n_layer", "init", "copy_classifier", "dropout", "hidden_size", "num_attention_heads",
                "intermediate_size")
SHAPE = ("hidden_size", "num_attention_heads", "intermediate_size")  # settings that change the teacher's shapes


def config_fields() -> set[str]:
    return {f.name for f in fields(TransformerConfig)}


def teacher_layer_map(n_layer: int, teacher_layers: int, init: str) -> list[int]:
    """Teacher layer (1-based, as in `teacher_hidden_l{k}` / hidden_states[k]) behind each student layer."""
    if init not in INITS:
        raise ValueError(f"init must be one of {INITS}, got {init!r}")
    if not 1 <= n_layer <= teacher_layers:
        raise ValueError(f"a {n_layer}-layer student cannot take layers from a {teacher_layers}-layer teacher")
    if init == "first":
        return list(range(1, n_layer + 1))
    # "skip", and also the PKD targets of a randomly initialised student.
    m = teacher_layers // n_layer
    return [m * (j + 1) for j in range(n_layer)]


# StudentConfig.layer_map: which student layer the layer losses compare with which teacher layer.
LAYER_MAPS = ("uniform", "skip", "first", "last", "last-K", "a list of teacher layers, one per student layer",
              "student:teacher pairs")


def layer_pairs(spec, n_layer: int, teacher_layers: int) -> list[tuple[int, int]]:
    """(student layer, teacher layer) pairs, 1-based, for the layer losses.

    uniform (= skip, TinyBERT's g(m) = m·T/n): as `teacher_layer_map`; first: layer j ↔ j; last: the student's
    layers onto the teacher's top n; last-K: the student's top K layers onto the teacher's top K (MiniLM:
    last-1); "2,4,6" (or a list): teacher layer of each student layer; "3:6,4:12": explicit pairs.
    """
    if isinstance(spec, (list, tuple)):
        spec = ",".join(str(v) for v in spec)
    spec = str(spec).strip()
    if teacher_layers < 1:
        raise ValueError("the teacher's depth is unknown; the layer map needs it")
    if spec in ("uniform", "skip", "first"):
        chosen = teacher_layer_map(n_layer, teacher_layers, "first" if spec == "first" else "skip")
        return [(j + 1, t) for j, t in enumerate(chosen)]
    if spec == "last" or spec.startswith("last-"):
        k = n_layer if spec == "last" else _int(spec[5:], spec)
        if not 1 <= k <= min(n_layer, teacher_layers):
            raise ValueError(f"layer map {spec!r}: K must be between 1 and {min(n_layer, teacher_layers)} "
                             f"(a {n_layer}-layer student, a {teacher_layers}-layer teacher)")
        return [(n_layer - k + i, teacher_layers - k + i) for i in range(1, k + 1)]
    items = [p.strip() for p in spec.split(",") if p.strip()]
    if not items:
        raise ValueError(f"layer map {spec!r}: choose one of {', '.join(LAYER_MAPS)}")
    if all(":" in p for p in items):
        pairs = [(_int(a, spec), _int(b, spec)) for a, b in (p.split(":", 1) for p in items)]
    elif any(":" in p for p in items):
        raise ValueError(f"layer map {spec!r}: give either teacher layers or student:teacher pairs, not both")
    else:
        pairs = [(j + 1, _int(t, spec)) for j, t in enumerate(items)]
        if len(items) != n_layer:
            raise ValueError(f"layer map {spec!r}: {len(items)} teacher layers for a {n_layer}-layer student "
                             "(one per student layer, or student:teacher pairs)")
    bad = [(s, t) for s, t in pairs if not (1 <= s <= n_layer and 1 <= t <= teacher_layers)]
    if bad:
        raise ValueError(f"layer map {spec!r}: pairs {bad} out of range (student layers 1..{n_layer}, "
                         f"teacher layers 1..{teacher_layers})")
    students = [s for s, _ in pairs]
    if len(set(students)) != len(students):
        raise ValueError(f"layer map {spec!r}: a student layer appears twice")
    return sorted(pairs)


def _int(text: str, spec: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"layer map {spec!r}: {text!r} is not a layer number; choose one of "
                         f"{', '.join(LAYER_MAPS)}") from None


# Each shape setting under the names families give it: DistilBERT's feed-forward width is `hidden_dim` (its
# config maps hidden_size and num_attention_heads itself, not intermediate_size).
SHAPE_NAMES = {"intermediate_size": ("intermediate_size", "hidden_dim")}
# Dropout under each family's names: BERT and its kin; DistilBERT; ModernBERT (embeddings, attention, MLP).
DROPOUTS = ("hidden_dropout_prob", "attention_probs_dropout_prob", "dropout", "attention_dropout",
            "embedding_dropout", "mlp_dropout")


def _shape_name(config, name: str) -> str:
    return next((n for n in SHAPE_NAMES.get(name, (name,)) if hasattr(config, n)), name)


def shape_value(config, name: str) -> int:
    """A shape setting (SHAPE) of a Hugging Face config, under whatever name its family uses."""
    return int(getattr(config, _shape_name(config, name)))


def make_model(teacher_config, config: TransformerConfig, label_names: Sequence[str],
               layers: Optional[Sequence[int]] = None) -> nn.Module:
    """A randomly initialised k-layer copy of the teacher's architecture with a head for `label_names`.

    `layers`: the teacher layer (1-based) behind each student layer (None: the skip rule). A family whose
    layers differ by kind (ModernBERT: global attention every third layer, a sliding window on the others)
    gives each student layer the kind of the teacher layer it copies.
    """
    from transformers import AutoModelForSequenceClassification

    c = copy.deepcopy(teacher_config)  # the teacher's config stays intact
    teacher_layers = int(c.num_hidden_layers)
    c.num_hidden_layers = config.n_layer
    c.num_labels = len(label_names)
    c.id2label = {i: str(n) for i, n in enumerate(label_names)}
    c.label2id = {str(n): i for i, n in enumerate(label_names)}
    c.architectures = None  # from_config sets the sequence-classification class on save
    if isinstance(getattr(c, "layer_types", None), (list, tuple)) and len(c.layer_types) == teacher_layers:
        chosen = layers or teacher_layer_map(config.n_layer, teacher_layers, "skip")
        c.layer_types = [c.layer_types[k - 1] for k in chosen]
    if config.dropout is not None:
        for name in DROPOUTS:
            if hasattr(c, name):
                setattr(c, name, config.dropout)
    for name in SHAPE:
        if getattr(config, name) is not None:
            setattr(c, _shape_name(c, name), int(getattr(config, name)))
    if c.hidden_size % c.num_attention_heads:
        raise ValueError(f"hidden_size {c.hidden_size} is not a multiple of num_attention_heads "
                         f"{c.num_attention_heads}")
    return AutoModelForSequenceClassification.from_config(c)


EMBEDDING_TABLES = ("word_embeddings", "position_embeddings", "token_type_embeddings")
WORD_TABLES = ("word_embeddings", "tok_embeddings")


def project_embeddings(model: nn.Module, state: Mapping[str, torch.Tensor]) -> list[str]:
    """A narrower student's embedding tables from the teacher's, through one linear map (H_t → H_s).

    The map is the top principal axes of the teacher's word embeddings (tokens.pca_basis). The same map
    for the word, position and token-type tables keeps their sum (what the embedding LayerNorm sees) the
    projection of the teacher's sum; the teacher's scale is kept. A random narrow student starts from the
    directions the teacher's vocabulary varies most along instead of noise (`embed_init: teacher`, as
    the BiLSTM's). Columns beyond the teacher's width, if any, keep their random init. → the names set.
    """
    prefix = model.base_model_prefix
    own = model.state_dict()
    # ModernBERT calls its word table tok_embeddings; it has no position or token-type tables.
    word_table = next((t for t in WORD_TABLES if f"{prefix}.embeddings.{t}.weight" in own), WORD_TABLES[0])
    names = {t: f"{prefix}.embeddings.{t}.weight" for t in (word_table, *EMBEDDING_TABLES[1:])}
    word = _teacher_key(state, prefix, f"embeddings.{word_table}.weight")
    if word is None:
        raise ValueError(f"the teacher's weights hold no embeddings.{word_table}.weight to project; "
                         "set embed_init: random")
    basis = pca_basis(state[word].float(), own[names[word_table]].shape[1])  # (H_t, k)
    done = []
    with torch.no_grad():
        for table, name in names.items():
            theirs = _teacher_key(state, prefix, f"embeddings.{table}.weight")
            if theirs is None or name not in own or own[name].shape[0] != state[theirs].shape[0]:
                continue  # a table the teacher lacks (or of another size) keeps its random init
            param = model.get_parameter(name)
            param[:, :basis.shape[1]] = state[theirs].float() @ basis
            done.append(name)
    return done


def reshaped(config: TransformerConfig, teacher_config) -> list[str]:
    """The shape settings in which the student differs from the teacher (it cannot start from its weights)."""
    return [n for n in SHAPE if getattr(config, n) is not None
            and int(getattr(config, n)) != shape_value(teacher_config, n)]


def _teacher_key(state: Mapping[str, torch.Tensor], prefix: str, rest: str) -> Optional[str]:
    """The teacher's name for base-model parameter `rest`: with the task model's prefix (bert.) or without (BertModel)."""
    for key in (f"{prefix}.{rest}", rest):
        if key in state:
            return key
    return None


def load_teacher(model: nn.Module, state: Mapping[str, torch.Tensor], layers: Sequence[int],
                 copy_classifier: bool = True) -> list[str]:
    """Copy the teacher's embeddings, its 1-based `layers` (one per student layer), pooler and classifier.

    `state` is the teacher's state dict, of the task model (bert.encoder...) or the base model
    (encoder...). Embeddings and the chosen layers must all be there; the pooler and classifier
    are copied when present with the same shape. → the student's parameter names that were copied.
    """
    if len(layers) != model.config.num_hidden_layers:
        raise ValueError(f"{len(layers)} teacher layers given for {model.config.num_hidden_layers} student layers")
    prefix = model.base_model_prefix
    own = model.state_dict()
    where = layer_list(model).split(".")  # encoder.layer, transformer.layer (DistilBERT), layers (ModernBERT)
    n = len(where)
    copied, missing = [], []
    with torch.no_grad():
        for name, param in own.items():
            if name.startswith(prefix + "."):
                rest = name[len(prefix) + 1:]
                parts = rest.split(".")
                in_layer = parts[:n] == where
                if in_layer:
                    parts[n] = str(layers[int(parts[n])] - 1)   # student layer j ← teacher layer layers[j]
                required = in_layer or parts[0] in ("embeddings", "encoder", "transformer")
                theirs = _teacher_key(state, prefix, ".".join(parts))
            else:  # the task head (classifier) lives outside the base model
                required = False
                theirs = name if copy_classifier and name in state else None
            if theirs is None:
                if required and not name.endswith(("position_ids", "token_type_ids")):
                    missing.append(name)
                continue
            src = state[theirs]
            if src.shape != param.shape:
                if required:
                    raise ValueError(f"teacher {theirs} has shape {tuple(src.shape)}, the student's {name} "
                                     f"{tuple(param.shape)}")
                continue  # e.g. a classifier for another number of labels: keep the fresh one
            param.copy_(src)
            copied.append(name)
    if missing:
        raise ValueError(f"teacher weights lack {missing[:3]}{' ...' if len(missing) > 3 else ''}; "
                         f"are they the weights of a {type(model).__name__}?")
    return copied


def param_groups(model: nn.Module) -> dict[str, list[nn.Parameter]]:
    """Parameter groups, bottom-up: embeddings / encoder.1 ... encoder.n (one per layer, for the pkt schedule;
    the other schedules fold them into students.family.GROUPS' "encoder") / head (the pooler and anything else
    of the base model) / classifier."""
    prefix = model.base_model_prefix + "."
    try:
        where = layer_list(model)
        layers = len(encoder_layers(model))
    except ValueError:
        where, layers = "", 0  # another layout: one "encoder" group
    encoder = [f"encoder.{k}" for k in range(1, layers + 1)] or ["encoder"]
    groups: dict[str, list[nn.Parameter]] = {"embeddings": [], **{g: [] for g in encoder}, "head": [],
                                             "classifier": []}
    # What sits beside the layer list (DeBERTa's relative embeddings, MPNet's attention bias, ModernBERT's
    # final norm) belongs to the encoder; it goes with the top layer.
    outer = where.rsplit(".", 1)[0] + "." if "." in where else None
    for name, p in model.named_parameters():
        rest = name[len(prefix):]
        if not name.startswith(prefix):
            groups["classifier"].append(p)
        elif rest.startswith("embeddings"):  # embeddings. and ELECTRA's embeddings_project.
            groups["embeddings"].append(p)
        elif layers and rest.startswith(where + "."):
            groups[f"encoder.{int(rest[len(where) + 1:].split('.')[0]) + 1}"].append(p)
        elif (outer and rest.startswith(outer)) or (not layers and rest.startswith(("encoder.", "transformer."))):
            groups[encoder[-1]].append(p)
        elif layers and outer is None and rest.startswith("final_norm."):
            groups[encoder[-1]].append(p)
        else:
            groups["head"].append(p)
    return groups


# The query / key / value projections of a self-attention block, by architecture: BERT and its kin (RoBERTa,
# XLM-R, ELECTRA), DeBERTa-v2/v3, DistilBERT, MPNet; ModernBERT's are one fused Linear (FUSED_QKV).
QKV_NAMES = (("query", "key", "value"), ("query_proj", "key_proj", "value_proj"), ("q_lin", "k_lin", "v_lin"),
             ("q", "k", "v"))
FUSED_QKV = ("Wqkv",)
# Where each family keeps its list of layers, under the base model: BERT and its kin, DeBERTa, ELECTRA,
# MPNet: encoder.layer; DistilBERT: transformer.layer; ModernBERT: layers.
LAYER_LISTS = ("encoder.layer", "transformer.layer", "layers")


def layer_list(model: nn.Module) -> str:
    """The path of the encoder's layer list under the base model (one of LAYER_LISTS)."""
    base = model.base_model
    for path in LAYER_LISTS:
        obj = base
        for part in path.split("."):
            obj = getattr(obj, part, None)
        if isinstance(obj, nn.ModuleList):
            return path
    raise ValueError(f"{type(model).__name__}: its layers are in none of {', '.join(LAYER_LISTS)}; a student cut "
                     "from this teacher needs them: set init: random (its architecture only), or start from a "
                     "pretrained checkpoint (model: {pretrained: ...})")


def encoder_layers(model: nn.Module) -> nn.ModuleList:
    """The encoder's layer list of a Hugging Face encoder (LAYER_LISTS)."""
    obj = model.base_model
    for part in layer_list(model).split("."):
        obj = getattr(obj, part)
    return obj


def qkv_modules(layer: nn.Module) -> tuple[nn.Module, ...]:
    """The Linear modules that make a layer's queries, keys and values: three, or one fused (Q | K | V)."""
    named = dict(layer.named_modules())
    for names in QKV_NAMES:
        by = {n.split(".")[-1]: m for n, m in named.items() if n.split(".")[-1] in names}
        if len(by) == 3:
            return by[names[0]], by[names[1]], by[names[2]]
    fused = [m for n, m in named.items() if n.split(".")[-1] in FUSED_QKV]
    if len(fused) == 1:
        return (fused[0],)
    raise ValueError(f"{type(layer).__name__}: no query/key/value projections found; the attention losses take "
                     f"self-attention with projections named {', '.join('/'.join(n) for n in QKV_NAMES)} or a "
                     f"fused {'/'.join(FUSED_QKV)}")


@contextlib.contextmanager
def capture_attention(model: nn.Module, layers: Sequence[int]):
    """Within the block, each forward of `model` records the query, key and value projections of its 1-based
    `layers` in the yielded dict: {k: (q, k, v)}, each (B, heads, L, d_k).

    Forward hooks on the projections, so the attention kernel (eager, SDPA, ...) stays the model's own and
    nothing is computed twice; scores Q·Kᵀ/√d_k are formed only where a loss needs them
    (students.layer_losses.States). The tensors keep their autograd graph. `output_attentions` would not
    do: in transformers 5 it needs eager attention and returns probabilities after the softmax (and after
    attention dropout while training), not TinyBERT's scores.
    """
    heads = int(model.config.num_attention_heads)
    found: dict[int, list] = {}
    handles = []
    blocks = encoder_layers(model)
    try:
        for k in sorted(set(layers)):
            if not 1 <= k <= len(blocks):
                raise ValueError(f"layer {k}: the model has {len(blocks)} layers")
            modules = qkv_modules(blocks[k - 1])
            for slot, module in enumerate(modules):
                def hook(_module, _inputs, output, k=k, slot=slot, fused=len(modules) == 1):
                    states = found.setdefault(k, [None, None, None])
                    if states[slot] is not None:
                        # The first call is the tokens' projection; DeBERTa calls the same projections again on
                        # its relative position embeddings (share_att_key), which are not the layer's Q/K/V.
                        return
                    b, length, width = output.shape
                    parts = output.chunk(3, dim=-1) if fused else (output,)   # fused: Q | K | V along the width
                    for i, part in enumerate(parts):
                        states[slot + i] = part.reshape(b, length, heads, part.shape[-1] // heads).transpose(1, 2)
                handles.append(module.register_forward_hook(hook))
        yield found
    finally:
        for h in handles:
            h.remove()


def forward(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor,
            type_ids: Optional[torch.Tensor] = None, states: Optional[Sequence[int]] = None) -> dict:
    """Any Hugging Face sequence classifier → logits, repr and the [CLS] state of every layer.

    With `states` (1-based layers, possibly empty), also "hidden_states" (embeddings and every layer, each
    (B, L, H)) and "qkv" ({layer: (q, k, v)} of those layers, see capture_attention): what the layer losses
    compare (students/online.py).
    """
    kwargs = {"input_ids": ids, "attention_mask": mask.long(), "output_hidden_states": True}
    # DistilBERT-like models take no token types; a pair's types only matter to models that have them.
    if type_ids is not None and "token_type_ids" in inspect.signature(model.forward).parameters:
        kwargs["token_type_ids"] = type_ids
    with (capture_attention(model, states) if states else contextlib.nullcontext({})) as qkv:
        out = model(**kwargs)
    cls = torch.stack([h[:, 0] for h in out.hidden_states[1:]], dim=1)  # (B, L, H)
    # repr: [CLS] of the last layer, what `transferset score` stores as teacher_hidden by default.
    result = {"logits": out.logits, "repr": cls[:, -1], "cls_layers": cls}   # (B, C), (B, H), (B, L, H)
    if states is not None:
        result.update(hidden_states=out.hidden_states, qkv={k: tuple(v) for k, v in qkv.items()})
    return result


# --------------------------------------------------------------------------- the family: build, save, load


def build(ctx: Context) -> Built:
    """A k-layer copy of the teacher's architecture, initialised from its layers, with its whole tokenizer;
    or, with `pretrained`, that checkpoint with its own tokenizer (build_pretrained)."""
    from transferset.loading import load_config

    cfg = ctx.cfg
    if cfg.model.get("pretrained") is not None:
        return build_pretrained(ctx)
    if cfg.tokens == "words":
        raise UserError("the transformer student uses the teacher's WordPiece tokens; drop `tokens: words`")
    if cfg.preset and cfg.preset not in STUDENT_PRESETS:
        raise UserError(f"preset {cfg.preset!r} is a BiLSTM preset; the transformer takes `model:` settings or "
                        f"one of its presets: {', '.join(STUDENT_PRESETS)}")
    if ctx.teacher_dir is None:
        raise no_teacher_dir(ctx.meta, "the transformer student (built from the teacher's config.json)", "")
    # The teacher's whole vocabulary (`trim_vocab` does not apply): the saved directory stays a plain HF model.
    tokens = teacher_wordpiece(cfg, ctx.meta, ctx.max_length)
    tconf = load_config(ctx.teacher_dir, remedy=NO_CODE_TRAIN)
    fixed = {"teacher_layers": int(tconf.num_hidden_layers)}
    config = TransformerConfig(**model_values({}, cfg, config_fields(), "transformer", fixed))
    other = reshaped(config, tconf)
    if other:
        # Another shape than the teacher's: random weights (the teacher's architecture and vocabulary only).
        if "init" in cfg.model and config.init != "random":
            raise UserError(f"model: {other} differ from the teacher's, so the student cannot start from its "
                            f"weights (init {config.init!r}); set init: random, or drop {other}")
        config.init = "random"
    try:
        layer_map = teacher_layer_map(config.n_layer, config.teacher_layers, config.init)
        model = make_model(tconf, config, ctx.label_names, layer_map)
        if config.init != "random":
            load_teacher(model, teacher_state(ctx.teacher_dir), layer_map, config.copy_classifier)
        elif "hidden_size" in other and cfg.embed_init == "teacher":
            project_embeddings(model, teacher_state(ctx.teacher_dir))
    except ValueError as exc:
        raise UserError(f"transformer student: {exc}") from exc
    width = int(model.config.hidden_size)
    columns: list[str] = []
    if cfg.pkd:
        columns = pkd_columns(ctx.transfer_dir, ctx.column_names, ctx.meta, layer_map)
    # repr / pkd of a narrower student compare through a projection, as a pretrained student's do.
    proj = projection(width, ctx.hidden_width) if uses_teacher_hidden(cfg) else None
    return Built(model, tokens, config, width, columns, proj)


def uses_teacher_hidden(cfg) -> bool:
    """Whether a loss compares the student's states with the teacher's (repr, pkd, progressive stage 1)."""
    return bool(cfg.repr or cfg.pkd or cfg.schedule == "progressive")


def build_pretrained(ctx: Context) -> Built:
    """A pretrained checkpoint with a fresh head for the task's labels, its own tokenizer, and a projection
    to the teacher's width when a loss compares hidden states and the widths differ."""
    from transferset.loading import load_classifier

    cfg = ctx.cfg
    name = cfg.model["pretrained"]
    if not isinstance(name, str) or not name:
        raise UserError(f"model: pretrained = {name!r}: give a hub name or a checkpoint directory")
    if cfg.tokens == "words" or cfg.tokenizer:
        raise UserError(f"model: pretrained {name!r} tokenizes with the checkpoint's own tokenizer; drop "
                        + ("`tokens: words`" if cfg.tokens == "words" else f"`tokenizer: {cfg.tokenizer}`"))
    if cfg.preset and cfg.preset not in STUDENT_PRESETS:
        raise UserError(f"preset {cfg.preset!r} is a BiLSTM preset; the transformer takes `model:` settings or "
                        f"one of its presets: {', '.join(STUDENT_PRESETS)}")
    copy_only = [k for k in TEACHER_COPY if k in cfg.model]
    if copy_only:
        raise UserError(f"model: {copy_only} describe a student copied from the teacher; a pretrained student "
                        f"keeps the layers and dropout of {name!r}: drop them, or drop `pretrained`")
    path = checkpoint(name)
    tokens = PretrainedTokens.from_pretrained(path, ctx.max_length, name)
    try:
        # A fresh head for the task's labels (ignore_mismatched_sizes when the checkpoint has another one).
        model = load_classifier(path, label_names=ctx.label_names, remedy=NO_CODE_PRETRAINED)
    except UserError as exc:
        raise UserError(f"model: pretrained {name!r}: {exc}") from exc
    rows = model.get_input_embeddings().num_embeddings
    if len(tokens.tokenizer) > rows:
        raise UserError(f"model: pretrained {name!r}: its tokenizer has {len(tokens.tokenizer)} tokens, its "
                        f"embeddings {rows} rows; the checkpoint's tokenizer and weights do not belong together")
    width, depth = int(model.config.hidden_size), int(model.config.num_hidden_layers)
    teacher_layers = teacher_depth(ctx.meta, ctx.teacher_dir)
    # teacher_layers 0: the set records no hidden spec and names no teacher directory (only pkd needs it).
    fixed = {"n_layer": depth, "teacher_layers": teacher_layers or 0}
    config = TransformerConfig(**model_values({}, cfg, config_fields(), "transformer", fixed))
    columns: list[str] = []
    if cfg.pkd:
        if not teacher_layers:
            raise no_teacher_dir(ctx.meta, "pkd (the teacher's depth: the set records no hidden spec)", "")
        try:
            layer_map = teacher_layer_map(depth, teacher_layers, config.init)
        except ValueError as exc:
            raise UserError(f"pkd maps each student layer to a teacher layer: {exc}; pick a checkpoint with at "
                            f"most {teacher_layers} layers, or drop pkd") from exc
        columns = pkd_columns(ctx.transfer_dir, ctx.column_names, ctx.meta, layer_map)
    proj = projection(width, ctx.hidden_width) if uses_teacher_hidden(cfg) else None
    return Built(model, tokens, config, width, columns, proj)


def forward_batch(model: nn.Module, batch: Batch) -> dict[str, torch.Tensor]:
    return forward(model, batch["ids"], batch["mask"], batch["type_ids"])


def save(model_dir: str, model: nn.Module, tokens: WordPieceTokens) -> dict:
    """save_pretrained of the model and the tokenizer; → the sidecar's entries."""
    with quiet_transformers():  # a "Writing model shards" bar for one file says nothing
        model.save_pretrained(model_dir)
    # A plain HF directory: the tokenizer sits next to config.json, and its model_max_length is
    # the truncation the student was trained with, so `pipeline` truncates the same way.
    tokens.tokenizer.model_max_length = tokens.max_length
    tokens.tokenizer.save_pretrained(model_dir)
    return {"tokens": {"kind": tokens.kind, "max_length": tokens.max_length}}


RESAVE_HF = "re-save the model with `save_pretrained`, or copy it again"


def check_hf_config(model_dir: str) -> dict:
    """config.json of a classifier directory, checked before transformers reads it: JSON, an object, no
    auto_map (transferset.loading's check; students have no opt-in) and a model_type transformers knows.
    Each mistake is one StudentFileError naming the file, not a ValueError from inside transformers."""
    import transformers
    from transformers import CONFIG_MAPPING

    register_ours()  # a pruned BERT's model_type (transferset.pruning)
    path = os.path.join(model_dir, schema.HF_CONFIG_FILE)
    values = read_json_object(path, holds="a Hugging Face config.json holds model_type, id2label, ...",
                              remedy=RESAVE_HF)
    # Before model_type: a model that ships its own code names a model_type only that code defines.
    check_remote_code(model_dir, trust_remote_code=False, remedy=NO_CODE_LOAD)
    model_type = values.get("model_type")
    if model_type is not None and (not isinstance(model_type, str) or model_type not in CONFIG_MAPPING):
        raise StudentFileError(f"{path}: model_type {schema.cut(model_type, 100)} is not a model type that "
                               f"transformers {transformers.__version__} knows; upgrade transformers, or re-save "
                               "the model with `save_pretrained` as a model type it knows")
    return values


def load_hf_classifier(model_dir: str, max_length: Optional[int] = None):
    """Any Hugging Face sequence-classifier directory → (model, tokens, label names).

    Goes through the teacher's loader: safetensors only, shipped Python code (auto_map) refused, and
    refused for good (students have no opt-in, see students.teacher_files.NO_CODE_LOAD).
    """
    from transferset.loading import label_names_of, load_classifier, load_tokenizer

    check_hf_config(model_dir)
    try:
        model = load_classifier(model_dir, remedy=NO_CODE_LOAD).eval()
    except UserError:
        raise
    except ValueError as exc:  # what transformers refuses past the checks above (e.g. no model_type)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise StudentFileError(f"{os.path.join(model_dir, schema.HF_CONFIG_FILE)}: transformers cannot load a "
                               f"classifier from it ({first}); {RESAVE_HF}") from exc
    try:
        tokenizer = load_tokenizer(model_dir, remedy=NO_CODE_LOAD)
    except UserError:
        raise
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise StudentFileError(f"{model_dir}: cannot load the model's tokenizer ({first}); save it beside the model "
                               "(`tokenizer.save_pretrained(DIR)`)") from exc
    if max_length is None:
        # A tokenizer without a recorded limit reports a huge model_max_length.
        limit = getattr(model.config, "max_position_embeddings", 512) or 512
        max_length = min(int(tokenizer.model_max_length), int(limit))
    return model, WordPieceTokens(tokenizer, max_length), label_names_of(model.config)


def load(model_dir: str, sidecar: dict):
    """→ (model, tokens, config) of a directory written by `save`."""
    model, tokens, _ = load_hf_classifier(model_dir, sidecar["tokens"]["max_length"])
    if sidecar["tokens"].get("kind") == PretrainedTokens.kind:  # the checkpoint's own tokenizer, saved alongside
        tokens = PretrainedTokens(tokens.tokenizer, tokens.max_length)
    # Settings this version does not know (a newer sidecar) describe how it was built, not how it runs.
    recorded, known = sidecar.get("model"), config_fields()
    config = TransformerConfig(**{k: v for k, v in recorded.items() if k in known}) if recorded else None
    return model, tokens, config


FAMILY = register(Family("transformer", build=build, forward=forward_batch, param_groups=param_groups, save=save,
                         load=load, default_lr=1e-4, tokens=("wordpiece",)))
