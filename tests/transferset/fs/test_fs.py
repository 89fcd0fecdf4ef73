"""transferset.fs and transfer.py over fsspec URLs: a set under memory:// reads like the same set on disk."""
import os
import random
import uuid

import numpy as np
import pytest

from transferset import fs
from transferset.contract import schema
from transferset.data import transfer
from transferset.runtime.errors import ConfigError, UserError
import builders as testing

LABELS = ("neg", "pos")


@pytest.fixture
def local_set(tmp_path):
    rows = testing.transfer_rows([f"sentence number {i}" for i in range(23)], labels=[i % 2 for i in range(23)])
    return testing.write_transfer_set(str(tmp_path / "set"), [rows[:10], [], rows[10:]], LABELS,
                                      {schema.META_SEED: 3}), rows


def copy_tree(src: str, dst: str) -> None:
    fs.makedirs(dst)
    for path in fs.listdir(src):
        target = fs.join(dst, fs.basename(path))
        if fs.isdir(path):
            copy_tree(path, target)
        else:
            with fs.open(path) as fh:
                fs.write_bytes(target, fh.read())


@pytest.fixture
def memory_set(local_set):
    url = f"memory://sets/{uuid.uuid4().hex}"
    copy_tree(local_set[0], url)
    yield url
    fs.delete(url)


def test_listing_keeps_the_callers_path_form(local_set, memory_set):
    local, _ = local_set
    names = ["shard-00000.parquet", "shard-00001.parquet", "shard-00002.parquet"]
    assert transfer.data_files(local) == [fs.join(local, schema.DATA_DIR, n) for n in names]
    assert transfer.data_files(memory_set) == [f"{memory_set}/{schema.DATA_DIR}/{n}" for n in names]
    assert fs.listdir(memory_set) == [f"{memory_set}/{schema.COMPLETE_MARKER}", f"{memory_set}/{schema.DATA_DIR}"]
    assert fs.glob(fs.join(memory_set, schema.DATA_DIR), "*-00001.parquet") == \
        [f"{memory_set}/{schema.DATA_DIR}/shard-00001.parquet"]
    assert fs.listdir(f"{memory_set}/missing") == []


def test_memory_set_reads_like_the_local_one(local_set, memory_set):
    local, rows = local_set
    assert transfer.read_metadata(memory_set) == transfer.read_metadata(local)
    assert transfer.read_metadata(memory_set)[schema.META_SEED] == 3
    assert transfer.num_rows(memory_set) == transfer.num_rows(local) == 23
    assert transfer.read_table(memory_set).equals(transfer.read_table(local))
    got = [r for b in transfer.iter_batches(memory_set, columns=[schema.ID, schema.LABEL], batch_size=4)
           for r in b.to_pylist()]
    assert got == [{schema.ID: r[schema.ID], schema.LABEL: r[schema.LABEL]} for r in rows]
    # Shard-order shuffling draws the same order for both.
    a = [b.column(0).to_pylist() for b in transfer.iter_batches(memory_set, [schema.ID], 100, random.Random(1))]
    b = [b.column(0).to_pylist() for b in transfer.iter_batches(local, [schema.ID], 100, random.Random(1))]
    assert a == b and len(a) == 2
    labels = transfer.read_table(memory_set, [schema.LABEL]).column(0).to_numpy()
    np.testing.assert_array_equal(labels, [i % 2 for i in range(23)])


def test_a_local_shard_is_read_through_arrows_own_file_and_a_url_through_fsspec(local_set, memory_set):
    """pyarrow's I/O threads may drop the last reference to the file they read; a Python file object then
    needs the GIL, and at interpreter exit that aborted the process (CI: "terminate called without an
    active exception" after `transferset augment` read its output back). Local files have no Python
    object behind them."""
    import pyarrow as pa

    local, rows = local_set
    shard = transfer.data_files(local)[0]
    for path in (shard, "file://" + os.path.abspath(shard)):
        with fs.open_input(path) as fh:
            assert isinstance(fh, pa.OSFile) and not isinstance(fh, pa.PythonFile)
    remote = transfer.data_files(memory_set)[0]
    with fs.open_input(remote) as fh:
        assert not isinstance(fh, pa.NativeFile) and fh.read(4) == b"PAR1"
    assert transfer.read_table(local, [schema.ID]).column(0).to_pylist() == [r[schema.ID] for r in rows]


