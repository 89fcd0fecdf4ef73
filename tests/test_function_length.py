"""Rooms a maintainer can live in: no library function over MAX_FUNCTION_LINES lines and no library
file over MAX_FILE_LINES lines, in transferset/, students/ and pipelines/.

A function's lines run from its first decorator to its last line, docstring and comments included: what a
reader scrolls through. A nested function counts inside its parent and on its own.
"""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("transferset", "students", "pipelines")
MAX_FUNCTION_LINES = 60
MAX_FILE_LINES = 450

ALLOWED: set[str] = set()  # every room is within the limits: add nothing here


def library_files() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def long_functions(path: Path) -> list[str]:
    """`name (first line): N lines` for each function of `path` over MAX_FUNCTION_LINES."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            lines = node.end_lineno - first + 1
            if lines > MAX_FUNCTION_LINES:
                found.append(f"{node.name} (line {node.lineno}): {lines} lines")
    return found


def problems(path: Path) -> list[str]:
    lines = len(path.read_text(encoding="utf-8").splitlines())
    too_long = [f"the file has {lines} lines (at most {MAX_FILE_LINES})"] if lines > MAX_FILE_LINES else []
    return too_long + long_functions(path)


def test_no_library_function_or_file_is_too_long():
    found = {p.relative_to(ROOT).as_posix(): problems(p) for p in library_files()
             if p.relative_to(ROOT).as_posix() not in ALLOWED}
    found = {k: v for k, v in found.items() if v}
    assert not found, ("split these into named steps or cohesive modules:\n"
                       + "\n".join(f"{path}: {'; '.join(v)}" for path, v in found.items()))


@pytest.mark.parametrize("source, expect", [
    ("def f():\n" + "    x = 1\n" * (MAX_FUNCTION_LINES - 1), []),
    ("@decorator\ndef f():\n" + "    x = 1\n" * (MAX_FUNCTION_LINES - 1), [f"f (line 2): {MAX_FUNCTION_LINES + 1} lines"]),
    ("class A:\n    def g(self):\n" + "        x = 1\n" * MAX_FUNCTION_LINES, [f"g (line 2): {MAX_FUNCTION_LINES + 1} lines"]),
])
def test_the_checker_counts_a_function_from_its_first_decorator_to_its_last_line(tmp_path, source, expect):
    path = tmp_path / "m.py"
    path.write_text(source)
    assert long_functions(path) == expect
