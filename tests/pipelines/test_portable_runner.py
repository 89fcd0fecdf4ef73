"""Both pipelines on Beam's portable graph: PortableRunner with the embedded job service.

The Runner API graph the embedded job service executes is the one Dataflow Runner v2, Flink and
Spark execute; it is the nearest we can come to them offline. The rows must be exactly those of
FnApiRunner, the local runner every other test uses.
"""
import numpy as np
import pytest

import builders as testing
from transferset.app.cli import main
from transferset.contract import schema
from transferset.data import transfer
from tolerances import tiny_bert

PORTABLE = ["--runner", "PortableRunner", "--job_endpoint", "embed", "--environment_type", "LOOPBACK"]
LOCAL = ["--runner", "FnApiRunner"]


def _rows(directory) -> dict[str, dict]:
    return {r[schema.ID]: r for r in transfer.read_table(str(directory)).to_pylist()}


@pytest.fixture(scope="module")
def small_train(sst2_dir, tmp_path_factory, head_tsv):
    return head_tsv(sst2_dir / "train.tsv", tmp_path_factory.mktemp("portable") / "train.tsv", 120)


@pytest.mark.integration
def test_augment_gives_the_same_rows_on_the_portable_runner(small_train, sst2_dir, tmp_path):
    outs = {}
    for name, runner in (("local", LOCAL), ("portable", PORTABLE)):
        outs[name] = tmp_path / name
        assert main(["augment", "--input", str(small_train), "--exclude", str(sst2_dir / "dev.tsv"),
                     "--output", str(outs[name]), "--n-iter", "3", "--seed", "5", *runner]) == 0
    local, portable = _rows(outs["local"]), _rows(outs["portable"])
    assert len(local) > 120 and local == portable


@pytest.mark.integration
def test_score_gives_the_same_rows_on_the_portable_runner(tiny_teacher, tmp_path):
    texts = ["the movie was great", "bad", "i love it !", "not good , not bad , just fine", "one",
             "awful", "funny and charming", "so so", "what a story", "never again"]
    src = str(tmp_path / "transfer")
    testing.write_transfer_set(src, [testing.transfer_rows(texts)], ("0", "1"))
    outs = {}
    for name, runner in (("local", LOCAL), ("portable", PORTABLE)):
        outs[name] = tmp_path / name
        assert main(["score", "--input", src, "--teacher", tiny_teacher, "--output", str(outs[name]),
                     "--batch-size", "4", "--min-batch-size", "4", *runner]) == 0
    local, portable = _rows(outs["local"]), _rows(outs["portable"])
    assert set(local) == set(portable) and len(local) == len(texts)
    for key, row in local.items():
        other = portable[key]
        assert (row[schema.TEXT], row[schema.TEACHER_LABEL]) == (other[schema.TEXT], other[schema.TEACHER_LABEL])
        # each runner cuts its own batches: reordered sums (tests/tolerances.py); a float16 hidden value near a
        # rounding boundary may then round to the neighbouring float16, one step of 2**-10 relative
        np.testing.assert_allclose(row[schema.TEACHER_LOGITS], other[schema.TEACHER_LOGITS],
                                   atol=tiny_bert(other[schema.TEACHER_LOGITS]), rtol=0)
        hidden = np.asarray(other[schema.TEACHER_HIDDEN], dtype=np.float32)
        np.testing.assert_allclose(np.asarray(row[schema.TEACHER_HIDDEN], dtype=np.float32), hidden,
                                   rtol=2.0 ** -10, atol=tiny_bert(hidden))
