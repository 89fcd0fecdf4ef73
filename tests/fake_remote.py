"""A remote-style URL scheme, `tsfake://`, backed by a local folder, for Beam's FileSystems and fsspec.

Nothing in the project knows this scheme: a path handled with os.path or plain open() instead of
Beam's FileSystems (pipelines) or transferset.fs (library) fails on it, as it would on gs://.
Beam finds FileSystem subclasses when they are defined, so importing this module registers the
scheme for the pipelines too; Beam workers see it when they run in this process (FnApiRunner,
one worker). `use_root(folder)` points the scheme at a folder: `tsfake://a/b` is `folder/a/b`.
"""
from __future__ import annotations

import os
import posixpath

import fsspec
from apache_beam.io.filesystem import FileMetadata
from apache_beam.io.localfilesystem import LocalFileSystem
from fsspec.implementations.dirfs import DirFileSystem
from fsspec.implementations.local import LocalFileSystem as FsspecLocal

SCHEME = "tsfake"
PREFIX = f"{SCHEME}://"
_ROOT: list[str] = []


def use_root(folder: str) -> None:
    os.makedirs(folder, exist_ok=True)
    _ROOT[:] = [os.path.abspath(folder)]


def root() -> str:
    if not _ROOT:
        raise RuntimeError("tsfake:// has no root folder: call fake_remote.use_root(folder) first")
    return _ROOT[0]


def url(relative: str) -> str:
    return PREFIX + relative.lstrip("/")


def local(path: str) -> str:
    """The local file behind a tsfake:// URL (a path already translated passes through: Beam's
    LocalFileSystem calls its own methods on the local path)."""
    if not path.startswith(PREFIX):
        return path
    return os.path.join(root(), path[len(PREFIX):])


def _to_url(local_path: str) -> str:
    rel = os.path.relpath(local_path, root())
    return url(rel.replace(os.sep, "/"))


class FakeBeamFileSystem(LocalFileSystem):
    """Beam's local filesystem under tsfake:// URLs (paths translated in, metadata paths translated out)."""

    @classmethod
    def scheme(cls):
        return SCHEME

    def join(self, basepath, *paths):
        return posixpath.join(basepath, *paths)

    def split(self, path):
        return posixpath.split(path.rstrip("/"))

    def _url_dirname(self, url_or_path):
        return posixpath.dirname(url_or_path)

    def mkdirs(self, path):
        return super().mkdirs(local(path))

    def _list(self, dir_or_prefix):
        for m in super()._list(local(dir_or_prefix)):
            yield FileMetadata(_to_url(m.path), m.size_in_bytes, m.last_updated_in_seconds)

    def create(self, path, *args, **kwargs):
        return super().create(local(path), *args, **kwargs)

    def open(self, path, *args, **kwargs):
        return super().open(local(path), *args, **kwargs)

    def copy(self, source_file_names, destination_file_names):
        return super().copy([local(p) for p in source_file_names], [local(p) for p in destination_file_names])

    def rename(self, source_file_names, destination_file_names):
        return super().rename([local(p) for p in source_file_names], [local(p) for p in destination_file_names])

    def exists(self, path):
        return super().exists(local(path))

    def size(self, path):
        return super().size(local(path))

    def last_updated(self, path):
        return super().last_updated(local(path))

    def checksum(self, path):
        return super().checksum(local(path))

    def metadata(self, path):
        m = super().metadata(local(path))
        return FileMetadata(path, m.size_in_bytes, m.last_updated_in_seconds)

    def delete(self, paths):
        return super().delete([local(p) for p in paths])

    def report_lineage(self, path, lineage, *args, **kwargs):
        return None


class FakeFsspecFileSystem(DirFileSystem):
    """fsspec's view of the same folder: `tsfake://a/b` → root()/a/b."""

    protocol = SCHEME
    cachable = False  # the root changes between tests

    def __init__(self, *args, **kwargs):
        super().__init__(path=root(), fs=FsspecLocal(), **kwargs)

    @classmethod
    def _strip_protocol(cls, path):
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        path = str(path)
        if path.startswith(PREFIX):
            path = path[len(PREFIX):]
        return path.rstrip("/")

    def unstrip_protocol(self, name):
        return url(name)


fsspec.register_implementation(SCHEME, FakeFsspecFileSystem, clobber=True)
