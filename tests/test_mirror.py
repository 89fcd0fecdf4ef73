"""tests/ mirrors the packages: the tests of PKG/MODULE.py are in tests/PKG/test_MODULE.py, in several files
tests/PKG/test_MODULE_*.py, or in a folder tests/PKG/MODULE/ (docs/architecture.md, "Tests"), so a maintainer
changing a module finds its tests without a search. A package's own __init__.py is not counted: its tests are
tests/PKG/test_PKG.py where it has them (tests/transferset/fs/test_fs.py).

A module without a test at its path fails here. Put its tests there; where they can only be another module's
(a command's thin wrapper, a part reached only through the whole), add it to UNMIRRORED with the reason."""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("transferset", "pipelines", "students")

# Modules whose tests are, by nature, at another module's path. Keep it short: a module that can be tested
# on its own is tested at its path.
_COMMAND = "a command's flags and its call into the library; run by transferset.app.cli.main in "
UNMIRRORED = {
    # the commands of transferset.app.cli: each parses its flags and calls one library function, whose own
    # tests are at its path; the commands themselves run in tests/transferset/app/cli/test_cli.py and in:
    "transferset/app/cli/augment.py": _COMMAND + "tests/pipelines/test_augment_pipeline.py",
    "transferset/app/cli/evaluate.py": _COMMAND + "tests/students/test_student.py and compress/test_export.py",
    "transferset/app/cli/exits.py": _COMMAND + "tests/students/families/test_exits.py",
    "transferset/app/cli/export.py": _COMMAND + "tests/students/compress/test_export.py and test_export_int8.py",
    "transferset/app/cli/inspect.py": _COMMAND + "tests/transferset/contract/test_schema.py and tests/test_remote_chain.py",
    "transferset/app/cli/predict.py": _COMMAND + "tests/students/test_predict_files.py",
    "transferset/app/cli/prune.py": _COMMAND + "tests/students/compress/test_prune.py",
    "transferset/app/cli/score.py": _COMMAND + "tests/pipelines/test_score.py and test_score_ensemble.py",
    "transferset/app/cli/teacher.py": _COMMAND + "tests/transferset/teacher/test_train.py",
    "transferset/app/cli/train.py": _COMMAND + "tests/students/test_trainer.py and test_user_errors.py",
    "transferset/app/cli/__main__.py": "`python -m transferset.app.cli` (what torchrun launches): run in "
                                       "tests/students/compress/test_export_int8.py and tests/students/test_distributed.py",
    # `transferset run`'s declarations: a plan and its stage keys mean something only as a run of them
    "transferset/app/stages/plan.py": "the stages of a run: planned and run in tests/transferset/app/run/test_runner.py",
    "transferset/app/report/outputs.py": "what the stage kinds make: tests/transferset/app/stages/ (each kind's part)",
    # parts reached only through a whole that is tested at its path
    "transferset/augment/context.py": "the contexts an op declares: tests/transferset/augment/test_registry.py",
    "transferset/config/common.py": "value checks of several sections: tests/transferset/config/test_config.py",
    "transferset/config/compress.py": "the compress sections' settings: tests/transferset/config/test_config.py "
                                      "and tests/transferset/app/stages/test_keys.py",
    "transferset/config/engine.py": "the engine section: tests/transferset/training/test_engine.py and "
                                    "tests/transferset/app/stages/test_keys.py (its flat form in the keys)",
    "transferset/data/card.py": "a model card describes a trained model: tests/students/test_cards.py (train, export) "
                           "and tests/transferset/app/run/test_init.py (a run's cards)",
    "transferset/runtime/errors.py": "the exception classes only; every test that expects an error raises one",
    "transferset/fs/written.py": "the output protocol's writes and deletes: tests/transferset/fs/test_output.py",
    "transferset/packed/biases.py": "the packed forward's parts, checked against each family's Hugging Face forward "
                                    "in tests/transferset/packed/test_families.py",
    "transferset/packed/encoder.py": "as packed/biases.py: tests/transferset/packed/test_families.py",
    "transferset/packed/heads.py": "as packed/biases.py: tests/transferset/packed/test_families.py, "
                                   "tests/transferset/teacher/test_scoring.py, tests/transferset/models/test_pruning.py",
    "transferset/sources/jsonl.py": "one line of json.loads a row: with the other readers in "
                                    "tests/transferset/sources/test_sources.py and test_records.py",
    # students: the lead's packages (tests/students mirrors them); these are tested through their callers
    "students/compress/exits_train.py": "tests/students/families/test_exits.py (the exits and their training)",
    "students/evaluate.py": "tests/students/test_student.py, tests/students/compress/test_export.py",
    "students/families/bilstm_onnx.py": "the BiLSTM's ONNX graph: tests/students/compress/test_export.py",
    "students/families/transformer_layers.py": "tests/students/families/test_transformer.py and "
                                               "tests/students/losses/test_layerwise.py",
    "students/losses/online.py": "the online teacher: tests/students/losses/test_layerwise.py",
}


