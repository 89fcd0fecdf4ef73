"""The search's untrained timing as the plan takes it: on the search's inputs (tests/transferset/app/stages/
test_search_stage.py, the second budget of the tiny search) and, here, before them: a fresh run's plan."""
import pytest

from transferset.app.planning.calibrate import measure_rates
from transferset.app.run.runner import run_pipeline
from transferset.runtime.errors import ConfigError
from stage_plans import search_config, search_data


@pytest.mark.integration
def test_a_fresh_runs_plan_times_the_candidates_on_the_teacher_before_the_scoring_and_counts_those_in_budget(
        tmp_path, sst2_dir, head_tsv, tiny_teacher):
    data = search_data(tmp_path, sst2_dir, head_tsv)
    log = []
    assert run_pipeline(search_config(tmp_path, data, tiny_teacher, 2.0), log=log.append, measure=measure_rates,
                        plan_only=True) is None
    assert not (tmp_path / "run" / "search").exists()
    # built on the given teacher with the scored set's record standing in for the set, timed on the plan's first
    # train rows: huge (a 512-unit BiLSTM, over 2 MB) is left out, as the search itself leaves it out
    assert [m for m in log if m.startswith("[search] timing ")] == [
        "[search] timing 4 untrained variants of 4 candidates (onnx) on 8 rows"]
    row = next(m for m in log if m.startswith("  search "))
    assert ("3 of 4 variants in budget (timed untrained, on the teacher, before the scoring), 3 candidates; "
            "3 × 1 epochs, 2 × 2 epochs") in row
    # a budget none meets: the plan says the search will refuse, counts nothing for it, and the run is refused
    log.clear()
    with pytest.raises(ConfigError, match=r"^search: no candidate meets the budget \(timed untrained, on the teacher, "
                                          r"before the scoring\); the closest is (small|static) \("):
        run_pipeline(search_config(tmp_path, data, tiny_teacher, 1e-4), log=log.append, measure=measure_rates,
                     plan_only=True)
    row = next(m for m in log if m.startswith("  search "))
    assert "none of 4 variants in budget (timed untrained, on the teacher, before the scoring): the search refuses" \
        in row


@pytest.mark.integration
def test_a_candidate_that_cannot_be_built_before_the_scoring_leaves_the_plan_counting_every_candidate(
        tmp_path, sst2_dir, head_tsv, tiny_teacher):
    data = search_data(tmp_path, sst2_dir, head_tsv)
    # its vocabulary is the transfer set's (trim_vocab): there is no set to read before the scoring
    space = {"small": {"student": "bilstm", "model": {"embed_dim": 8, "hidden": 8}},
             "trimmed": {"student": "bilstm", "vocab": {"trim_vocab": True}, "model": {"embed_dim": 8, "hidden": 8}}}
    log = []
    run_pipeline(search_config(tmp_path, data, tiny_teacher, 2.0, space=space), log=log.append,
                 measure=measure_rates, plan_only=True)
    said = [m for m in log if m.startswith("[plan] the search's candidates could not be timed")]
    assert len(said) == 1 and said[0].endswith("the plan counts every candidate")
    assert "on the teacher, before the scoring" in said[0]
    row = next(m for m in log if m.startswith("  search "))
    assert "2 candidates, before the budget's timing drops any; 2 × 1 epochs, 1 × 2 epochs" in row
