"""Every third-party module the package imports (transferset/, students/, pipelines/) comes from a distribution
pyproject.toml declares, in `dependencies` or an extra: an import that works only because another
dependency happens to pull its library in (fsspec came with datasets) breaks when that one stops doing so."""
import ast
import importlib.metadata
import re
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11's tomllib")

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("transferset", "students", "pipelines")


def _imported_top_levels() -> dict[str, str]:
    """Top-level module → one file importing it (every import, function-level ones included)."""
    found: dict[str, str] = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    found.setdefault(name.split(".")[0], str(path.relative_to(REPO)))
    return found


def _declared() -> set[str]:
    project = _project()
    specs = list(project["dependencies"]) + [s for extra in project["optional-dependencies"].values() for s in extra]
    return {_canonical(re.match(r"[A-Za-z0-9_.\-]+", spec).group(0)) for spec in specs}


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def test_every_third_party_import_is_declared():
    distributions = importlib.metadata.packages_distributions()
    declared = _declared()
    missing = {}
    for module, where in _imported_top_levels().items():
        if module in PACKAGES or module in sys.stdlib_module_names or module == "__future__":
            continue
        owners = {_canonical(d) for d in distributions.get(module, [])}
        if not owners:  # not installed here: an extra's module this environment lacks, named by its own name
            owners = {_canonical(module)}
        if not owners & declared:
            missing[module] = (sorted(owners), where)
    assert missing == {}, f"imported, but no pyproject.toml entry declares its distribution: {missing}"


def test_fsspec_is_declared_with_the_installed_major_as_lower_bound():
    specs = [s for s in _project()["dependencies"] if _canonical(re.match(r"[A-Za-z0-9_.\-]+", s).group(0)) == "fsspec"]
    major = importlib.metadata.version("fsspec").split(".")[0]
    assert specs == [f"fsspec>={major}"]  # CalVer: the year
