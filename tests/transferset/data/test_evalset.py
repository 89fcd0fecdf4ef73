import json

from transferset.contract import schema
from transferset.data import transfer
from transferset.data.evalset import write_eval_set


def test_every_accepted_line_is_one_row_duplicates_included(tmp_path):
    src = tmp_path / "dev.tsv"
    src.write_text("sentence\tlabel\na fine film\t1\nawful\t0\na fine film\t1\n\t1\ngood\t7\n")
    stats = write_eval_set(str(src), str(tmp_path / "out"), ["0", "1"])
    assert (stats["input_rows"], stats["accepted_rows"], stats["rejected_rows"]) == (5, 3, 2)
    table = transfer.read_table(str(tmp_path / "out"))
    assert table.column(schema.TEXT).to_pylist() == ["a fine film", "awful", "a fine film"]
    assert table.column(schema.LABEL).to_pylist() == [1, 0, 1]
    ids = table.column(schema.ID).to_pylist()
    assert len(set(ids)) == 3  # a repeated sentence keeps its own row and id
    assert transfer.label_names(str(tmp_path / "out")) == ["0", "1"]
    assert (tmp_path / "out" / schema.COMPLETE_MARKER).exists()
    rejects = [json.loads(line) for line in (tmp_path / "out" / schema.REJECTS_DIR / "rejects.jsonl").open()]
    assert [r[schema.REJECT_LINE] for r in rejects] == [5, 6]
