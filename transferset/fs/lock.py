"""An owner for an output folder: one run at a time writes into it.

    from transferset.fs.lock import output_lock

    with output_lock(out, command="score"):
        ...  # every write under `out` happens here

Two runs started on one output used to interleave their shards (every id twice, both exit 0).
Now the first run creates OUT/.transferset.lock (schema.LOCK_FILE) and the second is refused:

    OUT is in use by pid P on host H since T; wait for it, or delete OUT/.transferset.lock if that run is dead

Local folders: the lock file is created with O_CREAT|O_EXCL (atomic: exactly one run wins) and
holds the host, pid, start time and command of its owner. A lock left by a run that died without
cleaning up (kill -9, a power cut) is stale when it names this host and a pid that is no longer
running (or now belongs to a process started after the lock): it is taken over with a warning.
A lock of another host cannot be checked and is never taken over.

Object stores and other fsspec URLs (gs://, s3://...): best effort. The lock is created with
fsspec's exclusive mode ("xb": create only if absent, which gcsfs and s3fs map onto the store's
precondition) and read back; on a store that ignores the precondition, two runs started within
the same moment can both proceed (docs/reliability.md). Where fsspec has no backend for the URL
(an output Beam alone can write), the run goes on without a lock, with a warning.

The lock is re-entrant within one thread (the `run` command may hold it around a stage function
that takes it again), never across threads or processes. It is removed when the block ends,
also on an error; a folder the lock created and that is still empty then is removed too, so a
refused or failed check leaves no trace.

Kept over filelock (4.3, SoftFileLock): its marker holds pid, host and a start token only (no command or start
time for the refusal; its Timeout names just the path), it takes over a live run's lock written in this JSON
format after 2 s as "malformed", and it treats gs://... as a local relative path, so URLs would stay ours anyway.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Iterator, Optional

from transferset import fs
from transferset.contract import schema
from transferset.runtime.errors import ConfigError, UserError

LOG = logging.getLogger("transferset.lock")

LOCK_FILE = schema.LOCK_FILE


class OutputInUse(UserError):
    """Another run owns the output folder."""


@dataclass(frozen=True)
class LockInfo:
    """What a lock file says about its owner."""

    host: str
    pid: int
    started: float  # seconds since the epoch
    command: str = ""
    token: str = ""  # tells this owner's lock from a later one at the same path

    @property
    def started_iso(self) -> str:
        try:
            return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(self.started))
        except (OverflowError, ValueError, OSError):  # a damaged lock file
            return repr(self.started)

    def to_json(self) -> bytes:
        return (json.dumps(asdict(self), sort_keys=True) + "\n").encode("utf-8")

    @classmethod
    def from_bytes(cls, data: bytes) -> "LockInfo":
        """Parse a lock file; ValueError when it is not one (empty, cut short, foreign)."""
        value = json.loads(data.decode("utf-8"))
        if not isinstance(value, dict):
            raise ValueError("not a JSON object")
        try:
            return cls(host=str(value["host"]), pid=int(value["pid"]), started=float(value["started"]),
                       command=str(value.get("command", "")), token=str(value.get("token", "")))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"missing or wrong field: {exc}") from None


def lock_path(out: str) -> str:
    return fs.join(out, LOCK_FILE)


def in_use_message(out: str, holder: LockInfo) -> str:
    return (f"{out} is in use by pid {holder.pid} on host {holder.host} since {holder.started_iso}; wait for it, "
            f"or delete {lock_path(out)} if that run is dead")


# --- who holds what in this process (re-entrance) --------------------------------------------------
_HELD: dict[str, tuple[int, int, "LockInfo"]] = {}  # key -> (thread ident, depth, the lock)
_HELD_LOCK = threading.Lock()


def _key(out: str) -> str:
    return os.path.realpath(out) if not fs.is_remote(out) else out.rstrip("/")


# --- liveness of a local owner ---------------------------------------------------------------------
def _process_start_time(pid: int) -> Optional[float]:
    """When process `pid` started (seconds since the epoch), from /proc; None where unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        with open("/proc/stat", "rb") as fh:
            boot = next(float(line.split()[1]) for line in fh if line.startswith(b"btime"))
        return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22 (starttime), in clock ticks
    except (OSError, IndexError, ValueError, StopIteration):
        return None


