"""Paths graphopt writes: names derived from them that always fit, and a check that no
path written aliases another path read or written in the same run.

A file name may be up to NAME_MAX (255) bytes. graphopt derives temporary and
companion names from the names it is given (`.NAME.graphopt-PID-RANDOM/`,
`NAME.data`); a name that is valid but long must not make those overflow halfway
through a run, after other files were written. And one run must never write over a
file it reads or writes under another name (`--report out.onnx.data`, a link, a hard
link): every path is compared after resolving links, and by inode where it exists.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from graphopt._digest import sha256
from graphopt.errors import GraphoptError

__all__ = ["NAME_MAX", "short_name", "check_name_fits", "check_no_aliases"]

#: Longest file name most file systems take (bytes).
NAME_MAX = 255
#: Room a derived name keeps for what it adds after the given name.
_SUFFIX_ROOM = 64


def short_name(name: str) -> str:
    """`name` itself, or, where a suffix could push it past NAME_MAX, its start and a digest
    (distinct names stay distinct)."""
    encoded = os.fsencode(name)
    if len(encoded) <= NAME_MAX - _SUFFIX_ROOM:
        return name
    digest = sha256(encoded).hexdigest()[:12]
    return os.fsdecode(encoded[: NAME_MAX - _SUFFIX_ROOM - 13]) + "~" + digest


def check_name_fits(path: Path, what: str) -> None:
    """Refuse a file name the file system cannot hold, before anything is written."""
    folder = path.parent if str(path.parent) else Path(".")
    try:
        limit = os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = NAME_MAX
    if len(os.fsencode(path.name)) > limit:
        raise GraphoptError(f"{path}: the {what} file name is longer than this file system allows ({limit} bytes)")


def _identity(path: Path) -> tuple[str, tuple[int, int] | None]:
    real = os.path.realpath(path)
    try:
        stat = os.stat(real)
        return real, (stat.st_dev, stat.st_ino)
    except OSError:
        return real, None


def check_no_aliases(written: Iterable[tuple[Path, str]], read: Iterable[tuple[Path, str]]) -> None:
    """Raise if a path to be written is, after resolving links (and by inode, for hard
    links), another written path or a path read in the same run. Each entry: (path, what)."""
    seen: list[tuple[str, tuple[int, int] | None, Path, str]] = []
    for path, what in read:
        real, inode = _identity(path)
        seen.append((real, inode, path, what))
    for path, what in written:
        real, inode = _identity(path)
        for other_real, other_inode, other, other_what in seen:
            if real == other_real or (inode is not None and inode == other_inode):
                raise GraphoptError(f"{path}: the {what} would overwrite {other_what} {other}")
        seen.append((real, inode, path, what))
