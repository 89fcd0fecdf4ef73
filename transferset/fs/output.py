"""One output folder written by one transferset command: the protocol every writer follows.

    from transferset.fs.output import Output

    out = Output(path, "augment", inputs=[train, dev], overwrite=overwrite)
    with out.open():           # owns the folder (transferset.fs.lock) until the block ends
        out.check()            # refuses; changes nothing
        ...                    # the caller's own checks
        out.prepare()          # clears what an earlier transferset run wrote here; records this run
        ...                    # write data/ (or a model: `with out.local() as work`)
        out.write_rejects(rejects)
        out.finish(stats)      # stats.json, then _COMPLETE, then the record of what was written

A writer with no stats (a model) takes the shorthand for open, check and finish:

    with Output(path, "train", names=STUDENT_NAMES, inputs=[scored, dev]).writing() as out:
        ...                    # the caller's own checks, then out.prepare()
        with out.local() as work:
            ...                # write the model into work

What is ours. Before `prepare` changes anything it writes OUT/.transferset-output.json
(schema.MANIFEST_FILE): the command, the top-level entries already there that are not ours (`kept`),
and the files of others inside the entries that are ours (`kept_files`: a user's data/keep.txt).
`finish` adds what the run wrote: its top-level entries (`written`) and every file by its path
inside OUT (`files`). Only files are ours, never a folder as such: `prepare` (with --overwrite too)
deletes the files an earlier run wrote, then the folders that leaves empty, and keeps everything else.
A file is ours when the finished record lists it; for a run that never finished, when it appeared
after the record was written (not among `kept_files`). Inside data/ and rejects/, a file whose
name transferset never gives (OWN_NAMES) is another's unless a finished record lists it: so are
they in a folder of an earlier version (a record naming top-level entries only, or no record but
exactly the layout an earlier transferset wrote: data/, rejects/, stats.json, _COMPLETE). An empty
folder holds nothing to lose (a killed `train`'s empty model/).

The rules (docs/reliability.md, "Results are never destroyed or mixed"):
- an output that contains one of the run's inputs is refused, always (a usage error, exit 2);
- files transferset did not write are never deleted: without --overwrite a folder holding any at its
  top level is refused, naming them; with --overwrite the run writes beside them, unless one has a
  name the command writes (data/, a model's config.json...): that is refused whatever the flags.
  Another's file inside a folder of ours is kept and written beside, unless the run would read it as
  its own or write over it (OTHERS_CLASH: data/*.parquet, rejects/rejects*.jsonl): refused, always;
- a complete output is replaced only with --overwrite (`score --resume` completes its own), and so
  is the output of another command; an unfinished output of the same command is ours to redo.
"""
from __future__ import annotations

import contextlib
import fnmatch
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

from transferset import __version__, fs
from transferset.contract import schema
from transferset.fs import remote
from transferset.fs.links import links_under, refuse_links
from transferset.fs.lock import LOCK_FILE, output_lock
from transferset.fs.written import _delete_files, _names, _remove_empty_folders, _write_line, write_finish
from transferset.runtime.errors import ConfigError, UserError

LOG = logging.getLogger("transferset.output")

MANIFEST_FILE = schema.MANIFEST_FILE
STAGE_FILE = schema.STAGE_FILE
# What a data command writes at the top of its folder (augment, score, predict, an evaluation set).
DATA_NAMES = (schema.DATA_DIR, schema.REJECTS_DIR, schema.STATS_FILE, schema.COMPLETE_MARKER)
# A Hugging Face model folder (teacher, export): save_pretrained's names depend on the model, so every
# name is one it may write.
MODEL_NAMES = ("*",)
STUDENT_NAMES = (schema.STUDENT_MODEL_DIR, schema.METRICS_FILE, schema.CURVES_FILE, schema.REJECTS_DIR,
                 schema.COMPLETE_MARKER)
REJECTS_FILE = "rejects.jsonl"
# The names transferset gives what it writes inside data/ and rejects/ (matched on the name right under the
# folder): shards, JSON lines, open_atomic's temporary files and Beam's temporary folders. Where no finished
# record lists a run's files (an earlier version's, a killed run's), only these count as ours there.
OWN_NAMES = {schema.DATA_DIR: ("*.parquet", "*.jsonl", fs.TMP_PREFIX + "*", "beam-temp-*"),
             schema.REJECTS_DIR: ("*.jsonl", fs.TMP_PREFIX + "*", "beam-temp-*")}