def owner_is_alive(holder: LockInfo) -> Optional[bool]:
    """Whether the owner still runs: True, False, or None when it cannot be told (another host)."""
    if holder.host != socket.gethostname():
        return None
    if holder.pid <= 0:
        return False
    try:
        os.kill(holder.pid, 0)
    except (ProcessLookupError, OverflowError):  # OverflowError: no pid is that large
        return False
    except PermissionError:  # another user's process: it exists
        pass
    except OSError:
        return None
    started = _process_start_time(holder.pid)
    # The pid is running, but a process started well after the lock is a reuse of the pid, not the owner.
    if started is not None and started > holder.started + 5:
        return False
    return True


# --- the lock file on a local disk ---------------------------------------------------------------
def _read_local(path: str) -> Optional[bytes]:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except FileNotFoundError:
        return None


def _holder_of(path: str, read) -> Optional[LockInfo]:
    """The owner named by the lock at `path`; None when it vanished meanwhile.

    A lock file is written right after it is created: an unreadable one is read again for a
    moment before it is reported.
    """
    problem = ""
    for _ in range(20):
        data = read(path)
        if data is None:
            return None
        try:
            return LockInfo.from_bytes(data)
        except (ValueError, UnicodeDecodeError) as exc:
            problem = str(exc)
            time.sleep(0.05)
    out = fs.dirname(path)
    raise OutputInUse(f"{out} is locked by {path}, which cannot be read ({problem[:100]}); wait if another run "
                      f"is starting on it, or delete {path} if no run is using {out}")


def _create_local(path: str, info: LockInfo) -> bool:
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "wb") as fh:
        fh.write(info.to_json())
    return True


def _break_local(path: str, stale: LockInfo) -> None:
    """Remove the stale lock `stale`, and only it: another run may take it over at the same moment."""
    aside = f"{path}.stale-{uuid.uuid4().hex}"
    try:
        os.rename(path, aside)  # atomic: of two runs taking over, one moves the stale file
    except FileNotFoundError:
        return
    try:
        moved = LockInfo.from_bytes(_read_local(aside) or b"")
    except (ValueError, UnicodeDecodeError):
        moved = None
    if moved is not None and moved.token != stale.token:
        # The other run took over first and this moved its fresh lock: put it back unless it is there again.
        with contextlib.suppress(OSError):
            os.link(aside, path)
    os.remove(aside)


def _release_local(path: str, info: LockInfo) -> None:
    data = _read_local(path)
    try:
        ours = data is not None and LockInfo.from_bytes(data).token == info.token
    except (ValueError, UnicodeDecodeError):
        ours = False
    if ours:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
    else:
        LOG.warning("%s no longer holds this run's lock (deleted or taken over by another run)", path)


# --- the lock file on an fsspec URL (best effort) --------------------------------------------------
def _read_remote(path: str) -> Optional[bytes]:
    try:
        with fs.open(path, "rb") as fh:
            return fh.read()
    except FileNotFoundError:
        return None


def _create_remote(path: str, info: LockInfo) -> bool:
    try:
        with fs.open(path, "xb") as fh:  # create only if absent, where the store supports it
            fh.write(info.to_json())
    except FileExistsError:
        return False
    except (ValueError, NotImplementedError, TypeError):  # no exclusive mode: check, then write
        if fs.exists(path):
            return False
        fs.write_bytes(path, info.to_json())
    data = _read_remote(path)  # a store that ignored "create only if absent": the last writer won
    try:
        return data is not None and LockInfo.from_bytes(data).token == info.token
    except (ValueError, UnicodeDecodeError):
        return False


def _delete_remote_if(path: str, owner: LockInfo) -> None:
    """Delete a URL's lock only while it is still `owner`'s (a stale one broken, or ours released)."""
    data = _read_remote(path)
    try:
        if data is not None and LockInfo.from_bytes(data).token == owner.token:
            fs.delete(path)
    except (ValueError, UnicodeDecodeError):
        pass