def library_modules(root: Path = ROOT) -> list[str]:
    return sorted(str(p.relative_to(root)) for package in PACKAGES for p in (root / package).rglob("*.py")
                  if p.name != "__init__.py")


def mirrored_tests(module: str, root: Path = ROOT) -> list[Path]:
    """The test files at `module`'s mirrored path (empty when it has none)."""
    path = Path(module)
    folder = root / "tests" / path.parent
    found = [folder / f"test_{path.stem}.py", *sorted(folder.glob(f"test_{path.stem}_*.py"))]
    found = [p for p in found if p.is_file()]
    return found + sorted((folder / path.stem).rglob("test_*.py"))


def test_every_library_module_has_its_tests_at_the_mirrored_path():
    missing = [m for m in library_modules() if m not in UNMIRRORED and not mirrored_tests(m)]
    assert not missing, ("no tests at the mirrored path of: " + ", ".join(missing) + ". Put the tests of PKG/MODULE.py"
                         " in tests/PKG/test_MODULE.py (or test_MODULE_*.py), or, where they can only be another "
                         "module's, add the module to UNMIRRORED in tests/test_mirror.py with the reason")


def test_the_allow_list_names_only_modules_that_exist_and_have_no_mirrored_test():
    modules = set(library_modules())
    gone = sorted(set(UNMIRRORED) - modules)
    assert not gone, f"UNMIRRORED names modules that are not there (moved or removed): {gone}; update it"
    mirrored = sorted(m for m in UNMIRRORED if mirrored_tests(m))
    assert not mirrored, f"these modules have tests at their mirrored path now: {mirrored}; drop them from UNMIRRORED"


def test_the_rule_finds_each_form_and_misses_a_module_without_one(tmp_path):
    for module in ("transferset/fs/a.py", "transferset/fs/b.py", "pipelines/c.py", "students/d.py"):
        (tmp_path / module).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / module).write_text("")
    for test in ("tests/transferset/fs/test_a.py", "tests/transferset/fs/test_b_urls.py",
                 "tests/pipelines/c/test_x.py",
                 "tests/students/test_dd.py", "tests/test_d.py"):  # not d's tests: another name, another place
        (tmp_path / test).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / test).write_text("")
    modules = library_modules(tmp_path)
    assert modules == ["pipelines/c.py", "students/d.py", "transferset/fs/a.py", "transferset/fs/b.py"]
    assert {m: [str(p.relative_to(tmp_path)) for p in mirrored_tests(m, tmp_path)] for m in modules} == {
        "pipelines/c.py": ["tests/pipelines/c/test_x.py"], "students/d.py": [],
        "transferset/fs/a.py": ["tests/transferset/fs/test_a.py"],
        "transferset/fs/b.py": ["tests/transferset/fs/test_b_urls.py"]}


def test_module_names_under_tests_are_unique():
    # pytest imports test files in its `prepend` mode (no __init__.py under tests/): each file's folder goes on
    # sys.path and the file is imported by its bare name, so two test_x.py (or two helpers imported by name, such as
    # builders.py) in different folders collide; conftest.py files are pytest's own, and only two may exist (below).
    names: dict[str, list[str]] = {}
    for path in sorted((ROOT / "tests").rglob("*.py")):
        if path.name != "conftest.py":
            names.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    twice = {name: paths for name, paths in names.items() if len(paths) > 1}
    assert not twice, f"module names under tests/ must be unique (pytest's prepend import mode): {twice}; rename one"


def test_the_only_conftest_modules_are_the_two_the_tests_import_from():
    """Tests `from conftest import write_scored`: without __init__.py files every conftest.py is the module
    `conftest`, and the name resolves to whichever was imported last. A third conftest.py (a fixture moved into
    tests/transferset/training/) made 50 tests of a full `make test` fail with `cannot import name 'MAX_LENGTH'
    from 'conftest'`: shared fixtures go in a helper module the tests import (linear_task.py, sst2_words.py)."""
    found = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").rglob("conftest.py"))
    assert found == ["tests/conftest.py", "tests/students/conftest.py"]
