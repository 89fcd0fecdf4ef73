"""A teacher directory under a URL (gs://, s3://...): copied once to a local cache, checked by sha256.

transformers loads from local directories, so a remote teacher is copied: on the launching
machine before the plan (fresh, so its weights hash is the one recorded in the output), and
once per worker machine in `load_model`, where the copy must hash to the recorded value: a
teacher replaced under the same URL mid-run is refused instead of mixing two teachers.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import uuid
from typing import Iterator, Optional

from transferset import fs
from transferset.models import loading
from transferset.runtime.errors import UserError

CACHE_ENV = "TRANSFERSET_CACHE"  # where remote teachers are copied (default: ~/.cache/transferset)
COPIED_MARKER = ".transferset-copied"  # written last: a copy without it was interrupted


def cache_root() -> str:
    return os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "transferset")


def cache_dir_for(url: str) -> str:
    return os.path.join(cache_root(), "teachers", hashlib.sha1(url.rstrip("/").encode("utf-8")).hexdigest()[:16])


def _get_tree(url: str, dst: str) -> int:
    """Copy the remote directory `url` (with its subdirectories) to the new local `dst`; → files copied."""
    fsys, path = fs.filesystem(url)
    if not fsys.isdir(path):
        return 0
    fsys.get(path.rstrip("/") + "/", dst, recursive=True)  # the trailing "/": its contents, not the folder
    return sum(len(files) for _, _, files in os.walk(dst))


def _download(url: str, target: str) -> None:
    tmp = f"{target}.tmp-{uuid.uuid4().hex}"
    if not _get_tree(url, tmp):
        shutil.rmtree(tmp, ignore_errors=True)
        raise UserError(f"--teacher {url}: no files there; pass the URL of a directory written by "
                        "`transferset teacher` or save_pretrained")
    open(os.path.join(tmp, COPIED_MARKER), "w").close()
    old = f"{target}.old-{uuid.uuid4().hex}"
    if os.path.isdir(target):
        os.rename(target, old)
    try:
        os.rename(tmp, target)
    except OSError:  # another worker process on this machine finished first: use its copy
        shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(old, ignore_errors=True)


def _weights_sha256(directory: str, allow_pickle: bool) -> str:
    return loading.sha256_of_files(loading.check_weights(directory, allow_pickle=allow_pickle))


def local_teacher(teacher: str, *, sha256: Optional[str] = None, refresh: bool = False,
                  allow_pickle: bool = False) -> str:
    """A local directory holding `teacher`: the path itself when local, else a cached copy of the URL.

    refresh: copy again even when cached (the launcher, so the hash it records is current).
    sha256: the weights hash the copy must have (workers); a stale cache is copied again once.
    """
    if not fs.is_remote(teacher):
        return teacher
    target = cache_dir_for(teacher)
    cached = os.path.exists(os.path.join(target, COPIED_MARKER))
    if refresh or not cached or (sha256 and _weights_sha256(target, allow_pickle) != sha256):
        _download(teacher, target)
    if sha256:
        actual = _weights_sha256(target, allow_pickle)
        if actual != sha256:
            raise UserError(f"--teacher {teacher}: its weights hash to {actual}, but this run was planned with "
                            f"{sha256}: the teacher was replaced during the run. Rerun the command (with --resume "
                            "only if the teacher is the one the output was scored with, else --overwrite)")
    return target


def _key(url: str) -> str:
    return hashlib.sha1(url.rstrip("/").encode("utf-8")).hexdigest()[:16]


def local_file(path: str) -> str:
    """A local path holding the file `path`: the path itself when local, else a fresh copy in the cache.

    For readers that only take local files (the teacher's fine-tuning reads its TSVs with plain
    open); the copy keeps the file name, so its format is still told by its extension.
    """
    if not fs.is_remote(path):
        return path
    if not fs.isfile(path):
        raise UserError(f"{path}: no such file")
    directory = os.path.join(cache_root(), "files", _key(path))
    os.makedirs(directory, exist_ok=True)
    target = os.path.join(directory, fs.basename(path))
    tmp = f"{target}.tmp-{uuid.uuid4().hex}"
    fsys, remote_path = fs.filesystem(path)
    fsys.get_file(remote_path, tmp)
    os.replace(tmp, target)
    return target


@contextlib.contextmanager
def local_output(path: str) -> Iterator[str]:
    """A local folder for code that writes only local files, bound for `path`.

    A local `path` is yielded as it is. For a URL, a fresh staging folder is yielded and, when the
    block ends without an error, uploaded whole to `path` and removed.
    """
    if not fs.is_remote(path):
        yield path
        return
    work = staging_dir(path)
    yield work
    fsys, remote_path = fs.filesystem(path)
    # Into the folder, merging with what is there (files of the same name are replaced).
    fsys.put(work.rstrip(os.sep) + os.sep, remote_path, recursive=True)
    shutil.rmtree(work, ignore_errors=True)


def staging_dir(url: str) -> str:
    """A fresh, empty local directory where a stage bound for the URL `url` writes before it is uploaded."""
    directory = os.path.join(cache_root(), "staging", _key(url))
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    return directory