# --- the context manager ---------------------------------------------------------------------------
def acquire(out: str, *, command: str = "") -> LockInfo:
    """Create OUT's lock for this process, taking over a stale one; OutputInUse when another run holds it.

    `out` must exist (local) or be reachable (URL). Prefer `output_lock`, which also releases it.
    """
    remote = fs.is_remote(out)
    path = lock_path(out)
    info = LockInfo(host=socket.gethostname(), pid=os.getpid(), started=time.time(), command=command,
                    token=uuid.uuid4().hex)
    create, read, break_ = ((_create_remote, _read_remote, _delete_remote_if) if remote
                            else (_create_local, _read_local, _break_local))
    for _ in range(5):
        if create(path, info):
            return info
        holder = _holder_of(path, read)
        if holder is None:  # released meanwhile: try again
            continue
        if owner_is_alive(holder) is False:
            LOG.warning("%s: taking over a stale lock: pid %d on host %s (since %s) is no longer running",
                        out, holder.pid, holder.host, holder.started_iso)
            break_(path, holder)
            continue
        raise OutputInUse(in_use_message(out, holder))
    raise OutputInUse(f"{out}: could not take {path} (other runs keep taking it); wait for them, or delete "
                      f"{path} if no run is using {out}")


def release(out: str, info: LockInfo) -> None:
    """Remove OUT's lock if it is still `info`'s."""
    (_delete_remote_if if fs.is_remote(out) else _release_local)(lock_path(out), info)


@contextlib.contextmanager
def output_lock(out: str, *, command: str = "") -> Iterator[Optional[LockInfo]]:
    """Own the output folder `out` for the block; OutputInUse (a UserError: exit 1) when another run owns it, a
    ConfigError (exit 2) naming the folder when this user cannot write there (fs.writing_into).

    Creates a local `out` when needed (and removes it again when the block leaves it empty). Yields
    the lock's LockInfo; None when this thread already owns `out` (nested use: the outer block
    releases it) or when fsspec has no backend for the URL `out` (no lock; a warning says so).
    """
    key = _key(out)
    me = threading.get_ident()
    with _HELD_LOCK:
        held = _HELD.get(key)
        if held is not None and held[0] != me:
            raise OutputInUse(in_use_message(out, held[2]))
        if held is not None:
            _HELD[key] = (me, held[1] + 1, held[2])
    if held is not None:
        try:
            yield None
        finally:
            with _HELD_LOCK:
                _HELD[key] = (me, _HELD[key][1] - 1, held[2])
        return

    if fs.is_remote(out):
        try:
            fs.filesystem(out)
        except ConfigError:
            raise
        except UserError as exc:  # e.g. gs:// written by Beam where gcsfs is not installed
            LOG.warning("%s: not locked (%s); concurrent runs on it are not detected", out, exc)
            yield None
            return
    created = _make_folder(out)
    try:
        with fs.writing_into(out):  # a folder this user cannot write: one line, exit 2
            info = acquire(out, command=command)
    except BaseException:
        if created:
            _remove_if_empty(out)
        raise
    with _HELD_LOCK:
        _HELD[key] = (me, 1, info)
    try:
        yield info
    finally:
        with _HELD_LOCK:
            _HELD.pop(key, None)
        release(out, info)
        if created:
            _remove_if_empty(out)


def _make_folder(out: str) -> bool:
    """Create the output folder `out` where it is missing; → whether it did (then an empty one is removed again)."""
    with fs.writing_into(out):  # a folder this user cannot write: one line, exit 2
        if fs.is_remote(out):
            # Object stores have no folders (a no-op there); filesystems that do (sftp, a mounted dir) need it.
            created = not fs.isdir(out)
            fs.makedirs(out)
            return created
        if os.path.exists(out) and not os.path.isdir(out):
            raise UserError(f"{out} is a file, not a folder: choose another output")
        created = not os.path.isdir(out)
        os.makedirs(out, exist_ok=True)
        return created


def _remove_if_empty(out: str) -> None:
    if fs.is_remote(out):
        with contextlib.suppress(OSError, UserError):
            if fs.isdir(out) and not fs.listdir(out):
                fs.delete(out)
        return
    with contextlib.suppress(OSError):
        os.rmdir(out)
