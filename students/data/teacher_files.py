"""Where a student finds what the teacher left: its directory and tokenizer (named in the settings or
recorded in the scored set's metadata, local or on remote storage), its depth and the columns that hold
its intermediate layers (for PKD); and a pretrained student's own checkpoint."""
from __future__ import annotations

import json
import os
from typing import Any, Optional, Sequence

from transferset import fs
from transferset.config import StudentConfig
from transferset.contract import schema
from transferset.models.loading import check_remote_code, load_config, resolve_model
from transferset.runtime.errors import ConfigError, UserError

# Students have no opt-in to a model's own Python code (StudentConfig has no trust_remote_code field): a
# directory with an auto_map is refused by transferset.models.loading's check, and its message ends with these.
NO_CODE_TRAIN = ("students do not run a model's own code: use a tokenizer and teacher directory without auto_map, "
                 "or train with `vocab: {tokens: words, embed_init: random}`, which read no file of the teacher")
NO_CODE_PRETRAINED = "students do not run a model's own code: start from a checkpoint without auto_map"
NO_CODE_LOAD = "students do not run a model's own code: evaluate, predict and export take models without auto_map"


def refuse_remote_code(directory: str, remedy: str = NO_CODE_TRAIN) -> None:
    """Refuse a teacher directory whose files are read without transformers (its weights) when it ships code:
    its tensors belong to that code, not to the built-in architecture the student assumes."""
    check_remote_code(directory, trust_remote_code=False, remedy=remedy)


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


# Web servers list no folders, and a teacher or a tokenizer is a folder of files.
NO_FOLDER_SCHEMES = ("http", "https")


def check_dir_setting(value: Optional[str], where: str) -> None:
    """A setting that names a folder (a student's teacher, tokenizer): a local directory or a URL of a store that
    holds folders. Anything else is a ConfigError naming the setting (`where`), before any stage or output."""
    if not value:
        return
    name = fs.scheme(value)
    if name in NO_FOLDER_SCHEMES:
        raise ConfigError(f"{where}={value}: an {name}:// URL names one file on a web server, and {where} is a folder "
                          "of model files (config.json, weights, tokenizer): copy the folder to a local path or to a "
                          "store that holds folders (gs://, s3://, hf://...) and give that")
    try:
        found = fs.isdir(value)
    except UserError as exc:  # e.g. gs:// without gcsfs installed: the message names what to install
        raise ConfigError(f"{where}={value}: {exc}") from None
    if not found:
        raise ConfigError(f"{where}={value}: no such directory")


def refuse_student_folder(path: Optional[str], role: str, where: Optional[str] = None) -> None:
    """Refuse a student folder of transferset given as the `role` ("teacher" or "tokenizer") setting.

    A BiLSTM student has no config.json, so transformers would treat its folder as a tokenizer to
    convert and fail about sentencepiece: say what the folder is instead. A transformer student's
    model folder is a Hugging Face model, and passes. `where`: the setting's name (default --ROLE).
    """
    if not path or fs.is_remote(path) or not os.path.isdir(path):
        return
    for model_dir in (path, os.path.join(path, schema.STUDENT_MODEL_DIR)):
        sidecar = os.path.join(model_dir, schema.STUDENT_SIDECAR_FILE)
        if os.path.isfile(sidecar) and not os.path.isfile(os.path.join(model_dir, "config.json")):
            try:
                with open(sidecar, encoding="utf-8") as fh:
                    family = json.load(fh).get("family", "")
            except (OSError, ValueError, AttributeError):
                family = ""
            tokenizer = os.path.join(model_dir, "tokenizer")
            if role == "tokenizer" and os.path.isdir(tokenizer):
                hint = f"; its tokenizer is {tokenizer}"
            else:
                hint = ("; pass the teacher's folder (`transferset teacher` output, the run's teacher/), or leave "
                        f"{role} unset to use the one the scored set names")
            raise ConfigError(f"{where or '--' + role} {path}: a {family or 'non-transformer'} student trained by "
                              f"transferset, not a Hugging Face {'teacher' if role == 'teacher' else 'tokenizer'}{hint}")


def checkpoint(value: str) -> str:
    """A pretrained checkpoint named in the settings (`model: {pretrained: ...}`): a URL copied to the local
    cache, a packaged hub name resolved to its offline copy, a directory or another hub name as it is."""
    return resolve_model(_local(value) or value)


def teacher_dir(cfg: StudentConfig, meta: dict) -> Optional[str]:
    """The teacher's local directory: `teacher:` in the settings, else the set's teacher_id when it is one."""
    refuse_student_folder(cfg.teacher, "teacher", "teacher")
    return _local(cfg.teacher) or _existing_dir(meta.get(schema.META_TEACHER_ID), meta.get(schema.META_TEACHER_SHA256))


def tokenizer_dir(cfg: StudentConfig, meta: dict) -> str:
    """The teacher's tokenizer: `tokenizer:` in the settings, else the set's tokenizer, else the teacher's directory."""
    refuse_student_folder(cfg.tokenizer, "tokenizer", "tokenizer")
    for candidate in (_local(cfg.tokenizer), meta.get(schema.META_TOKENIZER), teacher_dir(cfg, meta)):
        if _existing_dir(candidate):
            return candidate
    if isinstance(meta.get(schema.META_TOKENIZER), str):
        return meta[schema.META_TOKENIZER]  # maybe a cached hub name; WordPieceTokens explains a failure
    raise UserError("the transfer set names no tokenizer directory; set `tokenizer: PATH` (the teacher's "
                    "directory) in the --config YAML, or `vocab: {tokens: words}`")


def no_teacher_dir(meta: dict, what: str, instead: str) -> UserError:
    return UserError(f"{what} needs the teacher's files, but the transfer set's teacher_id "
                     f"{meta.get(schema.META_TEACHER_ID)!r} is not a directory: set `teacher: PATH` in --config"
                     + (f", or {instead}" if instead else ""))


def teacher_depth(meta: dict, teacher: Optional[str]) -> Optional[int]:
    """The teacher's encoder layers: the scored set's hidden spec, else its config.json; None when neither tells."""
    spec = meta.get(schema.META_HIDDEN_SPEC)
    if isinstance(spec, dict) and spec.get(schema.HIDDEN_NUM_LAYERS):
        return int(spec[schema.HIDDEN_NUM_LAYERS])
    if teacher is not None:
        return int(load_config(teacher, remedy=NO_CODE_TRAIN).num_hidden_layers)
    return None


def _hidden_layer_columns(names: Sequence[str]) -> list[int]:
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
        have = _hidden_layer_columns(names) + ([main_layer] if main_layer is not None else [])
        raise UserError(f"{transfer_dir}: pkd needs the teacher's hidden states of layers {list(layer_map)} "
                        f"(student layer j ↔ teacher layer), the set has layers {sorted(set(have))}; rescore with "
                        f"`transferset score --layers {','.join(str(k) for k in layer_map)}`")
    return out
