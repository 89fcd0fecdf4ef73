"""transferset.fs.lock: one run owns an output folder; a second is refused, a dead owner's lock is taken over."""
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid

import pytest

from transferset import fs
from transferset.contract import schema
from transferset.fs.lock import LockInfo, OutputInUse, output_lock

MESSAGE = (r"{out} is in use by pid {pid} on host {host} since \S+; wait for it, "
           r"or delete {out}/\.transferset\.lock if that run is dead")


def plant_lock(out, pid, host=None, started=None):
    os.makedirs(out, exist_ok=True)
    info = LockInfo(host=host or socket.gethostname(), pid=pid, started=time.time() if started is None else started,
                    command="score", token=uuid.uuid4().hex)
    with open(os.path.join(out, schema.LOCK_FILE), "wb") as fh:
        fh.write(info.to_json())
    return info


@pytest.fixture
def live_pid():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc.pid
    proc.kill()
    proc.wait()


@pytest.fixture
def dead_pid():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_lock_file_names_its_owner_and_is_removed_with_the_folder_it_created(tmp_path):
    out = str(tmp_path / "out")
    with output_lock(out, command="score") as info:
        held = json.loads(open(os.path.join(out, schema.LOCK_FILE)).read())
        assert (held["host"], held["pid"], held["command"]) == (socket.gethostname(), os.getpid(), "score")
        assert abs(held["started"] - time.time()) < 60 and held["token"] == info.token
    assert not os.path.exists(out)  # created by the lock and left empty: a refused run leaves no trace
    os.makedirs(out)
    (tmp_path / "out" / "kept").write_text("x")
    with output_lock(out):
        pass
    assert os.listdir(out) == ["kept"]


def test_a_second_owner_is_refused_in_another_thread_and_another_process(tmp_path, live_pid):
    out = str(tmp_path / "out")
    refused = []

    def second():
        try:
            with output_lock(out):
                refused.append(None)
        except OutputInUse as exc:
            refused.append(str(exc))

    with output_lock(out):
        t = threading.Thread(target=second)
        t.start()
        t.join()
        # Nested use in the owning thread (the `run` command around a stage function) is allowed.
        with output_lock(out) as nested:
            assert nested is None
        assert os.path.exists(os.path.join(out, schema.LOCK_FILE))
    assert refused[0] is not None
    assert refused[0].startswith(f"{out} is in use by pid {os.getpid()} on host {socket.gethostname()} since ")

    plant_lock(out, live_pid)
    with pytest.raises(OutputInUse) as exc:
        with output_lock(out):
            pytest.fail("entered a folder another live process owns")
    assert len(str(exc.value).splitlines()) == 1
    import re
    assert re.fullmatch(MESSAGE.format(out=re.escape(out), pid=live_pid, host=re.escape(socket.gethostname())),
                        str(exc.value))
    assert os.path.exists(os.path.join(out, schema.LOCK_FILE))  # the owner's lock is left alone


def test_a_stale_lock_of_a_dead_pid_is_taken_over_with_a_warning(tmp_path, dead_pid, caplog):
    out = str(tmp_path / "out")
    plant_lock(out, dead_pid)
    with output_lock(out) as info:
        assert info.pid == os.getpid()
    assert "taking over a stale lock" in caplog.text and str(dead_pid) in caplog.text
    assert not os.path.exists(os.path.join(out, schema.LOCK_FILE))


def test_a_reused_pid_does_not_keep_a_lock_alive(tmp_path, live_pid, caplog):
    """The pid runs, but it started after the lock: another process got the dead owner's pid."""
    out = str(tmp_path / "out")
    stale = plant_lock(out, live_pid, started=time.time() - 3600)
    lock = os.path.join(out, schema.LOCK_FILE)
    with output_lock(out) as info:
        # taken over: the lock on disk is now this process's, not the planted one
        assert info.pid == os.getpid() and info.token != stale.token
        with open(lock, "rb") as fh:
            assert LockInfo.from_bytes(fh.read()).token == info.token
    assert "taking over a stale lock" in caplog.text and str(live_pid) in caplog.text
    assert not os.path.exists(lock)


def test_a_lock_of_another_host_is_never_taken_over(tmp_path, dead_pid):
    out = str(tmp_path / "out")
    plant_lock(out, dead_pid, host="another-machine")
    with pytest.raises(OutputInUse, match=f"in use by pid {dead_pid} on host another-machine"):
        with output_lock(out):
            pass


def test_an_unreadable_lock_is_reported_not_taken(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / schema.LOCK_FILE).write_bytes(b"\xff not json")
    with pytest.raises(OutputInUse, match="cannot be read.*delete"):
        with output_lock(str(out)):
            pass


def test_object_store_lock_is_best_effort_create_if_absent():
    out = f"memory://locks/{uuid.uuid4().hex}/out"
    with output_lock(out, command="augment"):
        assert fs.exists(fs.join(out, schema.LOCK_FILE))
        with pytest.raises(OutputInUse, match=f"{out} is in use by pid {os.getpid()}"):
            # another process's view: no in-process record, only the lock object on the store
            from transferset.fs import lock

            lock.acquire(out)
    assert not fs.exists(fs.join(out, schema.LOCK_FILE))


def test_a_url_whose_filesystem_has_folders_gets_its_folder(tmp_path, monkeypatch):
    """fsspec filesystems with real folders (a mounted dir, sftp) need the folder before the lock file."""
    from fsspec.implementations.dirfs import DirFileSystem

    root = tmp_path / "bucket"
    root.mkdir()
    monkeypatch.setattr(fs, "filesystem", lambda path: (DirFileSystem(path=str(root)), path.split("://", 1)[1]))
    out = "memory://not/yet/there"
    with output_lock(out):
        assert (root / "not" / "yet" / "there" / schema.LOCK_FILE).exists()
    assert not (root / "not" / "yet" / "there").exists()
