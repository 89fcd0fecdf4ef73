"""Symbolic links inside an output folder: a writer never goes through one.

A link inside OUT (OUT/data -> another set's data/, OUT/model -> a teacher) would make a rerun clear and
write the files of the folder it points to, which no record of OUT describes: another transfer set's shards
replaced while its stats.json still describes the old ones. OUT itself, and the folders above it, may be
links (a runs/ folder on another disk): they name the output; a link below it is refused, before anything is
changed. Only local folders have links; a URL has none.
"""
from __future__ import annotations

import os
from typing import Iterable, Optional

from transferset import fs
from transferset.runtime.errors import ConfigError


def links_under(folder: str) -> list[str]:
    """The paths inside local `folder` (relative to it, "/"-separated) that are symbolic links, sorted; the walk
    never enters one. [] for a URL or a folder that does not exist."""
    if fs.is_remote(folder) or not os.path.isdir(folder):
        return []
    found = []
    for root, dirs, files in os.walk(folder):  # followlinks=False: a linked folder is listed, not entered
        for name in dirs + files:
            path = os.path.join(root, name)
            if os.path.islink(path):
                found.append(os.path.relpath(path, folder).replace(os.sep, "/"))
    return sorted(found)


def links_on_the_way(top: str, path: str) -> list[str]:
    """The components of local `path` below `top` (itself included) that are symbolic links, as paths relative
    to `top`: a stage folder `top/a/b` reached through a link `top/a`."""
    if fs.is_remote(path) or fs.is_remote(top):
        return []
    rel = os.path.relpath(os.path.abspath(path), os.path.abspath(top))
    if rel == "." or rel.startswith(".."):
        return []
    parts, found = rel.split(os.sep), []
    for i in range(1, len(parts) + 1):
        if os.path.islink(os.path.join(top, *parts[:i])):
            found.append("/".join(parts[:i]))
    return found


def refuse_links(folder: str, links: Iterable[str], option: Optional[str] = "--output") -> None:
    """One line naming the first link inside `folder` and where it points (a usage error, exit 2); nothing
    when there is none."""
    links = sorted(links)
    if not links:
        return
    path = os.path.join(folder, *links[0].split("/"))
    more = f" (and {len(links) - 1} more)" if len(links) > 1 else ""
    where = f"{option} {folder}" if option else folder
    raise ConfigError(f"{where}: {links[0]} is a symbolic link (to {os.path.realpath(path)}){more}; transferset "
                      "never writes or clears an output through a link inside it, as that would change the folder it "
                      "points to: replace the link with a folder of its own, or choose another output")
