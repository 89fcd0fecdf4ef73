"""The teacher ensemble's library part (transferset.teacher.ensemble): combining, refusing, reading back."""
import numpy as np
import pytest

import builders as testing
from transferset.config import ScoreConfig
from transferset.contract import schema
from transferset.data import transfer
from transferset.runtime import typed
from transferset.runtime.errors import ConfigError, UserError
from transferset.teacher import ensemble

MEMBERS = [np.array([[2.0, -1.0], [0.5, 0.0]], np.float32),
           np.array([[1.0, 1.0], [-3.0, 2.0]], np.float32),
           np.array([[0.0, 3.0], [1.5, -2.0]], np.float32)]


def test_mean_of_logits():
    np.testing.assert_allclose(ensemble.combine_logits(MEMBERS, "mean"), [[1.0, 1.0], [-1 / 3, 0.0]], rtol=1e-6)


def test_mean_of_probabilities_as_log_probs():
    got = ensemble.combine_logits(MEMBERS, "probs")
    probs = [np.exp(m) / np.exp(m).sum(axis=1, keepdims=True) for m in MEMBERS]
    np.testing.assert_allclose(np.exp(got), np.mean(probs, axis=0), rtol=1e-6)
    np.testing.assert_allclose(np.exp(got).sum(axis=1), 1.0, rtol=1e-6)  # log-probabilities: softmax is identity
    assert got.dtype == np.float32
    # confident members far apart: no underflow to -inf
    assert np.isfinite(ensemble.combine_logits([np.array([[800.0, 0.0]]), np.array([[0.0, 800.0]])], "probs")).all()


def test_one_member_chosen():
    assert ensemble.parse_combine("1", 3) == 1 and ensemble.parse_combine(2, 3) == 2
    np.testing.assert_array_equal(ensemble.combine_logits(MEMBERS, 1), MEMBERS[1])
    assert ensemble.primary(1) == 1 and ensemble.primary("mean") == 0


@pytest.mark.parametrize("value, members, message", [
    ("mean", 0, "no teacher: give at least one --teacher"),
    ("3", 3, r"--combine 3: there are 3 teacher\(s\), so a member index is 0..2"),
    ("median", 2, r"--combine 'median': choose one of \['mean', 'probs'\]"),
    ("-1", 2, r"--combine '-1': choose one of"),
])
def test_combine_refusals(value, members, message):
    with pytest.raises(ConfigError, match=message):
        ensemble.parse_combine(value, members)


def test_combine_setting_checked_when_the_config_is_built():
    assert typed.load(ScoreConfig, {"combine": 1}, where="run.yaml: score").combine == "1"  # YAML `combine: 1`
    with pytest.raises(ConfigError, match="--combine 'max'"):
        typed.load(ScoreConfig, {"combine": "max"}, where="run.yaml: score")


def test_members_must_share_their_classes():
    assert ensemble.check_members(["a", "b"], [["neg", "pos"], ["neg", "pos"]]) == ["neg", "pos"]
    with pytest.raises(UserError, match=r"b predicts \['pos', 'neg'\].*a predicts \['neg', 'pos'\]"):
        ensemble.check_members(["a", "b"], [["neg", "pos"], ["pos", "neg"]])
    with pytest.raises(UserError, match="b predicts 3 classes"):
        ensemble.check_members(["a", "b"], [["neg", "pos"], ["neg", "pos", "mixed"]])
    with pytest.raises(UserError, match="no teacher"):
        ensemble.check_members([], [])


def _set(tmp_path, members, labels, logits=None):
    logits = ensemble.combine_logits(members, "mean") if logits is None else logits
    meta = {schema.META_ENSEMBLE: ensemble.ensemble_metadata("mean", [
        {schema.MEMBER_ID: f"/t{k}", schema.MEMBER_SHA256: "0" * 64, schema.MEMBER_DEV_ACCURACY: None}
        for k in range(len(members))])}
    return testing.write_scored_set(str(tmp_path / "s"), ["a", "b"], logits, np.zeros((2, 4)), labels=labels,
                                    members=members, extra_metadata=meta)


def test_accuracies_of_the_ensemble_and_its_members(tmp_path):
    d = _set(tmp_path, MEMBERS, labels=[1, 0])
    # mean: row 0 ties (1.0, 1.0) -> argmax 0 (wrong), row 1 -> 1 (wrong); members: [0, 0], [0, 1], [1, 0]
    assert ensemble.accuracies(d) == {"rows": 2, "teacher": 0.0, "members": [0.5, 0.0, 1.0]}
    assert transfer.read_metadata(d, scored=True)[schema.META_ENSEMBLE]["teachers"][2][schema.MEMBER_ID] == "/t2"


def test_a_non_finite_member_logit_is_refused_on_read(tmp_path):
    bad = [MEMBERS[0], MEMBERS[1].copy()]
    bad[1][1, 0] = np.nan
    d = _set(tmp_path, bad, labels=[1, None], logits=MEMBERS[0])  # the target finite: the member is checked
    with pytest.raises(UserError, match=r"part-00001.parquet, row 1 .*teacher_logits_1 holds nan \(position 0\)"):
        list(transfer.iter_batches(d, num_classes=2))


def test_ensemble_metadata_checked_on_read():
    members = [{schema.MEMBER_ID: "/t", schema.MEMBER_SHA256: "0", schema.MEMBER_DEV_ACCURACY: 0.9}]
    good = ensemble.ensemble_metadata("mean", members * 2)
    assert schema.check_metadata_value(schema.META_ENSEMBLE, good, where="f") == good
    with pytest.raises(schema.SchemaError, match="transferset.ensemble"):
        schema.check_metadata_value(schema.META_ENSEMBLE, ensemble.ensemble_metadata("mean", members), where="f")
    with pytest.raises(schema.SchemaError, match="dev_accuracy"):
        schema.check_metadata_value(schema.META_ENSEMBLE, ensemble.ensemble_metadata(
            "mean", [dict(members[0], dev_accuracy=7.0)] * 2), where="f")
