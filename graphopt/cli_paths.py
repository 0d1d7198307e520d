"""Checks the command line runs on the paths of a run before the (possibly long) optimization.

`check_writable_folder` fails early when an output or report cannot be written there;
`guard_paths` refuses a run that would write over a path it reads (the input model, its
external data, pattern files) or write two outputs to one file, after resolving links,
except the output replacing the input with --force. The checks on names and aliases
themselves are graphopt.paths'.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from graphopt.errors import GraphoptError

if TYPE_CHECKING:  # the command line imports this at start: `graphopt --help` must not pay for onnx-ir
    import onnx_ir as ir

__all__ = ["check_writable_folder", "same_file", "guard_paths"]

def check_writable_folder(path: Path, what: str) -> None:
    """Fail early, before the (possibly long) optimization, if `path` cannot be written."""
    from graphopt.paths import check_name_fits

    folder = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise GraphoptError(f"{path}: the {what} path is a directory")
    if not folder.exists():
        raise GraphoptError(f"{path}: the {what} folder {folder} does not exist")
    if not folder.is_dir():
        raise GraphoptError(f"{path}: the {what} folder {folder} is not a folder")
    try:  # os.access lies for root and read-only mounts; creating a file does not
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        raise GraphoptError(f"{path}: cannot write to the {what} folder {folder}: {error.strerror or error}") from None
    check_name_fits(path, what)


def same_file(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def _external_files(model: ir.Model, base: Path) -> set[str]:
    from graphopt.ir.onnx_io import _external_tensors  # the same walk load_model checks

    return {os.path.realpath(base / tensor.location) for _, tensor in _external_tensors(model)}


def _pattern_files(patterns: list[Path]) -> list[Path]:
    files: list[Path] = []
    for path in patterns:
        if path.is_dir():
            files.extend(p for p in sorted(path.rglob("*")) if p.suffix in (".pdll", ".py") and p.is_file())
        else:
            files.append(path)
    return files


def guard_paths(input_path: Path, output: Path, report: Path | None, model: ir.Model, patterns: list[Path], force: bool) -> None:
    """No path this run writes (the output, its data file, the report) may be a path it
    reads (the input, its external data, pattern files) or another path it writes, after
    resolving links; the one exception is the output replacing the input with --force,
    which save_model does without ever losing the input (graphopt/ir/onnx_io.py)."""
    from graphopt.ir.onnx_io import data_file_names
    from graphopt.paths import check_no_aliases

    replaces_input = same_file(input_path, output) or os.path.realpath(input_path) == os.path.realpath(output)
    if replaces_input and not force:
        raise GraphoptError(f"{output}: the output is the input model; pass --force to replace it")
    read = [(input_path, "the input model")]
    read += [(Path(f), "the input model's external data") for f in sorted(_external_files(model, input_path.parent))]
    read += [(f, "the pattern file") for f in _pattern_files(patterns)]
    written: list[tuple[Path, str]] = []
    if replaces_input:
        # save_model never replaces a data file the model at the output path reads (the input's).
        read = [entry for entry in read if entry[1] != "the input model's external data"]
        read = [entry for entry in read if entry[1] != "the input model"]
    else:
        written.append((output, "output"))
    folder = output.parent if str(output.parent) else Path(".")
    written += [(folder / name, "output's external data file") for name in data_file_names(output)]
    if report is not None:
        written.append((report, "report"))
    check_no_aliases(written, read)

