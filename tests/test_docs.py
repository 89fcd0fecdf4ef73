"""The documentation site: it builds strictly (a broken link or a page missing from mkdocs.yml fails), and the
command and configuration pages are the ones docs/generate.py writes from the code (a flag or a setting
without its entry fails: regenerate with `python docs/generate.py`)."""
import dataclasses
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"


def _generate():
    spec = importlib.util.spec_from_file_location("docs_generate", DOCS / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _build(root: Path, site: Path) -> subprocess.CompletedProcess:
    pytest.importorskip("mkdocs", reason="the site needs mkdocs (pip install -e '.[test]')")
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=root, capture_output=True, text=True, timeout=300)


def test_the_site_builds_strictly_and_a_broken_link_fails_it(tmp_path):
    built = _build(REPO, tmp_path / "site")
    assert built.returncode == 0, built.stderr[-3000:]
    for page in ("index.html", "getting-started/index.html", "commands/index.html", "configuration/index.html",
                 "results/index.html", "reliability/index.html", "architecture/index.html"):
        assert (tmp_path / "site" / page).stat().st_size > 1000, page
    # the same docs with one broken link: the strict build refuses them, naming the page and the target
    copy = tmp_path / "copy"
    shutil.copytree(DOCS, copy / "docs")
    shutil.copy(REPO / "mkdocs.yml", copy / "mkdocs.yml")
    with open(copy / "docs" / "index.md", "a", encoding="utf-8") as fh:
        fh.write("\nSee [the missing page](no-such-page.md).\n")
    broken = _build(copy, tmp_path / "broken")
    assert broken.returncode != 0 and "no-such-page.md" in broken.stderr


@pytest.mark.parametrize("page", ["commands.md", "configuration.md"])
def test_the_generated_pages_are_current(page):
    generated = _generate().PAGES[page]()
    assert (DOCS / page).read_text(encoding="utf-8") == generated, (
        f"docs/{page} differs from what the code generates: run `python docs/generate.py` and commit it")


def test_every_flag_of_every_command_has_its_entry():
    from transferset.app import cli

    text = (DOCS / "commands.md").read_text(encoding="utf-8")
    for name in cli.COMMANDS:
        assert f"\n## {name}\n" in text, name
        _, parser, _ = cli.build_subparser(name)
        section = text.split(f"\n## {name}\n", 1)[1].split("\n## ", 1)[0]
        for action in parser._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert f"`{flag}" in section or f", {flag}" in section, f"transferset {name} {flag}"


def test_every_setting_has_its_entry():
    from transferset import config

    text = (DOCS / "configuration.md").read_text(encoding="utf-8")
    classes = [c for c in vars(config).values() if isinstance(c, type) and dataclasses.is_dataclass(c)
               and c.__module__.startswith(config.__name__) and c.__name__.endswith("Config")]
    assert len(classes) >= 10
    for cls in classes:
        for f in dataclasses.fields(cls):
            assert f"| `{f.name}` |" in text, f"{cls.__name__}.{f.name}"


def test_a_new_flag_makes_the_commands_page_stale(monkeypatch):
    """The comparison can fail: a parser with one more flag generates another page."""
    from transferset.app.run import runner

    generate = _generate()
    before = generate.commands_page()
    add = runner.add_arguments

    def more(parser):
        add(parser)
        parser.add_argument("--brand-new-flag", help="a flag the page does not have yet")

    monkeypatch.setattr(runner, "add_arguments", more)
    after = generate.commands_page()
    assert after != before and "`--brand-new-flag" in after and "`--brand-new-flag" not in before


def test_no_line_of_the_docs_is_longer_than_120_characters():
    """A page a person reads in an editor or a diff: prose wraps at 120 (a table row, one line by Markdown's rule,
    is the exception)."""
    from pathlib import Path

    long = [f"{p.name}:{i}" for p in sorted(Path(__file__).resolve().parents[1].joinpath("docs").glob("*.md"))
            for i, line in enumerate(p.read_text(encoding="utf-8").split("\n"), 1)
            if len(line) > 120 and not line.lstrip().startswith("|")]
    assert long == []


_TOP_FOLDERS = ("transferset", "students", "pipelines", "tests", "benchmarks", "configs", "docs")
_TOP_FILES = ("Makefile", "pyproject.toml", "setup.py", "setup.cfg", "mkdocs.yml", "Dockerfile", "MANIFEST.in",
              "requirements.txt", "tox.ini", "noxfile.py")
