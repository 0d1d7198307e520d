"""graphopt._lazy_onnx: onnx imports without importlib.metadata, its __version__ the same, and
with onnx.utils and onnx.gen_proto imported on first use;
`plain_version` gives what importlib.metadata gives, or leaves the answer to it."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from graphopt._lazy_onnx import plain_version

REPO = Path(__file__).resolve().parent.parent


def test_onnx_imports_without_importlib_metadata_and_the_same_version() -> None:
    probe = (
        "import sys, importlib\n"
        "import graphopt, onnx\n"
        "print('LOADED', 'importlib.metadata' in sys.modules, 'email' in sys.modules, hasattr(importlib, 'metadata'))\n"
        "print('LOADER', type(onnx.__loader__).__name__, type(onnx.__spec__.loader).__name__)\n"
        "print('HOOKS', [type(f).__name__ for f in sys.meta_path if type(f).__name__ == '_OnnxHook'])\n"
        "import importlib.metadata\n"
        "print('MODULE', type(importlib.metadata).__name__, importlib.metadata.__file__ is not None)\n"
        "print('VERSION', onnx.__version__ == importlib.metadata.version('onnx'), onnx.__version__)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True)
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert lines["LOADED"] == "False False False", done.stdout
    assert "_LoaderWithStandIn" not in lines["LOADER"], lines["LOADER"]  # onnx keeps its real loader
    assert lines["HOOKS"] == "[]"  # the hook was used once and is gone
    assert lines["MODULE"] == "module True"  # later importers get the real module
    assert lines["VERSION"].startswith("True "), lines["VERSION"]


def test_plain_version_of_every_installed_distribution() -> None:
    names = {dist.metadata["Name"] for dist in importlib.metadata.distributions()}
    assert len(names) > 10
    for name in sorted(names):
        expected = importlib.metadata.version(name)
        for spelling in {name, name.upper(), name.replace("-", "_"), name.replace("_", "-"), name.replace("-", ".")}:
            assert plain_version(spelling) == expected, spelling
    assert plain_version("surely-not-installed-graphopt-test") is None
    assert plain_version("") is None


def _dist(folder: Path, directory: str, metadata: str | None, file: str = "METADATA") -> None:
    (folder / directory).mkdir(parents=True)
    if metadata is not None:
        (folder / directory / file).write_text(metadata, encoding="utf-8")


@pytest.fixture
def search_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., tuple[str | None, str | None]]:
    """Both answers for a distribution on a sys.path of the given folders: (plain_version, importlib.metadata's)."""

    def answers(name: str, *folders: Path | str) -> tuple[str | None, str | None]:
        monkeypatch.setattr(sys, "path", [str(f) for f in folders])
        try:
            real: str | None = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            real = None
        return plain_version(name), real

    return answers


@pytest.mark.parametrize("metadata,version", [
    ("Metadata-Version: 2.1\nName: demo-pkg\nVersion: 1.2.3\n\nbody: Version: 9\n", "1.2.3"),
    ("Metadata-Version: 2.1\nname: demo-pkg\nVERSION:\t 2.0 \nSummary: a\n  continued\n", "2.0 "),  # names any case; value as email keeps it
    ("Name: demo-pkg\nVersion: 1.0\nVersion: 2.0\n", "1.0"),  # the first one
    ("Name: demo-pkg\r\nVersion: 3.0\r\n\r\n", "3.0"),  # read in text mode, as importlib.metadata reads it
    ("Author: Zoë\nVersion: 4.0\n", "4.0"),
])
def test_plain_metadata_read_as_importlib_metadata_reads_it(search_path: Callable[..., tuple[str | None, str | None]], tmp_path: Path,
                                                            metadata: str, version: str) -> None:
    _dist(tmp_path / "site", "demo_pkg-0.0.dist-info", metadata)
    assert search_path("demo-pkg", tmp_path / "site") == (version, version)


@pytest.mark.parametrize("metadata", [
    "Name: demo-pkg\nVersion: 1.0\n  continued\n",  # Version's own continuation line
    "Name: demo-pkg\nnot a header\nVersion: 1.0\n",  # the headers end before Version
    "From somebody\nVersion: 1.0\n",
    "Na me: x\nVersion: 1.0\n",  # not a header name: the headers end there
    ": x\nVersion: 1.0\n",
    "Name: demo-pkg\n\nVersion: 1.0\n",  # in the body
    "Name: demo-pkg\x0cVersion: 1.0\n",  # a break email's parser splits on
    "Name: demo-pkg\nVersion:\n",
    "",
])
def test_odd_metadata_is_left_to_importlib_metadata(search_path: Callable[..., tuple[str | None, str | None]], tmp_path: Path,
                                                    metadata: str) -> None:
    _dist(tmp_path / "site", "demo_pkg-0.0.dist-info", metadata)
    assert search_path("demo-pkg", tmp_path / "site")[0] is None


def test_odd_layouts_are_left_to_importlib_metadata(search_path: Callable[..., tuple[str | None, str | None]], tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    first, second, missing = tmp_path / "first", tmp_path / "second", tmp_path / "missing"
    _dist(second, "demo_pkg-2.0.dist-info", "Version: 2.0\n")
    assert search_path("demo-pkg", missing, first.parent / "nothing", second) == ("2.0", "2.0")  # missing folders skipped
    _dist(first, "Demo.Pkg-1.0.dist-info", "Version: 1.0\n")
    assert search_path("demo-pkg", first, second) == ("1.0", "1.0")  # the first folder that has it
    _dist(first, "demo_pkg-1.1.dist-info", "Version: 1.1\n")
    assert search_path("demo-pkg", first, second)[0] is None  # two in one folder: listing order decides there
    _dist(tmp_path / "eggs", "demo_pkg-1.0.egg-info", "Version: 1.0\n", file="PKG-INFO")
    assert search_path("demo-pkg", tmp_path / "eggs", second)[0] is None
    _dist(tmp_path / "old", "demo_pkg-1.0.dist-info", "Version: 1.0\n", file="PKG-INFO")
    assert search_path("demo-pkg", tmp_path / "old") == (None, "1.0")
    archive = tmp_path / "dists.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr("demo_pkg-5.0.dist-info/METADATA", "Version: 5.0\n")
    assert search_path("demo-pkg", archive, second) == (None, "5.0")
    assert search_path("demo-pkg", tmp_path / "x.egg", second)[0] is None

    class DistributionFinder:
        @staticmethod
        def find_distributions(*args: object, **kwargs: object) -> list[object]:
            return []

    monkeypatch.setattr(sys, "meta_path", [DistributionFinder(), *sys.meta_path])
    assert search_path("demo-pkg", second)[0] is None  # another finder of distributions: its answer may come first


def test_the_stand_in_asks_the_real_module_for_the_rest() -> None:
    # In a fresh process, as onnx's import sees it: nothing imported until something other
    # than a plain version is read.
    probe = (
        "import sys, importlib\n"
        "from graphopt import _lazy_onnx\n"
        "stand_in = _lazy_onnx._MetadataStandIn()\n"
        "sys.modules['importlib.metadata'] = stand_in\n"
        "importlib.metadata = stand_in\n"
        "assert stand_in.version('onnx') == _lazy_onnx.plain_version('onnx') is not None\n"
        "assert sys.modules['importlib.metadata'] is stand_in and 'email' not in sys.modules\n"
        "error = stand_in.PackageNotFoundError\n"
        "real = sys.modules['importlib.metadata']\n"
        "assert real is not stand_in and error is real.PackageNotFoundError and importlib.metadata is real\n"
        "try:\n"
        "    stand_in.version('surely-not-installed-graphopt-test')\n"
        "except real.PackageNotFoundError:\n"
        "    print('OK')\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env)
    assert done.returncode == 0 and done.stdout == "OK\n", done.stderr


@pytest.mark.parametrize("name", ["onnx", "onnx-ir", "ONNX__IR", "a.-_b", "-x-", "a..b", "A_B.c-D", "", "ü-x", "x--", "._"])
def test_names_normalized_as_importlib_metadata_does(name: str) -> None:
    from importlib.metadata import Prepared  # type: ignore[attr-defined]

    from graphopt._lazy_onnx import _normalize

    assert _normalize(name) == Prepared.normalize(name)


def test_deferred_submodules_are_imported_on_first_use() -> None:
    probe = (
        "import sys, types\n"
        "import graphopt, onnx\n"
        "from graphopt._lazy_onnx import DEFERRED_SUBMODULES\n"
        "assert DEFERRED_SUBMODULES == ('onnx.utils', 'onnx.gen_proto')\n"
        "print('LOADED', [m for m in (*DEFERRED_SUBMODULES, 'tarfile', 'argparse') if m in sys.modules])\n"
        "print('STAND-IN', type(onnx.utils).__name__, isinstance(onnx.utils, types.ModuleType), onnx.utils.__name__)\n"
        "print('USE', onnx.utils.Extractor.__module__, onnx.compose.utils.Extractor is onnx.utils.Extractor)\n"
        "import onnx.utils\n"
        "print('REAL', type(sys.modules['onnx.utils']).__name__, sys.modules['onnx.utils'].__file__.endswith('utils.py'), 'tarfile' in sys.modules)\n"
        "import onnx.gen_proto\n"
        "print('GEN', callable(onnx.gen_proto.main), type(onnx.gen_proto).__name__, 'argparse' in sys.modules)\n"
        "from onnx import gen_proto\n"
        "print('FROM', gen_proto is sys.modules['onnx.gen_proto'])\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert lines["LOADED"] == "[]", done.stdout  # nothing of them imported with onnx
    assert lines["STAND-IN"] == "_SubmoduleStandIn True onnx.utils"
    assert lines["USE"] == "onnx.utils True"  # first use: the real module's classes, for onnx.compose too
    assert lines["REAL"] == "module True True"
    assert lines["GEN"] == "True module True" and lines["FROM"] == "True"


def test_onnx_imported_before_graphopt_is_left_alone() -> None:
    probe = (
        "import sys\n"
        "import onnx, graphopt\n"
        "print(type(onnx.utils).__name__, 'importlib.metadata' in sys.modules)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True)
    assert done.stdout == "module True\n"
