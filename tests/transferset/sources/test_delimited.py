"""transferset/sources/delimited.py: TSV and CSV lines, each physical line one record, however malformed.
Blank lines and a byte order mark, in every line-based format, are in test_sources.py."""
from source_rows import _data_lines, _read
from transferset.sources import Example, Reject


def _sst2_csv(sst2_dir, dst, n):
    """The header and first n rows of the real SST-2 dev set, written as CSV (test-local copy)."""
    import csv

    with open(sst2_dir / "dev.tsv", encoding="utf-8") as fh:
        rows = [line.rstrip("\n").split("\t") for line in fh][: n + 1]
    with open(dst, "w", encoding="utf-8", newline="") as out:
        csv.writer(out, lineterminator="\n").writerows(rows)
    return rows


def test_unbalanced_quote_rejects_its_line_and_reading_resumes(tmp_path, sst2_dir):
    path = tmp_path / "quote.csv"
    rows = _sst2_csv(sst2_dir, path, 51)
    lines = path.read_text(encoding="utf-8").split("\n")
    # Line 22 opens a quote that never closes; later lines quote their commas, as csv.writer does.
    lines[21] = '"an unclosed quote,1'
    assert sum('"' in line for line in lines[22:]) >= 2
    path.write_text("\n".join(lines), encoding="utf-8")
    recs = _read(path)
    assert len(recs) == _data_lines(path) == 51
    rejects = [r for r in recs if isinstance(r, Reject)]
    assert [r.line for r in rejects] == [22]
    assert rejects[0].reason.startswith("unbalanced quote or embedded newline spanning lines 22-")
    assert "line 22" in rejects[0].reason and "resumes at line 23" in rejects[0].reason
    kept = [r for r in recs if isinstance(r, Example)]
    assert len(kept) == 50 and kept[-1].line == 52 and kept[-1].text == rows[51][0]


def test_multi_line_record_is_one_reject_per_physical_line(tmp_path):
    path = tmp_path / "embedded.csv"
    path.write_text('text,label\ngood,1\n"two\nlines",0\nafter,1\n')
    recs = _read(path)
    assert len(recs) == _data_lines(path) == 4
    assert [(type(r).__name__, r.line) for r in recs] == [("Example", 2), ("Reject", 3), ("Reject", 4),
                                                          ("Example", 5)]
    assert all(r.reason.startswith("unbalanced quote or embedded newline spanning lines 3-4")
               for r in recs[1:3])
    assert [r.text for r in recs if isinstance(r, Example)] == ["good", "after"]


def test_a_carriage_return_inside_a_line_does_not_split_it(tmp_path):
    """Lines end at \\n, as `wc -l` counts them: one stray \\r is one reject, not two rows."""
    path = tmp_path / "cr.tsv"
    path.write_bytes(b"sentence\tlabel\r\nfine\t1\r\nbroken \r line\t0\nlast\t0")
    recs = _read(path)
    assert [r.line for r in recs] == [2, 3, 4]
    assert [isinstance(r, Example) for r in recs] == [True, False, True]
    assert recs[1].reason == "a carriage return (\\r) inside the line: not a TSV row"
