"""What the teacher can give the search, and a budget no candidate meets, both known before the first stage:
`transferset run` on a tiny 2-layer BERT teacher and 300 SST-2 rows. Nothing runs: no stage folder, no run folder."""
import re

import pytest
import yaml

from transferset.app.cli import main
from transferset.config.search import DEFAULT_SPACE


def _config(tmp_path, sst2_dir, head_tsv, teacher, **search) -> str:
    data = tmp_path / "data"
    data.mkdir()
    head_tsv(sst2_dir / "train.tsv", data / "train.tsv", 300)
    head_tsv(sst2_dir / "dev.tsv", data / "dev.tsv", 40)
    small = {"student": "bilstm", "epochs": 1, "threads": 1, "report": {"latency_examples": 8},
             "model": {"embed_dim": 8, "hidden": 8}}
    cfg = {"run_dir": str(tmp_path / "run"), "data": str(data), "validation": {"rows": 40, "seed": 0},
           "labeled_limit": 200, "unlabeled_rows": 20, "teacher_path": teacher,
           "augment": {"recipe": "tang", "n_iter": 1, "seed": 0}, "students": {"plain": small},
           "report": {"latency_rows": 8, "latency_rounds": 1},
           "search": {"rungs": [1, 2], "timing_rows": 8, "timing_rounds": 1, "int8": False,
                      "base": {"threads": 1, "report": {"latency_examples": 8}, "losses": {"kd": 1.0}}, **search}}
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


@pytest.mark.integration
def test_candidates_the_teacher_cannot_give_are_dropped_before_the_first_stage_and_the_plan_says_which(
        tmp_path, capsys, sst2_dir, head_tsv, tiny_teacher):
    # the default space (transformer-4 among it) and a 1-layer transformer, whose early exits have no layer to leave at
    space = {**DEFAULT_SPACE, "t1": {"student": "transformer", "model": {"n_layer": 1}}}
    config = _config(tmp_path, sst2_dir, head_tsv, tiny_teacher, space=space)
    rc = main(["run", "--config", config, "--budget-mb", "100", "--plan"])
    err = capsys.readouterr().err
    assert rc == 0, err
    said = [line for line in err.splitlines() if line.startswith("  search: dropped")]
    # in the space's order (the YAML's keys are sorted: t1 before transformer-4)
    assert said == ["  search: dropped before the first stage, the teacher (a 2-layer bert) cannot give them: "
                    "t1+exits@0.5 (no early exits: one encoder layer; an exit below the top needs at least two); "
                    "transformer-4 (a 4-layer student cannot take layers from a 2-layer teacher)"], err
    # timed untrained before the scoring, the dropped ones left out: 6 candidates and transformer-2's early exits
    row = next(line for line in err.splitlines() if line.startswith("  search "))
    assert "7 of 7 variants in budget (timed untrained, on the teacher, before the scoring), 6 candidates" in row, row
    assert "could not be timed" not in err and not (tmp_path / "run").exists()


def test_a_search_the_teacher_can_give_no_candidate_of_is_refused_before_anything_runs(
        tmp_path, capsys, sst2_dir, head_tsv, tiny_teacher):
    space = {"deep": {"student": "transformer", "model": {"n_layer": 3}},
             # pkd reads teacher layers 1 and 2; the scored set holds the last one only (score.layers: [-1])
             "pkd": {"student": "transformer", "model": {"n_layer": 2}, "losses": {"kd": 1.0, "pkd": 1.0}}}
    config = _config(tmp_path, sst2_dir, head_tsv, tiny_teacher, space=space)
    rc = main(["run", "--config", config, "--budget-mb", "100"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err == ("transferset run: error: search: the teacher (a 2-layer bert) can give none of the candidates: "
                   "deep (a 3-layer student cannot take layers from a 2-layer teacher); pkd (pkd reads the teacher's "
                   "hidden states of layers [1, 2], the scored set holds layers [2]: add 1 to score.layers): give "
                   "candidates it can make in search.space\n")
    assert not (tmp_path / "run").exists()


@pytest.mark.integration
@pytest.mark.parametrize("flag, value, figure", [("--budget-mb", "1e-9", r"[0-9.]+ MB > 1e-09 MB"),
                                                 ("--budget-speedup", "1e9",
                                                  r"[0-9.e+-]+x the teacher's speed < 1e\+09x")])
def test_a_budget_no_candidate_meets_is_refused_before_the_first_stage_naming_the_closest(
        tmp_path, capsys, sst2_dir, head_tsv, tiny_teacher, flag, value, figure):
    space = {"small": {"student": "bilstm", "model": {"embed_dim": 8, "hidden": 8}},
             "wide": {"student": "bilstm", "model": {"embed_dim": 8, "hidden": 64}}}
    config = _config(tmp_path, sst2_dir, head_tsv, tiny_teacher, space=space)
    rc = main(["run", "--config", config, flag, value])
    err = capsys.readouterr().err
    assert rc == 2, err
    # the plan is printed, then the refusal: one line naming the closest candidate and its figure
    row = next(line for line in err.splitlines() if line.startswith("  search "))
    assert "none of 2 variants in budget (timed untrained, on the teacher, before the scoring): the search refuses" \
        in row
    error = err.splitlines()[-1]
    assert re.fullmatch(r"transferset run: error: search: no candidate meets the budget \(timed untrained, on the "
                        r"teacher, before the scoring\); the closest is (small|wide) \(" + figure + r"\): raise the "
                        r"budget or add smaller candidates", error), error
    if flag == "--budget-mb":  # the smaller of the two on disk
        assert "the closest is small (" in error
    assert not (tmp_path / "run").exists()
