"""The layers of docs/architecture.md hold: the import contract (.importlinter) is kept, and it breaks
when someone adds an upward import or a cycle, even one hidden inside a function."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("transferset", "students", "pipelines")


def lint(root: Path) -> subprocess.CompletedProcess:
    """lint-imports over the packages found under `root` (first on the path), with root's contract."""
    code = ("import sys; from importlinter.cli import lint_imports_command; "
            "sys.argv = ['lint-imports', '--no-cache']; lint_imports_command()")
    return subprocess.run([sys.executable, "-c", code], cwd=root, env={"PYTHONPATH": str(root), "PATH": ""},
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def copy(tmp_path_factory) -> Path:
    """The packages and the contract, copied: each test plants one violation in its own copy."""
    def make(name: str) -> Path:
        root = tmp_path_factory.mktemp(name)
        for package in PACKAGES:
            shutil.copytree(ROOT / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy(ROOT / ".importlinter", root / ".importlinter")
        return root
    return make


def test_the_contract_is_kept():
    result = lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 5 kept, 0 broken." in result.stdout


@pytest.mark.parametrize("module, planted, contract", [
    # the library reaching the app layer, inside a function, as the old runner dodges did
    ("transferset/contract/schema.py", "def _f():\n    from transferset.app import cli\n",
     "Nothing in the library imports the app layer"),
    # the report (the app's lowest folder) reading a stage kind, or the plan's arithmetic the runner
    ("transferset/app/report/chosen.py", "def _f():\n    from transferset.app.stages import keys\n",
     "The app's folders by job"),
    ("transferset/app/planning/estimate.py", "def _f():\n    from transferset.app.run import runner\n",
     "The app's folders by job"),
    # a reader reaching for Beam's file systems (sources is a package: plant it in one of its modules)
    ("transferset/sources/delimited.py", "def _f():\n    import apache_beam\n",
     "The library never imports students, pipelines or Apache Beam"),
    ("transferset/data/transfer.py", "def _f():\n    from students import losses\n",
     "The library never imports students, pipelines or Apache Beam"),
    ("students/losses/layers.py", "def _f():\n    from pipelines import runtime\n",
     "students and pipelines are independent of each other"),
    # a cycle between two library packages: config is composed of the augment ops' settings, so an op
    # (or anything it reaches) reading config closes one
    ("transferset/augment/compose.py", "def _f():\n    from transferset import config\n",
     "No import cycles between sibling modules or packages"),
])
def test_an_upward_import_or_a_cycle_breaks_it(copy, module, planted, contract):
    root = copy(Path(module).stem)
    # Appending to a file that is not there would plant the violation in a stray new module, which
    # the contract may or may not see: a renamed or split module must fail here, not pass by chance.
    assert (root / module).is_file(), f"{module} is not a module any more: plant the violation in one that is"
    with open(root / module, "a", encoding="utf-8") as fh:
        fh.write("\n\n" + planted)
    result = lint(root)
    assert result.returncode == 1, result.stdout + result.stderr
    broken = result.stdout.split("Broken contracts", 1)[1]
    assert contract in broken
    if "cycles" in contract:  # a cycle is reported between the packages it joins, not by module
        assert f"No cycles are allowed in {module.split('/')[0]}." in broken, broken
    else:  # and it is the planted import that broke it
        assert Path(module).with_suffix("").as_posix().replace("/", ".") in broken, broken


def test_a_new_library_module_must_be_placed_in_a_layer(copy):
    root = copy("unlisted")
    (root / "transferset" / "newthing.py").write_text("X = 1\n")
    result = lint(root)
    assert result.returncode != 0 and "newthing" in result.stdout + result.stderr
