"""One registry for every extension point: augment ops and their contexts, student losses and student families.

Each registry is filled by discovery, so adding one is adding a module: every module of the registry's package
is imported (pkgutil), and each registers what it defines; a package outside this repository registers through
an entry point of the registry's group, e.g. in its pyproject.toml

    [project.entry-points."transferset.losses"]
    logit_l1 = "my_package.losses"

whose module is imported once, when the registry is first read. A name registered twice and an unknown name
are both a RegistryError (a ConfigError, so a ValueError too: one line, exit 2), the second listing the known
names.

Why not `catalogue` (installed with spaCy), which reads entry points too: it replaces a name registered twice
without a word, and the house style refuses a duplicate; its look-ups read the entry points again each time.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import pkgutil
from typing import Generic, Iterator, Optional, Sequence, TypeVar

from transferset.runtime.errors import ConfigError

T = TypeVar("T")


class RegistryError(ConfigError):
    """A name registered twice, an unknown name, or an entry point that failed to load."""


class Registry(Generic[T]):
    """Named objects of one kind (`what`, as messages say it), discovered from `package` and entry point `group`."""

    def __init__(self, what: str, group: str, package: Optional[str] = None, skip: Sequence[str] = ()):
        self.what, self.group, self.package, self.skip = what, group, package, tuple(skip)
        self._items: dict[str, T] = {}
        self._by: dict[str, str] = {}
        self._discovered = False
        self._discovering = False

    def add(self, name: str, obj: T, by: str = "") -> T:
        """Register `obj` under `name` (`by`: the module that defines it, for the duplicate's message)."""
        self.check_free(name, by)
        self._items[name] = obj
        self._by[name] = by
        return obj

    def check_free(self, name: str, by: str = "") -> None:
        """A name registered already is refused (before a registration checks anything else)."""
        if name in self._items:
            raise RegistryError(f"{self.what} {name!r} is already registered (by {self._by[name] or 'another module'})"
                                f"{f'; {by} registers it again' if by else ''}: give one of them another name")

    def get(self, name: Optional[str], where: str = "") -> T:
        self.discover()
        if name not in self._items:
            raise RegistryError(f"{where + ': ' if where else ''}unknown {self.what} {name!r}; known: "
                                f"{', '.join(sorted(self._items))}")
        return self._items[name]

    def names(self) -> list[str]:
        """The registered names, in registration order."""
        self.discover()
        return list(self._items)

    def values(self) -> list[T]:
        self.discover()
        return list(self._items.values())

    def items(self) -> list[tuple[str, T]]:
        self.discover()
        return list(self._items.items())

    def __contains__(self, name: object) -> bool:
        self.discover()
        return name in self._items

    def __getitem__(self, name: str) -> T:
        return self.get(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    @contextlib.contextmanager
    def scratch(self):
        """The registry as it is now, restored afterwards: what a test registers stays in that test."""
        self.discover()
        items, by = dict(self._items), dict(self._by)
        try:
            yield self
        finally:
            self._items, self._by = items, by

    def discover(self) -> None:
        """Import the package's modules and the entry points' modules, once; each registers what it defines."""
        if self._discovered or self._discovering:
            return
        self._discovering = True  # a module being imported here may read the registry
        try:
            if self.package:
                package = importlib.import_module(self.package)
                for module in pkgutil.iter_modules(package.__path__):
                    if module.name not in self.skip and not module.name.startswith("_"):
                        importlib.import_module(f"{self.package}.{module.name}")
            for entry in importlib.metadata.entry_points(group=self.group):
                self._load(entry)
            self._discovered = True
        finally:
            self._discovering = False

    def _load(self, entry) -> None:
        try:
            entry.load()
        except RegistryError:
            raise
        except Exception as exc:  # a broken plugin would otherwise fail every command with a bare traceback
            where = entry.dist.name if entry.dist else "an installed package"
            raise RegistryError(f"the {self.what} {entry.name} = {entry.value} (entry point group {self.group} of "
                                f"{where}) failed to load: {type(exc).__name__}: {exc}") from exc
