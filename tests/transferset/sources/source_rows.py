"""Reading a test's file into a list of records (Example or Reject), the label set (0, 1) unless given; shared by
the tests of transferset/sources/."""
import json

from transferset.sources import SourceSpec, read_source

LABELS = ("0", "1")


def _read(path, **kw):
    kw.setdefault("label_names", LABELS)
    return list(read_source(SourceSpec(path=str(path), **kw)))


def _data_lines(path) -> int:
    """What `wc -l` says minus the header: every physical data line must become one record."""
    return path.read_bytes().count(b"\n") - 1


def _jsonl(path, objs):
    path.write_text("".join(json.dumps(o) + "\n" for o in objs))
    return path
