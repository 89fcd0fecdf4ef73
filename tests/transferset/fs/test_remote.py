"""A teacher under a URL: copied once to the local cache and checked against the recorded weights hash."""
import os
import uuid

import pytest

from transferset import fs
from transferset.fs import remote
from transferset.models import loading
from transferset.runtime.errors import UserError


def upload(local_dir, url):
    for name in sorted(os.listdir(local_dir)):
        with open(os.path.join(local_dir, name), "rb") as fh:
            fs.write_bytes(fs.join(url, name), fh.read())


@pytest.fixture
def remote_teacher(tiny_teacher, tmp_path, monkeypatch):
    monkeypatch.setenv(remote.CACHE_ENV, str(tmp_path / "cache"))
    url = f"memory://teachers/{uuid.uuid4().hex}"
    upload(tiny_teacher, url)
    yield url
    fs.delete(url)


def sha(directory):
    return loading.sha256_of_files(loading.check_weights(directory, allow_pickle=False))


def test_local_path_unchanged(tiny_teacher):
    assert remote.local_teacher(tiny_teacher, sha256="not checked for local paths") == tiny_teacher


def test_remote_copied_once_and_checked(remote_teacher, tiny_teacher, tmp_path):
    path = remote.local_teacher(remote_teacher, refresh=True)
    assert path.startswith(str(tmp_path / "cache")) and sha(path) == sha(tiny_teacher)
    assert sorted(os.listdir(path)) == sorted(os.listdir(tiny_teacher) + [remote.COPIED_MARKER])
    stamp = os.stat(os.path.join(path, "config.json")).st_mtime_ns
    # A worker with the recorded hash reuses the copy.
    assert remote.local_teacher(remote_teacher, sha256=sha(tiny_teacher)) == path
    assert os.stat(os.path.join(path, "config.json")).st_mtime_ns == stamp
    # A teacher replaced under the same URL after the plan: refused on the worker.
    with pytest.raises(UserError, match="replaced during the run"):
        remote.local_teacher(remote_teacher, sha256="0" * 64)


def test_empty_url_refused(tmp_path, monkeypatch):
    monkeypatch.setenv(remote.CACHE_ENV, str(tmp_path / "cache"))
    with pytest.raises(UserError, match="no files there"):
        remote.local_teacher(f"memory://teachers/{uuid.uuid4().hex}")


def test_subfolders_are_copied_too(remote_teacher, tiny_teacher):
    fs.write_text(fs.join(remote_teacher, "rejects", "dev.jsonl"), "{}\n")
    path = remote.local_teacher(remote_teacher, refresh=True)
    with open(os.path.join(path, "rejects", "dev.jsonl")) as fh:
        assert fh.read() == "{}\n"
    assert sorted(os.listdir(path)) == sorted(os.listdir(tiny_teacher) + [remote.COPIED_MARKER, "rejects"])
