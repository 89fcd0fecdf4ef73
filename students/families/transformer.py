"""Small Transformer student (BERT-PKD, Sun et al. 2019): the teacher's own Hugging Face
architecture with k layers.

The student is `AutoModelForSequenceClassification.from_config(teacher config)` with
`num_hidden_layers = k` and the task's label names, so a trained student is a normal Hugging Face
model directory (`from_pretrained`, `pipeline("text-classification")` load it without transferset).
It starts from the teacher: embeddings, every m-th teacher layer ("skip", m = teacher layers // k,
so the top teacher layer is always kept), the first k ("first") or the k it names (`init: [1, 5, 9, 12]`), the
pooler and, when its shape fits, the classifier; or from random weights ("random", the teacher's architecture only).
It uses the teacher's full vocabulary and tokenizer: a trimmed one would make the saved directory
something other than a plain Hugging Face model.

Or, with `model: {pretrained: NAME_OR_DIR}`, the student is a pretrained checkpoint of any width and
depth (MiniLM, a 4-layer BERT, DistilRoBERTa) with a fresh head for the task's labels and its own
tokenizer, which reads the cached text. repr / pkd then compare through a projection to the teacher's
width (students.families.projection) that is trained with the student and not saved with it; pkd maps the
student's layers onto the teacher's by the skip rule, with the teacher's depth from the scored set.
"""
from __future__ import annotations

import copy
import os
from dataclasses import dataclass, fields
from typing import Any, Mapping, Optional, Sequence

import torch
import torch.nn as nn

from students.data.files import StudentFileError, read_json_object
from students.families import Batch, Built, Context, Family, model_values, projection, register
from students.data.teacher_files import (NO_CODE_LOAD, NO_CODE_PRETRAINED, NO_CODE_TRAIN, checkpoint, no_teacher_dir,
                                    pkd_columns, teacher_depth)
from students.data.tokens import PretrainedTokens, WordPieceTokens, pca_basis, teacher_state, teacher_wordpiece
from students.families.transformer_layers import encoder_layers, forward, layer_list
from students.families.transformer_maps import teacher_layer_map
from transferset.config import STUDENT_PRESETS
from transferset.contract import schema
from transferset.models.loading import check_remote_code, quiet_transformers, register_ours
from transferset.runtime.errors import UserError


@dataclass
class TransformerConfig:
    n_layer: int = 3                # k: half of a 6-layer MiniLM teacher
    # "skip" (PKD, DistilBERT), "first" (first k teacher layers), "random", or the teacher layers to copy, one per
    # student layer ([1, 5, 9, 12], or "1,5,9,12")
    init: Any = "skip"
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


# Settings of a student copied from the teacher, which a pretrained checkpoint does not take.
TEACHER_COPY = ("n_layer", "init", "copy_classifier", "dropout", "hidden_size", "num_attention_heads",
                "intermediate_size")
SHAPE = ("hidden_size", "num_attention_heads", "intermediate_size")  # settings that change the teacher's shapes