# Another's file at such a path inside a folder of ours is refused whatever the flags: the output's readers
# would take it for one of the run's shards (data/), or the run would write over it (its rejects files).
OTHERS_CLASH = (f"{schema.DATA_DIR}/*.parquet", f"{schema.DATA_DIR}/*.jsonl",
                f"{schema.REJECTS_DIR}/{REJECTS_FILE.split('.')[0]}*.jsonl")
OVERWRITE_HELP = ("replace what an earlier transferset run wrote in the output (a complete one, or another "
                  "command's); files transferset did not write are never deleted")
SHOWN = 5  # entries named in a message

# What each command's folder holds, for messages that say what a folder really is.
WHAT = {
    "augment": "a transfer set",
    "score": "a scored transfer set",
    "predict": "predictions",
    "eval-set": "an evaluation set",
    "teacher": "a fine-tuned teacher model",
    "train": "a trained student",
    "export": "an ONNX export",
    "prune": "a head-pruned model",
}


def _inside(path: str, folder: str) -> bool:
    """Whether `path` is `folder` or lies under it (local paths resolved, symbolic links followed)."""
    if not path or path.startswith("hf:") or fs.is_remote(path) != fs.is_remote(folder):
        return False
    if fs.is_remote(path):
        a, b = path.rstrip("/"), folder.rstrip("/")
        return a == b or a.startswith(b + "/")
    a, b = os.path.realpath(path), os.path.realpath(folder)
    return a == b or a.startswith(b.rstrip(os.sep) + os.sep)


def _looks_like(names: Sequence[str]) -> str:
    """What a folder of others' files seems to be, for the message that refuses it."""
    if "config.yaml" in names and {"data", "teacher", "transfer", "scored", "students"} & set(names):
        return " (a `transferset run` directory)"
    if schema.HF_CONFIG_FILE in names:
        return " (a model folder)"
    return ""


@dataclass
class State:
    """What an output folder holds, from the point of view of the command about to write it."""

    ours: list[str]  # top-level entries an earlier transferset run wrote (or empty folders)
    foreign: list[str]  # the other entries: never deleted
    command: Optional[str]  # the command that wrote ours ("" an earlier version's layout; None: nothing)
    complete: bool  # ours holds the completion marker
    files: list[str] = field(default_factory=list)  # the files under `ours` an earlier run wrote (paths in OUT)
    others: list[str] = field(default_factory=list)  # the other files under `ours`: kept

    def what(self) -> str:
        if self.command:
            return f"`transferset {self.command}` ({WHAT.get(self.command, 'its output')})"
        return "an earlier transferset version (data/, _COMPLETE; no record of the command)"


def _own_name(rel: str) -> bool:
    """Whether `rel` (a path in OUT) has a name transferset gives its files there (OWN_NAMES)."""
    parts = rel.split("/")
    patterns = OWN_NAMES.get(parts[0])
    if patterns is None:
        return True  # a model's folders, stats.json...: every name there is one a run may write
    return len(parts) > 1 and any(fnmatch.fnmatchcase(parts[1], pattern) for pattern in patterns)