_SEGMENT = r"(?:[\w.*?<>\[\]-]|\{[\w.,-]*\})"
_REPO_PATH = re.compile(r"(?<![\w/.~$@:-])((?:%s)/(?:%s|/)*)" % ("|".join(_TOP_FOLDERS), _SEGMENT))
_TOP_FILE = re.compile(r"(?<![\w/.~$@:-])(%s)(?![\w/-]|\.\w)" % "|".join(map(re.escape, _TOP_FILES)))
_PLACEHOLDER = re.compile(r"[A-Z][A-Z0-9_]*")
_CAPITALIZED_FILES = {"README", "FINDINGS", "LICENSE", "CHANGELOG", "CONTRIBUTING"}
# a stale path in a table of docs/reliability.md, which another change is extending: fixed there, then removed here
_PENDING: set[tuple[str, str]] = set()


def _expand_braces(path: str) -> list[str]:
    match = re.search(r"\{([^{}]*)\}", path)
    if match is None:
        return [path]
    return [p for choice in match.group(1).split(",")
            for p in _expand_braces(path[:match.start()] + choice + path[match.end():])]


def stale_paths(text: str, root: Path = REPO) -> list[str]:
    """The repository paths `text` names that are not in the repository at `root`, each once, in order.

    A path is a token anywhere in the text (prose, `code`, a link's target, a fenced block) that starts with one
    of the repository's top-level folders (transferset/, students/, pipelines/, tests/, benchmarks/, configs/,
    docs/) and is not inside a longer path (`RUN/students/NAME`, `~/.cache/transferset/runs/x`, a URL), or that is
    one of the top-level files (Makefile, pyproject.toml, setup.py, mkdocs.yml, ...). A trailing full stop is
    punctuation. It must exist under `root`, a folder or a file, with these exceptions:
    - a placeholder: a segment whose name before its first dot is in capitals (`NAME`, `KIND`, `RUN`, `OUT`,
      `transferset/augment/NAME.py`; README, FINDINGS, LICENSE, CHANGELOG and CONTRIBUTING are real names),
      or one in angle brackets (`<name>`): not checked;
    - a glob (`*`, `?`, `[...]`): it must match at least one path; `{a,b}` is expanded and each must exist;
    - a run's output (`runs/demo/students/x`, `RUN/scored/`, `OUT/model`) does not start with a top-level
      folder, or starts inside a longer path, so it is not checked."""
    found: list[str] = []
    for match in list(_REPO_PATH.finditer(text)) + list(_TOP_FILE.finditer(text)):
        path = match.group(1).rstrip(".")
        if "<" in path or any(_PLACEHOLDER.fullmatch(part.split(".")[0]) and part.split(".")[0] not in
                              _CAPITALIZED_FILES for part in path.split("/") if part):
            continue
        for one in _expand_braces(path):
            there = (any(root.glob(one.rstrip("/"))) if re.search(r"[*?\[]", one)
                     else (root / one).exists())
            if not there and one not in found:
                found.append(one)
    return found


def test_every_path_a_doc_names_is_in_the_repository():
    """A doc that names a moved or deleted file (`transferset/training.py`, now a package) sends a reader nowhere:
    every repository path in docs/*.md exists (the rule: `stale_paths`)."""
    stale = [(page.name, path) for page in sorted(DOCS.glob("*.md"))
             for path in stale_paths(page.read_text(encoding="utf-8"))]
    assert [s for s in stale if s not in _PENDING] == [], "paths no longer in the repository (git ls-files)"
    assert set(stale) >= _PENDING, f"fixed: remove {sorted(_PENDING - set(stale))} from _PENDING"


def test_a_stale_path_fails_and_placeholders_globs_and_run_outputs_do_not():
    text = """Read `transferset/no_such_module.py` and [the gone script](benchmarks/gone_script.py); see
transferset/also_gone/ in prose, and under `Makefile` and `setup.cfg`.

```
transferset train --config configs/demo.yaml --output runs/demo/students/x    # a run's output
cat RUN/students/NAME/metrics.json OUT/model/config.json ~/.cache/transferset/runs/a/b.json
ls transferset/augment/NAME.py transferset/config/presets/<preset>.yaml tests/test_*.py tests/no_such_*.py
ls benchmarks/quality/{demo,no_such_setting}.yaml docs/results.md. configs/ students/families/
```
"""
    assert stale_paths(text) == ["transferset/no_such_module.py", "benchmarks/gone_script.py",
                                 "transferset/also_gone/", "tests/no_such_*.py",
                                 "benchmarks/quality/no_such_setting.yaml", "setup.cfg"]
