"""onnx imported without what its import brings that graphopt's runs never use.

`import onnx` costs ~0.045 s of the ~0.27 s `graphopt optimize` takes on a small model
(benchmarks/RESULTS.md, 2026-11-28, session 8), and two parts of it serve nothing there:

* `onnx.__version__ = importlib.metadata.version("onnx")`: importing importlib.metadata (it
  brings email's parser, zipfile, csv and socket) and its look-up, ~0.013 s for one string
  read from one file;
* the submodules onnx imports "so they're available when you import onnx" that nothing in
  graphopt, onnx-ir or onnxruntime imports: `onnx.utils` (it imports tarfile) and
  `onnx.gen_proto` (argparse, glob), ~0.004 s (`DEFERRED_SUBMODULES`).

So `lighten_onnx_import()`, run by `import graphopt` (as graphopt._lazy_sympy's hook for
onnx-ir), hooks the import of onnx. While onnx's own code runs, `importlib.metadata` is a
stand-in whose `version(name)` reads the `Version` header of the distribution's METADATA
file itself where the look-up is plain (`plain_version`: sys.path's directories, one
`*.dist-info` of that name in the first directory that has any, a METADATA file whose
headers are simple `Name: value` lines), giving what importlib.metadata gives; wherever it
is not plain, and for anything else read from the stand-in, the real importlib.metadata is
imported and answers. The deferred submodules are stand-ins too (graphopt._lazy_sympy's):
`onnx.utils` and the names onnx's modules bound to it import the real module when one of
its attributes is first read. Once onnx is imported, `sys.modules` holds no stand-in: a
later `import importlib.metadata` or `import onnx.utils` imports the real module as usual.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types
from importlib.machinery import PathFinder
from typing import TYPE_CHECKING, Any

from graphopt._lazy_sympy import _StandIn as _LazyModule

if TYPE_CHECKING:
    from importlib.abc import Loader
    from importlib.machinery import ModuleSpec

__all__ = ["lighten_onnx_import", "plain_version", "DEFERRED_SUBMODULES"]

#: onnx's submodules imported on first use rather than with onnx (none of graphopt, onnx-ir or onnxruntime imports them).
DEFERRED_SUBMODULES = ("onnx.utils", "onnx.gen_proto")

_MODULE = "importlib.metadata"
#: Line breaks other than "\n" that email's parser also splits on (str.splitlines).
_ODD_BREAKS = frozenset("\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")


def _normalize(name: str) -> str:
    """importlib.metadata's Prepared.normalize (PEP 503, dashes as underscores), without compiling
    its regular expression: each run of "-", "_" and "." becomes one "_"."""
    parts: list[str] = []
    in_run = False
    for char in name:
        if char in "-_.":
            if not in_run:
                parts.append("_")
            in_run = True
        else:
            parts.append(char)
            in_run = False
    return "".join(parts).lower()


def _header_name(line: str) -> str | None:
    """The name of a header line as email's feed parser reads one (its headerRE: printable
    ASCII but ":" and space, then ":"), or None; an empty name counts as none here."""
    end = line.find(":")
    name = line[:end]
    return name if end > 0 and all("!" <= char <= "~" for char in name) else None


def _metadata_version(text: str) -> str | None:
    """The `Version` header of a METADATA text as email's compat32 parser reads it (None: not plain)."""
    found: str | None = None
    in_version = False
    for line in text.split("\n"):
        if not line:
            break  # the end of the headers
        if _ODD_BREAKS.intersection(line):
            return None
        if line[0] in " \t":  # a continuation line: fine for other headers, not for Version's
            if in_version:
                return None
            continue
        name = _header_name(line)
        if name is None or line.startswith("From "):
            return None  # the parser would end the headers here, or read a mailbox line
        value = line[len(name) + 1:]
        in_version = name.lower() == "version" and found is None
        if in_version:
            found = value.lstrip(" \t")
    return found or None


