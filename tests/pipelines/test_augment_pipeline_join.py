"""The join op in the augment pipeline (pipelines/augment.py `_joined`): on real SST-2 rows and a real Beam runner,
its rows are exactly those transferset/augment/join.py makes of the guarded originals, and every row is counted."""
import json
from collections import defaultdict
from pathlib import Path

from transferset.app.cli import main
from transferset.augment import join
from transferset.contract import schema
from transferset.data import transfer


def test_joined_rows_are_the_librarys_of_the_guarded_originals_and_the_counts_add_up(sst2_dir, tmp_path, head_tsv):
    path = head_tsv(sst2_dir / "train.tsv", tmp_path / "train.tsv", 300)
    dev = (sst2_dir / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:11]
    with open(path, "a", encoding="utf-8") as fh:
        fh.write("\n".join(dev) + "\n")  # 10 evaluation sentences: the guard drops them before any join
    out = tmp_path / "out"
    rc = main(["augment", "--input", str(path), "--exclude", str(sst2_dir / "dev.tsv"), "--output", str(out),
               "--ops", "mask,ngram,join", "--n-iter", "1", "--joins", "0.5", "--join-max", "3", "--seed", "5"])
    assert rc == 0
    rows = transfer.read_table(str(out)).to_pylist()
    stats = json.loads((Path(out) / schema.STATS_FILE).read_text())
    assert stats["problems"] == [] and (stats["joins"], stats["join_max"]) == (0.5, 3)
    assert len(rows) == stats["originals"] + stats["variants_generated"] - stats["duplicates_dropped"] - \
        stats["excluded_dropped"] == stats["output_rows"]

    originals = {r[schema.SOURCE_ID]: r[schema.TEXT] for r in rows if not r[schema.OPS]}
    dev_texts = {line.split("\t")[0] for line in dev}
    assert len(originals) == 300 and not dev_texts & set(originals.values())
    # the same joins computed in process from the originals the guard kept
    entries = [e for sid, text in originals.items() for e in join.entries(sid, text, None, seed=5, joins=0.5,
                                                                            join_max=3)]
    buckets = defaultdict(list)
    for key, member in entries:
        buckets[join.bucket_of(key, len(entries))].append(member)
    expected = {r.id: r for b, members in buckets.items() for r in join.joined_rows(b, members, seed=5, join_max=3)}
    joined = {r[schema.ID]: r for r in rows if r[schema.OPS] == ["join"]}
    assert set(joined) == set(expected) and 130 <= len(joined) <= 170  # 0.5 per original, as drawn
    for rid, row in joined.items():
        parts = row[schema.SOURCE_ID].split(join.SEPARATOR)
        assert row[schema.TEXT] == expected[rid].text == " ".join(originals[p] for p in parts)
        assert len(set(parts)) == len(parts)  # an original with two entries in one bucket is not joined to itself
        assert row[schema.LABEL] is None
