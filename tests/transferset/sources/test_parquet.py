"""transferset/sources/parquet.py: Parquet rows, strings that are not UTF-8 among them."""
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from source_rows import _read
from transferset.sources import Example, SourceError


def test_parquet_strings_that_are_not_utf8_are_rejects(tmp_path):
    texts = pa.array([b"good one", b"bad \xff byte", b"\xed\xa0\xbd encoded surrogate", b"good two"]).view(pa.string())
    path = tmp_path / "bytes.parquet"
    pq.write_table(pa.table({"sentence": texts, "label": ["0", "1", "0", "1"]}), path)
    recs = _read(path)
    assert [isinstance(r, Example) for r in recs] == [True, False, False, True]
    assert [r.line for r in recs] == [1, 2, 3, 4]
    assert recs[1].reason == recs[2].reason == "bytes that are not valid UTF-8"
    assert "\\xff" in recs[1].raw
    not_parquet = tmp_path / "random.parquet"
    not_parquet.write_bytes(b"PAR1 not really")
    with pytest.raises(SourceError, match="random.parquet: not a readable Parquet file"):
        _read(not_parquet)