def plain_version(name: str) -> str | None:
    """What `importlib.metadata.version(name)` gives, read directly where the look-up is plain;
    None where it is not (or nothing is found): then importlib.metadata must answer."""
    if type(name) is not str or not name or sys.version_info < (3, 11):
        return None  # (Python 3.10's look-up matches folder names in its own way: its answer)
    # Only the path finder looks for distributions (no editable-install or zip finders of its kind).
    if [f for f in sys.meta_path if getattr(f, "find_distributions", None) is not None] != [PathFinder]:
        return None
    wanted = _normalize(name)
    for root in sys.path:
        if type(root) is not str or os.path.basename(root).lower().endswith(".egg"):
            return None
        try:
            children = os.listdir(root or ".")
        except FileNotFoundError:
            continue  # importlib.metadata finds nothing there either
        except OSError:
            return None  # a zip file, an unreadable folder: importlib.metadata's business
        found = [
            child for child in children
            if child.lower().endswith((".dist-info", ".egg-info"))
            and _normalize(child.lower().rpartition(".")[0].partition("-")[0]) == wanted
        ]
        if not found:
            continue
        if len(found) > 1 or not found[0].lower().endswith(".dist-info"):
            return None
        try:
            with open(os.path.join(root, found[0], "METADATA"), encoding="utf-8") as file:  # text mode, as read_text
                return _metadata_version(file.read())
        except (OSError, UnicodeDecodeError):
            return None
    return None


def _real() -> types.ModuleType:
    """The real importlib.metadata, imported now if it is not yet (the stand-in out of the way)."""
    module = sys.modules.get(_MODULE)
    if isinstance(module, _MetadataStandIn):
        del sys.modules[_MODULE]
    if isinstance(vars(importlib).get("metadata"), _MetadataStandIn):
        delattr(importlib, "metadata")
    return importlib.import_module(_MODULE)


class _MetadataStandIn(types.ModuleType):
    """importlib.metadata while onnx imports: `version` read directly where plain, the rest from the real module."""

    def __init__(self) -> None:
        super().__init__(_MODULE)

    def version(self, distribution_name: str) -> str:
        found = plain_version(distribution_name)
        return found if found is not None else _real().version(distribution_name)

    def __getattr__(self, name: str) -> Any:  # anything else: the real module's
        return getattr(_real(), name)


class _SubmoduleStandIn(_LazyModule):
    """A deferred onnx submodule: the real one imported when an attribute is first read."""


class _LoaderWithStandIn:
    """onnx's own loader, run with the stand-in as importlib.metadata. (The import system's
    protocols, not importlib.abc's classes: see graphopt._lazy_sympy.)"""

    def __init__(self, loader: Loader) -> None:
        self.loader = loader

    def create_module(self, spec: ModuleSpec) -> types.ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        stand_in = _MetadataStandIn() if _MODULE not in sys.modules else None
        if stand_in is not None:
            sys.modules[_MODULE] = stand_in
            importlib.metadata = stand_in  # type: ignore[misc,assignment]  # `import importlib.metadata` then reads this attribute
        # `from onnx import utils` binds the stand-in (the import system's fallback to sys.modules).
        submodules = {name: _SubmoduleStandIn(name) for name in DEFERRED_SUBMODULES if name not in sys.modules}
        sys.modules.update(submodules)
        try:
            self.loader.exec_module(module)
        finally:
            if stand_in is not None:
                if sys.modules.get(_MODULE) is stand_in:
                    del sys.modules[_MODULE]
                if vars(importlib).get("metadata") is stand_in:
                    delattr(importlib, "metadata")
            for name, submodule in submodules.items():
                if sys.modules.get(name) is submodule:
                    del sys.modules[name]
            module.__loader__ = self.loader  # the module keeps its real loader
            if module.__spec__ is not None:
                module.__spec__.loader = self.loader


class _OnnxHook:
    """A finder on sys.meta_path that hands onnx's import to `_LoaderWithStandIn`, once."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
        if name != "onnx":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)  # found as it would be without this hook
        if spec is not None and spec.loader is not None:
            spec.loader = _LoaderWithStandIn(spec.loader)  # type: ignore[assignment]
        return spec


def lighten_onnx_import() -> None:
    """Let onnx import without importlib.metadata and `DEFERRED_SUBMODULES`, unless it is imported already."""
    if "onnx" in sys.modules or any(isinstance(f, _OnnxHook) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _OnnxHook())