class Output:
    """The output folder of one run of `command` (see the module docstring for the protocol).

    `inputs`: every path the run reads (files, folders, models); an output containing one is refused.
    `names`: fnmatch patterns of the top-level entries the command writes; an entry of another's with
    such a name is never written over. `schemes`: URL schemes known besides fsspec's (Beam's), and
    `lister(path)` the paths under such a URL: an output fsspec cannot read is written only when empty.
    """

    def __init__(self, path: str, command: str, *, inputs: Iterable[Optional[str]] = (),
                 names: Sequence[str] = DATA_NAMES, overwrite: bool = False, resume: bool = False,
                 option: str = "--output", schemes: Iterable[str] = (),
                 lister: Optional[Callable[[str], list[str]]] = None):
        schemes = tuple(schemes)
        self.path = fs.normalize(path, option, schemes=schemes)  # once, here
        self.command, self.names, self.option = command, tuple(names), option
        self.overwrite, self.resume = overwrite, resume
        self.inputs = [fs.normalize(p, schemes=schemes) for p in inputs if p]
        self.lister = lister  # what is under a URL fsspec cannot read (Beam's FileSystems); [] when nothing
        self._checked: Optional[State] = None
        self._unchecked = False  # fsspec has no backend for the URL: a warning said so

    def __repr__(self) -> str:
        return f"Output({self.path!r}, {self.command!r})"

    def join(self, *parts: str) -> str:
        return fs.join(self.path, *parts)

    # --- owning the folder ------------------------------------------------------------------------
    @contextlib.contextmanager
    def open(self) -> Iterator["Output"]:
        """Own the folder for the block (transferset.fs.lock): a second run on it is refused."""
        with output_lock(self.path, command=self.command):
            yield self

    @contextlib.contextmanager
    def writing(self) -> Iterator["Output"]:
        """The protocol around one writer's block: own the folder (`open`), refuse what `check` refuses,
        and when the block ends without an error `finish` (_COMPLETE, then the record of what was
        written). The block makes its own checks, then calls `prepare`, then writes (a model: under
        `local()`); an error anywhere leaves the folder unfinished, to be redone."""
        with self.open():
            self.check()
            yield self
            self.finish()

    # --- what the folder holds ------------------------------------------------------------------------
    def _entries(self) -> list[str]:
        return [fs.basename(p) for p in fs.listdir(self.path)  # the stage record is `run`'s, beside any output
                if not fs.basename(p).startswith(LOCK_FILE) and fs.basename(p) not in (MANIFEST_FILE, STAGE_FILE)]

    def manifest(self) -> Optional[dict]:
        """OUT's record of the run that wrote it; None when there is none (or it cannot be read)."""
        path = self.join(MANIFEST_FILE)
        try:
            value = fs.read_json(path) if fs.exists(path) else None
        except (ValueError, UnicodeDecodeError, OSError):
            LOG.warning("%s cannot be read: the folder's entries count as another's", path)
            return None
        if value is None:
            return None
        if not (isinstance(value, dict) and isinstance(value.get("command"), str) and _names(value.get("kept")) is not None
                and all(key not in value or _names(value[key]) is not None
                        for key in ("written", "files", "kept_files"))):
            LOG.warning("%s is not a record transferset wrote: the folder's entries count as another's", path)
            return None
        return value

    def _empty(self, name: str) -> bool:
        path = self.join(name)
        if not fs.isdir(path):
            return False
        fsys, p = fs.filesystem(path)
        return not fsys.find(p)

    def _earlier_layout(self, entries: Sequence[str]) -> bool:
        """The folder of an augment, score or predict run of a transferset that kept no manifest: its
        top-level names (others' files inside data/ and rejects/ are told apart by their names)."""
        return schema.COMPLETE_MARKER in entries and set(entries) <= set(DATA_NAMES)

    def _files(self, entries: Sequence[str]) -> list[str]:
        """Every file under the top-level `entries`, as a path in OUT ("data/part-0.parquet"), sorted."""
        if not entries:
            return []
        fsys, root = fs.filesystem(self.path)
        root = root.rstrip("/")
        wanted, found = set(entries), []
        for path in fsys.find(root):  # one listing of the whole folder, not one request per entry
            rel = path[len(root):].lstrip("/") if path.startswith(root) else ""
            if rel and rel.split("/")[0] in wanted:
                found.append(rel)
        return sorted(found)

    def state(self) -> State:
        entries = self._entries()
        manifest = self.manifest()
        command: Optional[str] = None
        listed: Optional[list[str]] = None  # the files a finished run of this version recorded
        kept_files: list[str] = []  # others' files its record kept inside its entries
        if manifest is not None:
            written, kept = _names(manifest.get("written")), set(manifest["kept"])
            ours = [n for n in entries if (n in written if written is not None else n not in kept)]
            command = manifest["command"][:50] or None
            listed, kept_files = _names(manifest.get("files")), manifest.get("kept_files") or []
        elif self._earlier_layout(entries):
            ours, command = list(entries), ""
        else:
            ours = []
        if not ours:
            command = None
        ours += [n for n in entries if n not in ours and self._empty(n)]
        foreign = [n for n in entries if n not in ours]
        inside = self._files(ours)
        if listed is not None:
            mine = set(listed)
            files = [f for f in inside if f in mine]
        else:  # no list of files: those that appeared after the record, by the names transferset gives them
            skip = set(kept_files)
            files = [f for f in inside if f not in skip and _own_name(f)]
        chosen = set(files)
        return State(ours=ours, foreign=foreign, command=command,
                     complete=schema.COMPLETE_MARKER in chosen and command is not None,
                     files=files, others=[f for f in inside if f not in chosen])

    def _writes(self, name: str) -> bool:
        return any(fnmatch.fnmatchcase(name, pattern) for pattern in self.names)

    def _touches(self, name: str, st: State) -> bool:
        """Whether the run may write, clear or record anything at the top-level entry `name`."""
        return (name in st.ours or self._writes(name) or name in (MANIFEST_FILE, STAGE_FILE)
                or name.startswith(LOCK_FILE))

    def _shown(self, names: Sequence[str]) -> str:
        shown = []
        for name in sorted(names)[:SHOWN]:
            path = self.join(name)
            if fs.isdir(path):
                fsys, p = fs.filesystem(path)
                inside = sorted(fs.basename(f) for f in fsys.find(p))
                more = f", {len(inside) - 2} more" if len(inside) > 2 else ""
                shown.append(f"{name}/ ({', '.join(inside[:2])}{more})")
            else:
                shown.append(name)
        rest = len(names) - SHOWN
        return ", ".join(shown) + (f" and {rest} more" if rest > 0 else "")

    # --- the protocol -----------------------------------------------------------------------------------
    def check(self) -> Optional[State]:
        """Refuse this run's output when writing it could destroy or mix results; nothing is changed.

        Returns what the folder holds (None where fsspec cannot read the URL: a warning says so).
        """
        for path in self.inputs:
            if _inside(path, self.path):
                raise ConfigError(f"{self.option} {self.path} contains the input {path}: this run could write "
                                  f"over what it reads; choose an {self.option} folder outside its inputs")
        try:
            fs.filesystem(self.path)
        except ConfigError:
            raise
        except UserError as exc:  # a URL only Beam can write (no fsspec backend here)
            # What is there cannot be told apart, so only an empty output is written: nothing to delete or mix.
            held = self.lister(self.path) if self.lister is not None else []
            if held:
                raise UserError(f"{self.path} is not empty ({held[0]}...) and cannot be checked here for what "
                                f"transferset wrote ({exc}); choose an empty {self.option}, or install that backend")
            LOG.warning("%s: not checked for earlier results or others' files (%s)", self.path, exc)
            self._unchecked = True
            return None
        st = self.state()
        # a link among what the run writes or clears, or its record: refused; one inside another's entry is kept
        refuse_links(self.path, [link for link in links_under(self.path) if self._touches(link.split("/")[0], st)],
                     self.option)
        if st.foreign:
            clash = [n for n in st.foreign if self._writes(n)]
            if clash or not self.overwrite:
                held = f"{self.path} holds {self._shown(st.foreign)}{_looks_like(st.foreign)}, which transferset did not write"
                if clash:
                    names = ", ".join(n + ("/" if fs.isdir(self.join(n)) else "") for n in sorted(clash)[:SHOWN])
                    raise UserError(f"{held}; `transferset {self.command}` writes {names} there, and transferset never "
                                    "deletes files it did not write, even with --overwrite: move them away or choose "
                                    f"another {self.option}")
                raise UserError(f"{held}; choose an empty or new {self.option}, or pass --overwrite to write beside "
                                "them (they are kept)")
        clash = [f for f in st.others if self._writes(f.split("/")[0])
                 and any(fnmatch.fnmatchcase(f, pattern) for pattern in OTHERS_CLASH)]
        if clash:
            raise UserError(f"{self.path} holds {', '.join(clash[:SHOWN])}{' and more' if len(clash) > SHOWN else ''}, "
                            f"which transferset did not write, where `transferset {self.command}` writes its own "
                            "files: it would be read as part of this output or written over, and transferset never "
                            f"deletes files it did not write, even with --overwrite: move it away or choose another "
                            f"{self.option}")
        if st.command is not None:
            other = st.command != self.command
            if st.complete and not self.overwrite and not (self.resume and not other):
                resume = ", --resume to check and complete it" if self.command == "score" and not other else ""
                raise UserError(f"{self.path} already holds a complete run of {st.what()}, "
                                f"{schema.COMPLETE_MARKER} present; pass --overwrite to replace it{resume} or "
                                f"choose another {self.option}")
            if other and not self.overwrite:
                raise UserError(f"{self.path} holds an unfinished run of {st.what()}; pass --overwrite to replace "
                                f"it or choose another {self.option}")
        self._checked = st
        return st

    def prepare(self, keep: Sequence[str] = ()) -> None:
        """Record this run in the manifest, then delete the files earlier transferset runs wrote here (but
        those under the top-level entries `keep`: score --resume keeps its data/) and the folders that
        leaves empty; others' files stay where they are. Call once every check passed."""
        st = self._checked if self._checked is not None else self.check()
        if self._unchecked:
            return
        fs.makedirs(self.path)
        # Written first: a run killed while clearing still leaves a folder recognised as ours.
        fs.write_json(self.join(MANIFEST_FILE), {
            "command": self.command, "kept": sorted(st.foreign), "kept_files": sorted(st.others),
            "library_version": __version__, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
            indent=2, sort_keys=True)
        if st.others:
            LOG.warning("%s: keeping %s%s (transferset did not write them)", self.path, ", ".join(st.others[:SHOWN]),
                        f" and {len(st.others) - SHOWN} more" if len(st.others) > SHOWN else "")
        keep = set(keep)
        _delete_files(self.path, [f for f in st.files if f.split("/")[0] not in keep])
        _remove_empty_folders(self.path, [n for n in st.ours if n not in keep])

    @contextlib.contextmanager
    def local(self) -> Iterator[str]:
        """A local folder for code that writes local files only: OUT itself, or for a URL a staging
        folder uploaded into OUT when the block ends without an error."""
        with remote.local_output(self.path) as work:
            yield work

    @contextlib.contextmanager
    def rejects(self, name: str = REJECTS_FILE) -> Iterator[Callable[[Any], None]]:
        """OUT/rejects/NAME opened for the block: call the yielded function with each reject."""
        fs.makedirs(self.join(schema.REJECTS_DIR))
        with fs.open(self.join(schema.REJECTS_DIR, name), "wb") as fh:
            yield lambda reject: _write_line(fh, reject)

    def write_rejects(self, rejects: Iterable[Any], name: str = REJECTS_FILE) -> str:
        """OUT/rejects/NAME: one JSON line per reject (file, line, raw row, reason); → its path."""
        with self.rejects(name) as write:
            for reject in rejects:
                write(reject)
        return self.join(schema.REJECTS_DIR, name)

    def finish(self, stats: Optional[dict] = None, complete: bool = True) -> None:
        """stats.json (when given), then _COMPLETE (when `complete`), then the record of what was written."""
        write_finish(self.path, stats, complete)
        self.record()

    def record(self) -> None:
        """Add what this run wrote to the manifest: its top-level entries and every file by its path in OUT,
        less the others' files kept (after a Beam pipeline wrote its shards and its own finish)."""
        if self._unchecked:
            return
        manifest = self.manifest() or {"command": self.command, "kept": []}
        kept, kept_files = set(manifest["kept"]), set(manifest.get("kept_files") or [])
        written = sorted(n for n in self._entries() if n not in kept)
        manifest["written"] = written
        manifest["files"] = [f for f in self._files(written) if f not in kept_files]
        fs.write_json(self.join(MANIFEST_FILE), manifest, indent=2, sort_keys=True)

    @property
    def complete(self) -> bool:
        return fs.exists(self.join(schema.COMPLETE_MARKER))


def clear(path: str) -> list[str]:
    """Delete what transferset wrote at `path`, as `prepare` with --overwrite would (the files its record lists,
    then the folders that leaves empty), keeping others' files and the record; → the paths deleted (in OUT).

    For a folder written elsewhere and uploaded into `path` (`transferset run`'s staged stages), where the
    writer's own Output sees the staging folder, not this one."""
    out = Output(path, "clear")
    if not fs.isdir(out.path):
        return []
    st = out.state()
    _delete_files(out.path, st.files)
    _remove_empty_folders(out.path, st.ours)
    return st.files