def config_fields() -> set[str]:
    return {f.name for f in fields(TransformerConfig)}


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
    """Parameter groups, bottom-up: embeddings / encoder.1 ... encoder.n (one per layer, for the pkt phase plan;
    the other phase plans fold them into students.families.GROUPS' "encoder") / head (the pooler and anything else
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


# --------------------------------------------------------------------------- the family: build, save, load


def check_preset(name: Optional[str]) -> None:
    """A transformer takes one of its presets (config/presets/NAME.yaml) or none: a BiLSTM's named shape is
    `model: {shape: NAME}` of a BiLSTM."""
    if name and name not in STUDENT_PRESETS:
        raise UserError(f"preset {name!r} is not a transformer preset; the transformer takes `model:` settings or "
                        f"one of its presets: {', '.join(STUDENT_PRESETS)}")


def build(ctx: Context) -> Built:
    """A k-layer copy of the teacher's architecture, initialised from its layers, with its whole tokenizer;
    or, with `pretrained`, that checkpoint with its own tokenizer (build_pretrained)."""
    from transferset.models.loading import load_config

    cfg = ctx.cfg
    if cfg.model.get("pretrained") is not None:
        return build_pretrained(ctx)
    if cfg.vocab.tokens == "words":
        raise UserError("the transformer student uses the teacher's WordPiece tokens; drop `vocab: {tokens: words}`")
    if cfg.vocab.embed_init not in ("teacher", "random"):
        raise UserError(f"embed_init: {cfg.vocab.embed_init} builds a BiLSTM's word vectors; a transformer student "
                        "takes embed_init: teacher or random")
    check_preset(cfg.preset)
    if ctx.teacher_dir is None:
        raise no_teacher_dir(ctx.meta, "the transformer student (built from the teacher's config.json)", "")
    # The teacher's whole vocabulary (`trim_vocab` does not apply): the saved directory stays a plain HF model.
    tokens = teacher_wordpiece(cfg, ctx.meta, ctx.max_length)
    tconf = load_config(ctx.teacher_dir, remedy=NO_CODE_TRAIN)
    fixed = {"teacher_layers": int(tconf.num_hidden_layers)}
    config = TransformerConfig(**model_values({}, cfg.model, config_fields(), "transformer", fixed))
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
        elif "hidden_size" in other and cfg.vocab.embed_init == "teacher":
            project_embeddings(model, teacher_state(ctx.teacher_dir))
    except ValueError as exc:
        raise UserError(f"transformer student: {exc}") from exc
    width = int(model.config.hidden_size)
    columns: list[str] = []
    if cfg.weight("pkd"):
        columns = pkd_columns(ctx.transfer_dir, ctx.column_names, ctx.meta, layer_map)
    # repr / pkd of a narrower student compare through a projection, as a pretrained student's do.
    proj = projection(width, ctx.hidden_width) if uses_teacher_hidden(cfg) else None
    return Built(model, tokens, config, width, columns, proj)


def uses_teacher_hidden(cfg) -> bool:
    """Whether a loss compares the student's states with the teacher's (repr, pkd, progressive stage 1)."""
    return bool(cfg.weight("repr") or cfg.weight("pkd") or cfg.phases == "progressive")


def build_pretrained(ctx: Context) -> Built:
    """A pretrained checkpoint with a fresh head for the task's labels, its own tokenizer, and a projection
    to the teacher's width when a loss compares hidden states and the widths differ."""
    from transferset.models.loading import load_classifier

    cfg = ctx.cfg
    name = cfg.model["pretrained"]
    if not isinstance(name, str) or not name:
        raise UserError(f"model: pretrained = {name!r}: give a hub name or a checkpoint directory")
    if cfg.vocab.tokens == "words" or cfg.tokenizer:
        raise UserError(f"model: pretrained {name!r} tokenizes with the checkpoint's own tokenizer; drop "
                        + ("`vocab: {tokens: words}`" if cfg.vocab.tokens == "words" else f"`tokenizer: {cfg.tokenizer}`"))
    check_preset(cfg.preset)
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
    config = TransformerConfig(**model_values({}, cfg.model, config_fields(), "transformer", fixed))
    columns: list[str] = []
    if cfg.weight("pkd"):
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
    auto_map (transferset.models.loading's check; students have no opt-in) and a model_type transformers knows.
    Each mistake is one StudentFileError naming the file, not a ValueError from inside transformers."""
    import transformers
    from transformers import CONFIG_MAPPING

    register_ours()  # a pruned BERT's model_type (transferset.models.pruning)
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
    refused for good (students have no opt-in, see students.data.teacher_files.NO_CODE_LOAD).
    """
    from transferset.models.loading import label_names_of, load_classifier, load_tokenizer

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


# No engine of its own: the constant rate (families.ENGINE_FALLBACK), at which the 3-layer tinybert student was no
# worse than with the linear schedule (the difference inside the seeds' spread; benchmarks/README.md), so the
# presets keep the rate every figure of theirs was measured with; their papers' schedules: docs/scaling.md.
FAMILY = register(Family("transformer", build=build, forward=forward_batch, param_groups=param_groups, save=save,
                         load=load, default_lr=1e-4, tokens=("wordpiece",), layer_losses=True,
                         outputs=("logits", "repr", "cls_layers")))
