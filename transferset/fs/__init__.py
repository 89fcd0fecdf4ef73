"""One filesystem layer for local paths and any URL fsspec knows (gs://, s3://, memory://...).

The library never imports apache_beam, so it cannot use Beam's FileSystems; fsspec is what
`datasets` uses and reaches the same stores. Paths keep the form the caller gave them: a
relative local path stays relative, a URL keeps its scheme, so paths written into rejects
and stats read the way the user typed them.
"""
from __future__ import annotations

import fnmatch
import json
import os
import posixpath
import re
import shutil
import uuid
from contextlib import contextmanager
from typing import IO, Any, Iterable, Iterator, Optional, Sequence

import fsspec
from fsspec.registry import known_implementations, registry

from transferset.runtime.errors import ConfigError, UserError

FILE_URL = "file://"
# RFC 3986: a scheme is a letter, then letters, digits, "+", "-" or "."; fsspec chains URLs with "::".
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")


def scheme(path: str) -> Optional[str]:
    """The URL scheme of `path` in lower case ("gs" for gs://b/x), or None for a local path."""
    m = _URL.match(path)
    return m.group(1).lower() if m else None


def known_schemes() -> set[str]:
    """Schemes fsspec can open here or knows a package for (gs, s3, memory, hf...)."""
    return set(registry) | set(known_implementations)


def normalize(path: str, option: Optional[str] = None, *, schemes: Iterable[str] = ()) -> str:
    """The one form a path takes inside transferset, applied once where a path enters (CLI, stage functions).

    `file:///abs/dir` becomes `/abs/dir` and `file://rel/dir` becomes `rel/dir` (as fsspec reads them),
    so every reader, writer and recorded path sees a plain local path; a local path and any other URL
    are returned unchanged. A URL whose scheme neither fsspec nor `schemes` (e.g. Beam's filesystems)
    knows is a usage error (ConfigError) naming `option`, before anything runs.
    """
    if not isinstance(path, str):
        return path
    if path[:len(FILE_URL)].lower() == FILE_URL:
        local = path[len(FILE_URL):]
        if local.lower().startswith("localhost/"):
            local = local[len("localhost"):]
        if not local:
            raise ConfigError(f"{_where(option, path)}: a file:// URL needs a path, e.g. file:///data/train.tsv")
        return local
    name = scheme(path)
    if name is not None and name not in known_schemes() | {s.lower() for s in schemes if s}:
        raise ConfigError(_unknown_scheme(path, name, option))
    return path


def local_path(path: str, option: Optional[str] = None) -> Optional[str]:
    """The local path behind `path` (a local path or a file:// URL), or None for a remote URL."""
    path = normalize(path, option)
    return None if is_remote(path) else path


def _where(option: Optional[str], path: str) -> str:
    return f"{option} {path}" if option else path


def _unknown_scheme(path: str, name: str, option: Optional[str]) -> str:
    return (f"{_where(option, path)}: unknown URL scheme {name}://; use a local path, file:///PATH, or a URL "
            "of a filesystem fsspec knows (gs://, s3://, az://, hf://, memory://...)")


def is_remote(path: str) -> bool:
    return "://" in path and not path[:len(FILE_URL)].lower() == FILE_URL


