"""What an output's writers write besides their data (a reject's JSON line, stats.json, the completion marker),
and deleting the files an output's record lists (transferset.fs.output, the protocol, uses both)."""
from __future__ import annotations

import json
import logging
from typing import IO, Any, Callable, Optional, Sequence

from transferset import fs
from transferset.contract import schema

LOG = logging.getLogger("transferset.output")


def reject_line(reject: Any) -> str:
    """One rejected row as the JSON line every rejects file holds (a Reject, or its dict)."""
    value = reject.to_dict() if hasattr(reject, "to_dict") else reject
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def stats_bytes(stats: dict) -> bytes:
    return (json.dumps(stats, indent=2, sort_keys=True, default=list) + "\n").encode("utf-8")


def write_finish(out: str, stats: Optional[dict], complete: bool,
                 write: Callable[[str, bytes], None] = fs.write_bytes) -> None:
    """stats.json, then the completion marker (only when `complete`): the last two writes of a run.

    `write(path, data)` writes a whole file: fsspec here, Beam's FileSystems on a pipeline's worker.
    """
    if stats is not None:
        write(fs.join(out, schema.STATS_FILE), stats_bytes(stats))
    if complete:
        write(fs.join(out, schema.COMPLETE_MARKER), b"")


def _names(value: Any) -> Optional[list[str]]:
    """A manifest's list of entry names; None when it is not one (absent, or damaged)."""
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    return None


def _delete_files(out: str, files: Sequence[str]) -> None:
    """Delete the files at the paths `files` in OUT (one request for them all where the store takes a list)."""
    if not files:
        return
    fsys, root = fs.filesystem(out)
    paths = [root.rstrip("/") + "/" + f for f in files]
    try:
        fsys.rm(paths)
    except FileNotFoundError:  # one went meanwhile: the rest one by one
        for path in paths:
            if fsys.exists(path):
                fsys.rm(path)


def _remove_empty_folders(out: str, entries: Sequence[str]) -> None:
    """Remove the folders under the top-level `entries` (and those entries) that hold nothing now, deepest first.

    Only empty ones: a folder that still holds another's file stays. On an object store a folder with no
    file left is gone already."""
    fsys, root = fs.filesystem(out)
    root = root.rstrip("/")
    for entry in entries:
        top = root + "/" + entry
        if not fsys.isdir(top):
            continue
        folders = [p for p in fsys.find(top, withdirs=True) if fsys.isdir(p)] + [top]
        for folder in sorted(set(folders), key=lambda p: p.count("/"), reverse=True):
            try:
                if fsys.isdir(folder) and not fsys.ls(folder, detail=False):
                    fsys.rmdir(folder)
            except OSError as exc:  # a store that keeps no folders, or one that refuses: nothing to lose
                LOG.debug("%s: not removed (%s)", folder, exc)


def _write_line(fh: IO, reject: Any) -> None:
    fh.write((reject_line(reject) + "\n").encode("utf-8"))
