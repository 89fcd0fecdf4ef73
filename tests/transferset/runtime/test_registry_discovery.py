"""transferset/runtime/registry.py: discovery from a package and from entry points, duplicates and unknown names.
The registries themselves: tests/transferset/augment/test_registry.py, tests/students/losses/test_loss_registry.py,
tests/students/families/test_family_registry.py (a family and a loss of another package, by entry points)."""
import importlib
import sys

import pytest

from transferset.runtime.errors import ConfigError
from transferset.runtime.registry import Registry, RegistryError


def _package(root, name: str, modules: dict) -> None:
    (root / name).mkdir()
    (root / name / "__init__.py").write_text("")
    for module, text in modules.items():
        (root / name / f"{module}.py").write_text(text)


@pytest.fixture
def on_path(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith("regpkg")]:
        del sys.modules[name]
    importlib.invalidate_caches()


def test_every_module_of_the_package_registers_once_and_private_or_skipped_ones_are_not_imported(on_path):
    things = Registry("thing", "transferset.test_things", "regpkg", skip=("machinery",))
    sys.modules["regpkg_registry"] = type(sys)("regpkg_registry")
    sys.modules["regpkg_registry"].THINGS = things
    add = "import regpkg_registry\nregpkg_registry.THINGS.add({name!r}, {value}, by=__name__)\n"
    _package(on_path, "regpkg", {"one": add.format(name="one", value=1), "two": add.format(name="two", value=2),
                                 "_private": "raise RuntimeError('never imported')",
                                 "machinery": "raise RuntimeError('never imported')"})
    try:
        assert things.names() == ["one", "two"] and things.get("two") == 2 and "one" in things
        assert dict(things.items()) == {"one": 1, "two": 2}
        with pytest.raises(RegistryError, match=r"thing 'one' is already registered \(by regpkg.one\); x registers"):
            things.add("one", 3, by="x")
        with pytest.raises(RegistryError, match=r"here: unknown thing 'three'; known: one, two"):
            things.get("three", "here")
        assert issubclass(RegistryError, ConfigError) and issubclass(RegistryError, ValueError)  # exit 2
    finally:
        del sys.modules["regpkg_registry"]


def test_a_scratch_registration_is_gone_afterwards():
    things = Registry("thing", "transferset.test_things")
    things.add("kept", 1)
    with things.scratch():
        things.add("temporary", 2)
        assert things.names() == ["kept", "temporary"]
    assert things.names() == ["kept"]


def test_an_entry_point_registers_and_a_broken_one_says_which(on_path):
    things = Registry("thing", "transferset.test_things")
    sys.modules["regpkg_registry"] = type(sys)("regpkg_registry")
    sys.modules["regpkg_registry"].THINGS = things
    _package(on_path, "regpkg", {"plugin": "import regpkg_registry\nregpkg_registry.THINGS.add('plugged', 7)\n",
                                 "broken": "raise ImportError('no such dependency')\n"})
    dist = on_path / "regpkg-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: regpkg\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[transferset.test_things]\nplugged = regpkg.plugin\n")
    try:
        assert things.get("plugged") == 7
        broken = Registry("thing", "transferset.test_broken")
        (dist / "entry_points.txt").write_text("[transferset.test_broken]\nbad = regpkg.broken\n")
        with pytest.raises(RegistryError, match=r"the thing bad = regpkg.broken \(entry point group "
                                                r"transferset.test_broken of regpkg\) failed to load: ImportError"):
            broken.names()
    finally:
        del sys.modules["regpkg_registry"]