def filesystem(path: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """(fsspec filesystem, path inside it) for a local path or URL; names the missing package when needed."""
    name = scheme(path)
    if name is not None and name not in known_schemes():
        raise ConfigError(_unknown_scheme(path, name, None))
    try:
        return fsspec.core.url_to_fs(path)
    except (ImportError, ValueError) as exc:
        package = {"gs": "gcsfs", "gcs": "gcsfs", "s3": "s3fs"}.get(name or "")
        raise UserError(f"{path}: cannot open {name}:// paths ({exc}); install the fsspec backend for "
                        f"{name}{f' ({package})' if package else ''}") from None


def join(*parts: str) -> str:
    # Plain string joining: no client is built, so planning a gs:// run needs no credentials.
    if "://" in parts[0]:
        return posixpath.join(*parts)
    return os.path.join(*parts)


def basename(path: str) -> str:
    return posixpath.basename(path.rstrip("/")) if "://" in path else os.path.basename(path)


def dirname(path: str) -> str:
    return posixpath.dirname(path.rstrip("/")) if "://" in path else os.path.dirname(os.path.normpath(path))


def open(path: str, mode: str = "rb", **kwargs: Any) -> IO:  # noqa: A001 - the fsspec name
    """A file object (fsspec); pyarrow reads Parquet and Arrow files through `open_input` instead."""
    fs, p = filesystem(path)
    return fs.open(p, mode, **kwargs)


def open_input(path: str) -> Any:
    """A readable file for pyarrow (Parquet, Arrow IPC); a context manager like `open`.

    A local path gets Arrow's own OSFile, with no Python object behind it. pyarrow reads Parquet with
    asynchronous I/O on its own threads, and a task there can drop the last reference to the file it
    read after the caller got its table: for a Python file object that means taking the GIL, which
    kills the thread when the interpreter is already exiting, and the process aborted ("terminate called
    without an active exception", seen in CI after `transferset augment` had written its output).
    A URL gets the fsspec file object, which callers read synchronously (`pq.ParquetFile(fh).read()`).
    """
    local = local_path(path)
    if local is None:
        return open(path)
    import pyarrow as pa  # the filesystem layer needs pyarrow only here

    return pa.OSFile(local)


def exists(path: str) -> bool:
    fs, p = filesystem(path)
    return fs.exists(p)


def isdir(path: str) -> bool:
    fs, p = filesystem(path)
    return fs.isdir(p)


def isfile(path: str) -> bool:
    fs, p = filesystem(path)
    return fs.isfile(p)


def size(path: str) -> int:
    fs, p = filesystem(path)
    return int(fs.size(p))


def listdir(directory: str) -> list[str]:
    """Full paths (in the caller's form) of the entries of `directory`, sorted; [] when it does not exist."""
    fs, p = filesystem(directory)
    if not fs.isdir(p):
        return []
    names = {posixpath.basename(e.rstrip("/")) for e in fs.ls(p, detail=False)}
    return sorted(join(directory, n) for n in names if n)


def glob(directory: str, pattern: str) -> list[str]:
    """Entries of `directory` whose name matches `pattern` (fnmatch, one level), sorted."""
    return [path for path in listdir(directory) if fnmatch.fnmatch(basename(path), pattern)]


def makedirs(directory: str) -> None:
    fs, p = filesystem(directory)
    fs.makedirs(p, exist_ok=True)


@contextmanager
def writing_into(out: str) -> Iterator[None]:
    """Around a command's first write into its output `out` (the output lock, `init`'s YAML): a folder this user
    may not write in (PermissionError, also as root under `chattr +i`) is a usage error, one line naming the
    folder, raised before anything is written."""
    try:
        yield
    except PermissionError as exc:
        denied = exc.filename if isinstance(exc.filename, str) and exc.filename else join(out, "x")
        folder = dirname(denied) or "."  # the folder that refused the new entry (a relative name: the cwd)
        why = exc.strerror or str(exc)
        raise ConfigError(f"{out} cannot be written: {folder} does not let this user write in it ({why}); choose a "
                          "folder you can write, or change its permissions") from None


def delete(paths: Sequence[str] | str) -> None:
    """Delete files and directories (recursively); paths that do not exist are skipped."""
    for path in [paths] if isinstance(paths, str) else paths:
        fs, p = filesystem(path)
        if fs.exists(p):
            fs.rm(p, recursive=fs.isdir(p))


def rename(src: str, dst: str) -> None:
    """Move src to dst (on object stores: a copy then a delete; a reader sees dst whole or not at all)."""
    fs, p = filesystem(src)
    fs.mv(p, filesystem(dst)[1])


TMP_PREFIX = "_tmp-"  # files being written by open_atomic: never read; whoever owns the folder deletes strays


@contextmanager
def open_atomic(path: str) -> Iterator[IO]:
    """A file object for writing `path` whole or not at all: it writes a temporary file beside it
    (TMP_PREFIX + a random name + ".partial") and renames it to `path` once the block ends without an
    error. A failed or killed write leaves only the temporary file; a rewrite replaces `path` whole."""
    tmp = join(dirname(path), f"{TMP_PREFIX}{uuid.uuid4().hex}.partial")
    with open(tmp, "wb") as fh:
        yield fh
    rename(tmp, path)


def write_bytes(path: str, data: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(data)


def write_text(path: str, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def read_text(path: str) -> str:
    with open(path, "rb") as fh:
        return fh.read().decode("utf-8")


def read_json(path: str) -> Any:
    return json.loads(read_text(path))


def write_json(path: str, value: Any, **kwargs: Any) -> None:
    write_text(path, json.dumps(value, **kwargs))


def copy_file(src: str, dst: str) -> None:
    """Copy one file between any two filesystems (local ↔ URL), streaming."""
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        shutil.copyfileobj(fin, fout, length=1 << 22)


def copy_tree(src: str, dst: str) -> int:
    """Copy the directory `src` into `dst` (merging; files of the same name are replaced); → files copied."""
    makedirs(dst)
    n = 0
    for path in listdir(src):
        target = join(dst, basename(path))
        if isdir(path):
            n += copy_tree(path, target)
        else:
            copy_file(path, target)
            n += 1
    return n
