"""Hugging Face datasets: `hf:NAME[:CONFIG]:SPLIT`, NAME a hub dataset or a local folder of data files.

`datasets` reads the whole split before the first row (and fails as a whole on a file that is not
UTF-8), so a split that cannot be loaded is one SourceError saying why, raised by `check` before any
output is written; the rows then go through the same rules as every other reader.
"""
from __future__ import annotations

from typing import Any, Iterator, Optional

from transferset.runtime.errors import ConfigError
from transferset.sources.records import HF_PREFIX, Opener, SourceError


def parse_hf_spec(path: str) -> tuple[str, Optional[str], str]:
    """hf:NAME[:CONFIG]:SPLIT → (name, config, split). NAME may be a local directory."""
    body = path[len(HF_PREFIX):]
    parts = body.rsplit(":", 2)
    if len(parts) == 2:
        return parts[0], None, parts[1]
    if len(parts) == 3 and parts[0]:
        return parts[0], parts[1] or None, parts[2]
    raise SourceError(f"{path}: expected hf:NAME[:CONFIG]:SPLIT, e.g. hf:glue:sst2:validation")


def _causes(exc: BaseException) -> Iterator[BaseException]:
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]


def _cached(name: str) -> bool:
    """Whether hub dataset `name` has a copy in the local caches `datasets` reads offline: its prepared splits
    (HF_DATASETS_CACHE/[ORG___]NAME, the org being the Hub's even for a short name such as glue) or its files
    (HF_HUB_CACHE/datasets--ORG--NAME)."""
    import os

    from datasets import config as ds_config
    from huggingface_hub import constants

    folder = name.replace("/", "___")
    try:
        prepared = os.listdir(ds_config.HF_DATASETS_CACHE)
    except OSError:
        prepared = []
    if any(p == folder or ("/" not in name and p.endswith("___" + name)) for p in prepared):
        return True
    hub = "datasets--" + name.replace("/", "--")
    try:
        return any(p == hub or ("/" not in name and p.startswith("datasets--") and p.endswith("--" + name))
                   for p in os.listdir(constants.HF_HUB_CACHE))
    except OSError:
        return False


class HubDataError(SourceError, ConfigError):
    """An hf: input whose NAME cannot load: an input that cannot be read, and a usage error (exit 2)."""


def check_name(path: str, what: Optional[str] = None) -> None:
    """Refuse, in one ConfigError naming the setting `what` (else the spec), an hf: spec whose NAME cannot load:
    a missing local folder, or a hub dataset that is not cached while the Hub is off or out of reach (no retries).
    Called before any output is written, and by `load` itself, so no reader meets `datasets`' minute of retries."""
    import os

    from transferset.models.loading import check_hub_name

    name, _, _ = parse_hf_spec(path)
    where = f"{what}={path}" if what else path
    if os.path.isdir(name):
        return
    if name.startswith(("/", ".", "~")) or name.count("/") > 1 or os.path.exists(name):  # a hub name: ORG/NAME
        raise HubDataError(f"{where}: {name}: no such folder (hf:PATH:SPLIT reads a local folder of data files)")
    try:
        check_hub_name(name, what=what or path, repo_type="dataset", cached=_cached(name),
                       head=f"{where}: the dataset {name}")
    except ConfigError as exc:
        raise HubDataError(str(exc)) from None


def load(path: str) -> Any:
    """The split `path` names, as a `datasets.Dataset`; a SourceError when it cannot be loaded."""
    check_name(path)
    import datasets  # seconds to import; only hf: inputs need it

    name, config, split = parse_hf_spec(path)
    try:
        return datasets.load_dataset(name, config, split=split)
    except Exception as exc:  # noqa: BLE001 - any failure of a third-party loader becomes one message
        chain = list(_causes(exc))
        undecodable = next((e for e in chain if isinstance(e, UnicodeDecodeError)), None)
        if undecodable is not None:
            raise SourceError(f"{path}: the files of {name!r} are not UTF-8 text ({undecodable}); `datasets` "
                              "reads a split whole, so no row of it is used: convert the files to UTF-8, or "
                              "give each file as an input (.tsv/.csv/.jsonl), where bad bytes are a reject "
                              "per line") from None
        if any(isinstance(e, ConnectionError) for e in chain):
            raise SourceError(f"{path}: {name!r} is not a local folder and the Hugging Face Hub cannot be "
                              f"reached ({_first_line(exc)}); offline, point hf: at a local folder of data "
                              "files (hf:/path/to/folder:SPLIT) or give the files themselves") from None
        raise SourceError(f"{path}: `datasets` cannot load {name!r}"
                          f"{f' config {config!r}' if config else ''} split {split!r}: "
                          f"{type(exc).__name__}: {_first_line(exc)}") from None


def rows(path: str, fmt: str, opener: Opener) -> Iterator[tuple[int, dict]]:
    """(row number from 1, row dict) for each row of the split."""
    for i, rec in enumerate(load(path), start=1):
        yield i, rec
