"""An evaluation file as a transfer-set directory, so the teacher scores it once like any set.

Students evaluated on the scored copy report how often they agree with the teacher on held-out
rows (how well they imitate), next to accuracy; agreement on their own training rows only says
how well they fit. Unlike `augment`, nothing is deduplicated or excluded: every accepted line
of the file is one row, so accuracy on the scored copy equals accuracy on the file.
"""
from __future__ import annotations

from typing import Optional, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from transferset import fs, sources
from transferset.augment.seeding import row_id
from transferset.contract import schema
from transferset.fs.output import Output
from transferset.runtime.errors import UserError

# Provenance of an evaluation row: not an augmentation, so not in `ops`; recorded in the metadata.
EVAL_SET_META = {schema.META_AUGMENT_CONFIG: {"evaluation_set": True}}


def write_eval_set(path: str, out_dir: str, label_names: Sequence[str], *, text_column: Optional[str] = None,
                   label_column: str = sources.DEFAULT_LABEL_COLUMN, text_b_column: Optional[str] = None,
                   overwrite: bool = False) -> dict:
    """Write `path`'s labeled rows under out_dir/data/, its rejects, stats.json and _COMPLETE.

    `path` and `out_dir` may be local or URLs (transferset.fs); out_dir follows transferset.fs.output
    (owned while written, nothing of another's deleted, a complete one kept: `run` rewrites it only after
    emptying its stage folder).
    """
    out = Output(out_dir, "eval-set", inputs=[path], overwrite=overwrite)
    with out.open():
        out.check()
        spec = sources.SourceSpec(path=path, text_column=text_column, label_column=label_column,
                                  text_b_column=text_b_column, label_names=tuple(label_names))
        rows, rejects = [], []
        for rec in sources.read_source(spec, opener=fs.open):
            if isinstance(rec, sources.Reject):
                rejects.append(rec)
                continue
            # The line number keeps ids unique when a sentence repeats in the file.
            rows.append({schema.ID: row_id(rec.source_id, ("eval",), rec.line, rec.text, rec.text_b),
                         schema.SOURCE_ID: rec.source_id, schema.TEXT: rec.text, schema.TEXT_B: rec.text_b,
                         schema.OPS: [], schema.LABEL: rec.label})
        if not rows:
            raise UserError(sources.summarize_rejects(path, rejects))
        out.prepare()
        fs.makedirs(out.join(schema.DATA_DIR))
        table = pa.Table.from_pylist(rows, schema=schema.transfer_schema(schema.base_metadata(label_names,
                                                                                              **EVAL_SET_META)))
        with fs.open(out.join(schema.DATA_DIR, "part-00000.parquet"), "wb") as fh:
            pq.write_table(table, fh, compression="zstd")
        out.write_rejects(rejects)
        stats = {"input": path, "input_rows": len(rows) + len(rejects), "accepted_rows": len(rows),
                 "rejected_rows": len(rejects), "output_rows": len(rows), "label_names": list(label_names)}
        out.finish(stats)
    return stats