def test_rename_delete_exists(tmp_path):
    for base in (str(tmp_path), f"memory://ops/{uuid.uuid4().hex}"):
        fs.makedirs(fs.join(base, "d"))
        fs.write_text(fs.join(base, "d", "a.tmp"), "x")
        fs.rename(fs.join(base, "d", "a.tmp"), fs.join(base, "d", "a.txt"))
        assert fs.listdir(fs.join(base, "d")) == [fs.join(base, "d", "a.txt")]
        assert fs.read_text(fs.join(base, "d", "a.txt")) == "x" and fs.size(fs.join(base, "d", "a.txt")) == 1
        fs.delete([fs.join(base, "d"), fs.join(base, "never-there")])
        assert not fs.exists(fs.join(base, "d"))


def test_incomplete_set_refused_naming_the_marker(local_set, memory_set):
    local, _ = local_set
    assert transfer.require_complete(local) is True
    assert transfer.require_complete(fs.join(local, schema.DATA_DIR)) is True  # data/ itself: marker beside it
    fs.delete(fs.join(memory_set, schema.COMPLETE_MARKER))
    with pytest.raises(UserError, match=f"incomplete: no {memory_set}/{schema.COMPLETE_MARKER}.*--allow-incomplete"):
        transfer.require_complete(memory_set)
    assert transfer.require_complete(memory_set, allow_incomplete=True) is False


def test_unknown_scheme_names_what_to_install():
    with pytest.raises(ConfigError, match="nosuchscheme://bucket/x: unknown URL scheme nosuchscheme://"):
        fs.exists("nosuchscheme://bucket/x")
    # A scheme fsspec knows but whose package is missing: the package to install is named.
    with pytest.raises(UserError, match="oci://.*install the fsspec backend"):
        fs.exists("oci://bucket/x")


def test_local_output_uploads_the_whole_tree_into_the_url(tmp_path, monkeypatch):
    from transferset.fs import remote

    monkeypatch.setenv(remote.CACHE_ENV, str(tmp_path / "cache"))
    url = f"memory://outputs/{uuid.uuid4().hex}"
    fs.write_text(fs.join(url, "kept.txt"), "already there")
    fs.write_text(fs.join(url, "metrics.json"), "old")
    with remote.local_output(url) as work:
        assert not fs.is_remote(work) and os.listdir(work) == []
        os.makedirs(os.path.join(work, "rejects"))
        with open(os.path.join(work, "rejects", "dev.jsonl"), "w") as fh:
            fh.write("{}\n")
        with open(os.path.join(work, "metrics.json"), "w") as fh:
            fh.write("new")
    # Merged into the folder (not a copy of the staging folder inside it); same names replaced.
    assert fs.listdir(url) == [fs.join(url, n) for n in ("kept.txt", "metrics.json", "rejects")]
    assert fs.read_text(fs.join(url, "rejects", "dev.jsonl")) == "{}\n"
    assert fs.read_text(fs.join(url, "metrics.json")) == "new"
    assert fs.read_text(fs.join(url, "kept.txt")) == "already there"
    assert not os.path.exists(work)  # the staging folder is removed after the upload
    local = str(tmp_path / "plain")
    with remote.local_output(local) as work:
        assert work == local  # a local output is written in place
    fs.delete(url)


def test_local_file_copies_a_remote_file_under_its_name(tmp_path, monkeypatch):
    from transferset.fs import remote

    monkeypatch.setenv(remote.CACHE_ENV, str(tmp_path / "cache"))
    url = f"memory://inputs/{uuid.uuid4().hex}/train.tsv"
    fs.write_text(url, "sentence\tlabel\nfine\t1\n")
    path = remote.local_file(url)
    assert path.startswith(str(tmp_path / "cache")) and os.path.basename(path) == "train.tsv"
    with open(path) as fh:
        assert fh.read() == "sentence\tlabel\nfine\t1\n"
    assert os.listdir(os.path.dirname(path)) == ["train.tsv"]  # no temporary file left
    with pytest.raises(UserError, match="missing.tsv: no such file"):
        remote.local_file(fs.join(fs.dirname(url), "missing.tsv"))
    fs.delete(fs.dirname(url))


def test_open_atomic_writes_whole_or_leaves_only_a_temporary_file(tmp_path):
    path = str(tmp_path / "part.bin")
    with fs.open_atomic(path) as fh:
        fh.write(b"first")
    with fs.open_atomic(path) as fh:  # a rewrite replaces the file whole
        fh.write(b"second")
    assert open(path, "rb").read() == b"second" and os.listdir(tmp_path) == ["part.bin"]
    with pytest.raises(RuntimeError):
        with fs.open_atomic(path) as fh:
            fh.write(b"half")
            raise RuntimeError("killed")
    assert open(path, "rb").read() == b"second"
    strays = [n for n in os.listdir(tmp_path) if n != "part.bin"]
    assert len(strays) == 1 and strays[0].startswith(fs.TMP_PREFIX) and strays[0].endswith(".partial")
