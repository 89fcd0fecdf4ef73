"""Building a student: tokens, the model (initialised from the teacher if asked), and the ONE
registry of student families.

A family is what differs between students: how the model is built from the scored set and the
teacher, its forward pass, its parameter groups (for progressive unfreezing), and how it is saved
and loaded. Everything else (data, losses, schedules, the training loop, evaluation) is shared
and looks a family up by name in FAMILIES.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch
import torch.nn as nn

from students import bilstm, seeds, transformer
from students.data import count_rows, iter_texts
from students.schedules import SCHEDULES
from students.tokens import (WordPieceTokens, WordTokens, load_tokens, pca_project, teacher_input_embeddings,
                             teacher_state, word_vectors_from_wordpiece)
from transferset import fs, schema, transfer
from transferset.config import StudentConfig
from transferset.errors import UserError

Batch = dict  # str → tensor (and the batch's texts), as made by students.data.make_batch


# --------------------------------------------------------------------------- where the teacher is


def _existing_dir(value: Any, sha256: Optional[str] = None) -> Optional[str]:
    """A local directory for `value`: itself when it is one, a cached copy when it is a URL (gs://...).

    A URL that holds no directory is treated as a missing local one (None): the caller says what
    needed it. With `sha256`, the copy must hash to it (the weights the set was scored with).
    """
    if not isinstance(value, str):
        return None
    if fs.is_remote(value):
        from transferset.fs.remote import local_teacher

        try:
            return local_teacher(value, sha256=sha256) if fs.isdir(value) else None
        except UserError:
            if sha256:
                raise  # another teacher than the one that scored the set: say so
            return None
    return value if os.path.isdir(value) else None


def _local(value: Optional[str]) -> Optional[str]:
    """A directory named in the student's settings, made local when it is a URL."""
    if value and fs.is_remote(value):
        local = _existing_dir(value)
        if local is None:
            raise UserError(f"{value}: no such directory (set in --config)")
        return local
    return value


def resolve_teacher_dir(cfg: StudentConfig, meta: dict) -> Optional[str]:
    return _local(cfg.teacher) or _existing_dir(meta.get(schema.META_TEACHER_ID), meta.get(schema.META_TEACHER_SHA256))


def resolve_tokenizer_dir(cfg: StudentConfig, meta: dict) -> str:
    for candidate in (_local(cfg.tokenizer), meta.get(schema.META_TOKENIZER), resolve_teacher_dir(cfg, meta)):
        if _existing_dir(candidate):
            return candidate
    if isinstance(meta.get(schema.META_TOKENIZER), str):
        return meta[schema.META_TOKENIZER]  # maybe a cached hub name; WordPieceTokens explains a failure
    raise UserError("the transfer set names no tokenizer directory; set `tokenizer: PATH` (the teacher's "
                    "directory) in the --config YAML, or `tokens: words`")


def _no_teacher_dir(meta: dict, what: str, instead: str) -> UserError:
    return UserError(f"{what} needs the teacher's files, but the transfer set's teacher_id "
                     f"{meta.get(schema.META_TEACHER_ID)!r} is not a directory: set `teacher: PATH` in --config"
                     + (f", or {instead}" if instead else ""))


def hidden_layer_columns(names: Sequence[str]) -> list[int]:
    """Teacher layers k with a teacher_hidden_l{k} column, in order."""
    out = []
    for n in names:
        if n.startswith(schema.TEACHER_HIDDEN_LAYER_PREFIX):
            try:
                out.append(int(n[len(schema.TEACHER_HIDDEN_LAYER_PREFIX):]))
            except ValueError:
                pass
    return sorted(out)


def pkd_columns(transfer_dir: str, names: Sequence[str], meta: dict, layer_map: Sequence[int]) -> list[str]:
    """The column holding teacher layer k's pooled state for each k in `layer_map`.

    `transferset score` writes the last layer to teacher_hidden and only the other layers to
    teacher_hidden_l{k}, so the last one is found through the hidden spec.
    """
    spec = meta.get(schema.META_HIDDEN_SPEC)
    main_layer = spec.get(schema.HIDDEN_LAYER) if isinstance(spec, dict) else None
    out, missing = [], []
    for k in layer_map:
        if schema.hidden_layer_column(k) in names:
            out.append(schema.hidden_layer_column(k))
        elif k == main_layer:
            out.append(schema.TEACHER_HIDDEN)
        else:
            missing.append(k)
    if missing:
        have = hidden_layer_columns(names) + ([main_layer] if main_layer is not None else [])
        raise UserError(f"{transfer_dir}: pkd needs the teacher's hidden states of layers {list(layer_map)} "
                        f"(student layer j ↔ teacher layer), the set has layers {sorted(set(have))}; rescore with "
                        f"`transferset score --layers {','.join(str(k) for k in layer_map)}`")
    return out


# --------------------------------------------------------------------------- tokens


def build_tokens(cfg: StudentConfig, family: "Family", transfer_dir: str, meta: dict, max_length: int):
    """→ (the student's tokens, the teacher's WordPiece tokens or None when not needed)."""
    if cfg.tokens == "words" and not family.word_tokens:
        raise UserError(f"the {family.name} student uses the teacher's WordPiece tokens; drop `tokens: words`")
    wordpiece = None
    if cfg.tokens == "wordpiece" or cfg.embed_init == "teacher":
        wordpiece = WordPieceTokens.from_dir(resolve_tokenizer_dir(cfg, meta), max_length)
    if cfg.tokens == "words":
        texts = (t for batch in iter_texts(transfer_dir) for t in batch)
        return WordTokens.build(texts, max_length, cfg.min_count, cfg.max_vocab), wordpiece
    # The transformer keeps the teacher's whole vocabulary, so its directory stays a plain HF model.
    if cfg.trim_vocab and family.trim_vocab:
        return WordPieceTokens(wordpiece.tokenizer, max_length, keep=wordpiece.seen_ids(iter_texts(transfer_dir))), wordpiece
    return wordpiece, wordpiece


# --------------------------------------------------------------------------- families


@dataclass
class Context:
    """What a family's build gets: the settings, the tokens and what the scored set tells."""

    cfg: StudentConfig
    tokens: Any
    wordpiece: Optional[WordPieceTokens]
    teacher_dir: Optional[str]
    meta: dict
    label_names: list[str]
    hidden_width: int                # the teacher's teacher_hidden width
    transfer_dir: str
    column_names: list[str]
    seed: int                        # the run's init stream as an int (e.g. PCA padding)


@dataclass
class Built:
    model: nn.Module
    config: Any                      # the model's own config dataclass (recorded in metrics.json)
    repr_width: int                  # width of the model's "repr" output
    pkd_columns: list[str]           # column of the teacher layer behind each student layer (PKD), else []


@dataclass(frozen=True)
class Family:
    name: str
    default_lr: float
    word_tokens: bool                # can use `tokens: words`
    trim_vocab: bool                 # honours `trim_vocab`
    build: Callable[[Context], Built]
    forward: Callable[[nn.Module, Batch], dict]
    param_groups: Callable[[nn.Module], dict]
    save: Callable[[str, nn.Module, Any], dict]               # (dir, model, tokens) → sidecar entries
    load: Callable[[str, dict], tuple[nn.Module, Any]]        # (dir, sidecar) → (model, tokens)


def _model_values(defaults: dict, cfg: StudentConfig, known: set[str], what: str, fixed: dict) -> dict:
    """Model settings: defaults < the config's `model:` < what the data fixes (vocabulary, classes)."""
    values = {**defaults, **cfg.model, **fixed}
    unknown = sorted(set(values) - known)
    if unknown:
        raise UserError(f"model: unknown {what} setting(s) {unknown}; known: {sorted(known)}")
    return values


# ---- BiLSTM: our own module, saved as safetensors + the sidecar


def _build_bilstm(ctx: Context) -> Built:
    cfg, tokens = ctx.cfg, ctx.tokens
    if cfg.preset and cfg.preset not in bilstm.PRESETS:
        raise UserError(f"unknown bilstm preset {cfg.preset!r}; known: {', '.join(bilstm.PRESETS)}")
    if cfg.pkd:
        raise UserError("pkd loss needs a transformer student (`--student transformer`)")
    defaults = {"head_dim": ctx.hidden_width, **(bilstm.PRESETS[cfg.preset] if cfg.preset else {})}
    fixed = {"vocab_size": tokens.vocab_size, "num_classes": len(ctx.label_names), "pad_id": tokens.pad_id}
    try:
        mcfg = bilstm.BiLSTMConfig(**_model_values(defaults, cfg, bilstm.config_fields(), "BiLSTM", fixed))
        model = bilstm.BiLSTM(mcfg)
    except ValueError as exc:
        raise UserError(f"bilstm student: {exc}") from exc
    if cfg.embed_init == "teacher":
        if ctx.teacher_dir is None:
            raise _no_teacher_dir(ctx.meta, "embed_init: teacher", "`embed_init: random`")
        table = teacher_input_embeddings(ctx.teacher_dir)                  # (V_wp, H_t)
        if isinstance(tokens, WordTokens):
            table = word_vectors_from_wordpiece(tokens.vocab, ctx.wordpiece.tokenizer, table)
        elif tokens.keep is not None:
            table = table[torch.tensor(tokens.keep)]                       # (V_kept, H_t)
        model.init_embeddings(pca_project(table, mcfg.embed_dim, ctx.seed))
    return Built(model, mcfg, mcfg.head_dim, [])


def _save_bilstm(model_dir: str, model: nn.Module, tokens) -> dict:
    from safetensors.torch import save_file

    # LSTM weights can be views of one flat buffer; safetensors wants contiguous, unshared tensors.
    state = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    save_file(state, os.path.join(model_dir, schema.WEIGHTS_FILE))
    return {"tokens": tokens.save(model_dir)}


def _load_bilstm(model_dir: str, sidecar: dict):
    from safetensors.torch import load_file

    model = bilstm.BiLSTM(bilstm.BiLSTMConfig(**sidecar["model"]))
    model.load_state_dict(load_file(os.path.join(model_dir, schema.WEIGHTS_FILE)))
    return model, load_tokens(model_dir, sidecar["tokens"])


# ---- Transformer: a Hugging Face sequence classifier, saved with save_pretrained


def _build_transformer(ctx: Context) -> Built:
    from transferset.loading import load_config

    cfg = ctx.cfg
    if cfg.preset:
        raise UserError(f"preset {cfg.preset!r} is a BiLSTM preset; the transformer takes `model:` settings")
    if ctx.teacher_dir is None:
        raise _no_teacher_dir(ctx.meta, "the transformer student (built from the teacher's config.json)", "")
    tconf = load_config(ctx.teacher_dir)
    fixed = {"teacher_layers": int(tconf.num_hidden_layers)}
    mcfg = transformer.TransformerConfig(**_model_values({}, cfg, transformer.config_fields(), "transformer", fixed))
    try:
        layer_map = transformer.teacher_layer_map(mcfg.n_layer, mcfg.teacher_layers, mcfg.init)
        model = transformer.build(tconf, mcfg, ctx.label_names)
        if mcfg.init != "random":
            transformer.load_teacher(model, teacher_state(ctx.teacher_dir), layer_map, mcfg.copy_classifier)
    except ValueError as exc:
        raise UserError(f"transformer student: {exc}") from exc
    width = int(tconf.hidden_size)
    columns: list[str] = []
    if cfg.pkd:
        if width != ctx.hidden_width:
            raise UserError(f"pkd compares [CLS] states: the student's width {width} must equal "
                            f"the teacher's {ctx.hidden_width}")
        columns = pkd_columns(ctx.transfer_dir, ctx.column_names, ctx.meta, layer_map)
    return Built(model, mcfg, width, columns)


def _save_transformer(model_dir: str, model: nn.Module, tokens) -> dict:
    model.save_pretrained(model_dir)
    # A plain HF directory: the tokenizer sits next to config.json, and its model_max_length is
    # the truncation the student was trained with, so `pipeline` truncates the same way.
    tokens.tokenizer.model_max_length = tokens.max_length
    tokens.tokenizer.save_pretrained(model_dir)
    return {"tokens": {"kind": WordPieceTokens.kind, "max_length": tokens.max_length}}


def load_hf_classifier(model_dir: str, max_length: Optional[int] = None):
    """Any Hugging Face sequence-classifier directory → (model, tokens, label names).

    Goes through the teacher's loader: safetensors only, shipped Python code (auto_map) refused.
    """
    from transferset.loading import label_names_of, load_classifier, load_tokenizer

    model = load_classifier(model_dir).eval()
    tokenizer = load_tokenizer(model_dir)
    if max_length is None:
        # A tokenizer without a recorded limit reports a huge model_max_length.
        limit = getattr(model.config, "max_position_embeddings", 512) or 512
        max_length = min(int(tokenizer.model_max_length), int(limit))
    return model, WordPieceTokens(tokenizer, max_length), label_names_of(model.config)


def _load_transformer(model_dir: str, sidecar: dict):
    model, tokens, _ = load_hf_classifier(model_dir, sidecar["tokens"]["max_length"])
    return model, tokens


def _hf_forward(model: nn.Module, batch: Batch) -> dict:
    return transformer.forward(model, batch["ids"], batch["mask"], batch["type_ids"])


FAMILIES: dict[str, Family] = {
    "bilstm": Family("bilstm", default_lr=2e-3, word_tokens=True, trim_vocab=True, build=_build_bilstm,
                     forward=lambda model, batch: model(batch["ids"], batch["mask"]),
                     param_groups=lambda model: model.param_groups(), save=_save_bilstm, load=_load_bilstm),
    "transformer": Family("transformer", default_lr=1e-4, word_tokens=False, trim_vocab=False,
                          build=_build_transformer, forward=_hf_forward, param_groups=transformer.param_groups,
                          save=_save_transformer, load=_load_transformer),
}
# A Hugging Face classifier saved by someone else (e.g. the teacher): predicts like the transformer.
HF_FAMILY = FAMILIES["transformer"]


def family(name: Optional[str], where: str = "student") -> Family:
    if name not in FAMILIES:
        raise UserError(f"{where}: unknown student family {name!r}; known: {', '.join(FAMILIES)}")
    return FAMILIES[name]


# --------------------------------------------------------------------------- setup


@dataclass
class Setup:
    cfg: StudentConfig
    family: Family
    model: nn.Module
    model_config: Any
    tokens: Any
    label_names: list[str]
    meta: dict
    columns: list[str]
    pkd_columns: list[str]           # column of the teacher layer behind each student layer (PKD), else []
    num_rows: int
    num_labeled: int


def setup(cfg: StudentConfig, transfer_dir: str) -> Setup:
    """Check the scored set, build tokens and the student (initialised from the teacher if asked)."""
    fam = family(cfg.student, "student")
    if cfg.schedule not in SCHEDULES:
        raise UserError(f"unknown schedule {cfg.schedule!r}; known: {', '.join(SCHEDULES)}")
    meta = transfer.read_metadata(transfer_dir, scored=True)  # refuses sets without teacher columns
    label_names = list(meta.get(schema.META_LABEL_NAMES) or [])
    if len(label_names) < 2:
        raise UserError(f"{transfer_dir}: the transfer set records label names {label_names}; "
                        "a classifier needs at least two (rebuild it with `transferset augment --labels`)")
    file_schema = transfer.read_schema(transfer.data_files(transfer_dir)[0])
    logits_width = file_schema.field(schema.TEACHER_LOGITS).type.list_size
    if logits_width != len(label_names):
        raise UserError(f"{transfer_dir}: teacher_logits has {logits_width} classes but the set names "
                        f"{len(label_names)} labels {label_names}; it was scored by a teacher for another task")
    hidden_width = file_schema.field(schema.TEACHER_HIDDEN).type.list_size
    num_rows, num_labeled = count_rows(transfer_dir)
    if num_rows == 0:
        raise UserError(f"{transfer_dir}: the transfer set has no rows")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)

    max_length = cfg.max_length or int(meta.get(schema.META_MAX_LENGTH) or 128)
    tokens, wordpiece = build_tokens(cfg, fam, transfer_dir, meta, max_length)
    init_seed = seeds.torch_seed(seeds.stream(cfg.seed, seeds.INIT))
    ctx = Context(cfg, tokens, wordpiece, resolve_teacher_dir(cfg, meta), meta, label_names, hidden_width,
                  transfer_dir, list(file_schema.names), init_seed)
    # The caller's torch random state is left as it was: the init stream is the run's own.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(init_seed)
        built = fam.build(ctx)
    if (cfg.repr or cfg.schedule == "progressive") and built.repr_width != hidden_width:
        raise UserError(f"the representation loss (repr, and stage 1 of the progressive schedule) needs the "
                        f"student's head width ({built.repr_width}) to equal the teacher's hidden width "
                        f"({hidden_width}); drop the head_dim / preset override, or set repr: 0")
    columns = [schema.TEXT, schema.TEXT_B, schema.LABEL, schema.TEACHER_LOGITS, schema.TEACHER_HIDDEN]
    columns += [c for c in built.pkd_columns if c not in columns]
    return Setup(cfg, fam, built.model, built.config, tokens, label_names, meta, columns, built.pkd_columns,
                 num_rows, num_labeled)
