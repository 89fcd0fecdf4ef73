"""The layering of DESIGN.md, checked on the source: a violation fails here, not in review.

- transferset/ (the library) never imports apache_beam; only its app layer (cli.py, runner.py)
  reaches pipelines/, and only lazily, inside functions.
- students/ never imports pipelines/ or apache_beam: it trains from the Parquet cache alone.
"""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
APP_LAYER = {"transferset/cli.py", "transferset/runner.py"}


def imports(path: Path) -> list[tuple[str, bool]]:
    """(module, at module level) for every import in a file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top = set(map(id, tree.body))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, id(node) in top) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.append((node.module, id(node) in top))
    return out


def files(package: str) -> list[Path]:
    found = sorted((ROOT / package).rglob("*.py"))
    assert found, f"no Python files under {package}/"
    return found


def root_of(module: str) -> str:
    return module.split(".")[0]


@pytest.mark.parametrize("path", files("transferset"), ids=lambda p: str(p.relative_to(ROOT)))
def test_library_never_imports_beam(path):
    rel = str(path.relative_to(ROOT))
    for module, at_top in imports(path):
        assert root_of(module) != "apache_beam", f"{rel} imports {module}: the library must stay Beam-free"
        if root_of(module) == "pipelines":
            assert rel in APP_LAYER and not at_top, \
                f"{rel} imports {module}: only the app layer may reach the pipelines, inside a function"


@pytest.mark.parametrize("path", files("students"), ids=lambda p: str(p.relative_to(ROOT)))
def test_students_never_import_pipelines(path):
    for module, _ in imports(path):
        assert root_of(module) not in ("pipelines", "apache_beam"), \
            f"{path.relative_to(ROOT)} imports {module}: students train from the Parquet cache alone"


def test_the_checker_sees_imports(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import apache_beam as beam\n\ndef f():\n    from pipelines import score\n")
    assert imports(bad) == [("apache_beam", True), ("pipelines", False)]
