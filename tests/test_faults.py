"""Faults while writing: a run killed at any moment (SIGKILL), a full disk, a read-only
destination and concurrent runs never leave a half-written or mismatched model.

The promise (graphopt/ir/onnx_io.py, `save_model` and `_commit`): at the output path
there is either nothing (before the first run) or a complete model with the data file it
reads: the previous one or the new one, at every moment. The data file is `NAME.data`
or `NAME.alt.data`, whichever the model already at NAME does not read, so the model is
replaced in one rename after its new data is in place. What a killed run can leave:

* its staging folder `.NAME.graphopt-PID-RANDOM/`, deleted by the next run that writes
  NAME (`remove_stale_staging`: the process is gone and nobody holds the folder's lock);
* when killed in the microseconds between its two renames, its new data file beside the
  previous model, which does not read it; the next run replaces it.
"""

from __future__ import annotations

import errno
import hashlib
import importlib.util
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import REPO, run_cli
from hostile.runner import WarmCli

from graphopt.errors import ModelError
from graphopt.ir import fast_io, fast_save, onnx_io


def _benchmark():
    path = REPO / "benchmarks" / "large_model.py"
    spec = importlib.util.spec_from_file_location("graphopt_large_model", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


large = _benchmark()
SPEC = large.DecoderSpec(hidden=512, layers=4, heads=8)  # 50 MB of weights in external data
TARGETS = ("onnx", "ort-cpu")  # two options whose outputs differ, so a mixed pair would show
NAME = "model.opt.onnx"


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    env.pop("GRAPHOPT_FAST_IO", None)
    return env


def _command(source: Path, out: Path, target: str) -> list[str]:
    return [sys.executable, "-m", "graphopt", "optimize", str(source), "-o", str(out), "-q", "--target", target]


def _digest(path: Path) -> str | None:
    if not path.exists():
        return None
    return hashlib.sha256(path.read_bytes()).hexdigest()


DATA_NAMES = (NAME + ".data", NAME + ".alt.data")


def _pair(out: Path) -> tuple[str | None, str | None]:
    """(model digest, digest of the data file it reads) at `out`."""
    if not out.exists():
        return None, None
    locations = {e.value for t in onnx.load(str(out), load_external_data=False).graph.initializer for e in t.external_data if e.key == "location"}
    assert len(locations) <= 1, locations
    return _digest(out), _digest(out.parent / locations.pop()) if locations else None


def _data_digests(folder: Path, name: str = NAME) -> set[str | None]:
    """Digests of the data files (either name) present in `folder`."""
    return {_digest(folder / n) for n in (name + ".data", name + ".alt.data") if (folder / n).exists()}


def _staging_dirs(folder: Path, name: str = NAME) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.name.startswith(f".{name}."))


def _files_of(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


@pytest.fixture(autouse=True)
def free_disk(tmp_path: Path) -> Iterator[None]:
    """The outputs here are 50 MB each; pytest would keep the last few runs' worth."""
    yield
    shutil.rmtree(tmp_path, ignore_errors=True)


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    folder = tmp_path_factory.mktemp("faults")
    path = large.build_decoder(folder / "in", SPEC, full=True)
    yield path
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def references(source: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, set[tuple[str | None, str | None]]]:
    """Each target's complete outputs (digests), under either data-file name (a run over an
    existing output writes the other one), checked once: they load and compute what the input does."""
    folder = tmp_path_factory.mktemp("references")
    pairs: dict[str, set[tuple[str | None, str | None]]] = {}
    for target in TARGETS:
        out = folder / target / NAME
        out.parent.mkdir()
        pairs[target] = set()
        for data_name in DATA_NAMES:
            done = subprocess.run(_command(source, out, target), env=_env(), capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr
            assert _files_of(out.parent) == {NAME, data_name}  # the replaced model's data file went
            onnx.checker.check_model(str(out))
            assert large.compare_outputs(source, out, SPEC.hidden) < 1e-4
            pairs[target].add(_pair(out))
        assert len(pairs[target]) == 2 and all(None not in pair for pair in pairs[target])
        assert len({data for _, data in pairs[target]}) == 1  # the same bytes under either name
    assert not pairs["onnx"] & pairs["ort-cpu"]
    shutil.rmtree(folder)
    return pairs


# ------------------------------------------------------------------ SIGKILL


class _Subprocess:
    """`python -m graphopt ARGS`, what a user runs, with WarmCli's start/running/kill/wait."""

    def start(self, args: list[str]) -> None:
        self.child = subprocess.Popen([sys.executable, "-m", "graphopt", *args], env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def running(self) -> bool:
        return self.child.poll() is None

    def kill(self) -> int:
        self.child.send_signal(signal.SIGKILL)  # does nothing if it already ended
        return self.child.wait(timeout=60)

    def wait(self) -> int:
        return self.child.wait(timeout=60)

    def close(self) -> None:
        pass


Launcher = _Subprocess | WarmCli


def _kill_at(launcher: Launcher, args: list[str], out_folder: Path, delay: float | None, after_staging: float | None) -> int:
    """Start a run; SIGKILL it after `delay` seconds, or `after_staging` seconds after its
    staging folder appears (it is writing then). Returns its exit status (-9: killed)."""
    known = set(_staging_dirs(out_folder))
    launcher.start(args)
    started = time.monotonic()
    if delay is not None:
        time.sleep(delay)
    else:
        while launcher.running() and time.monotonic() - started < 60:
            if set(_staging_dirs(out_folder)) - known:
                time.sleep(after_staging or 0.0)
                break
            time.sleep(0.0005)
    return launcher.kill()


def _finish(launcher: Launcher, args: list[str]) -> int:
    """Start a run and let it end; its exit status."""
    launcher.start(args)
    return launcher.wait()


@pytest.mark.parametrize("kind, attempts", [("forkserver", 30), ("subprocess", 4)])
def test_sigkill_at_random_moments_leaves_nothing_or_a_complete_model(
    source: Path, references: dict, tmp_path: Path, kind: str, attempts: int
) -> None:
    rng = random.Random(f"2026-{kind}")
    out = tmp_path / NAME
    input_before = {p.name: _digest(p) for p in source.parent.iterdir()}

    def args(target: str) -> list[str]:
        return _command(source, out, target)[3:]  # without `python -m graphopt`

    warm = tmp_path / "warm"
    warm.mkdir()
    # The fork server (tests/hostile/runner.py): the same graphopt.cli.main without a second
    # of start-up per run, so 30 kills fit in seconds; a few runs are real `python -m graphopt`.
    launcher: Launcher = WarmCli(warm_up=_command(source, warm / NAME, "onnx")[3:]) if kind == "forkserver" else _Subprocess()
    shutil.rmtree(warm)
    try:
        _kill_runs(launcher, args, out, references, rng, attempts)
    finally:
        launcher.close()
    assert {p.name: _digest(p) for p in source.parent.iterdir()} == input_before  # the input is never touched


def _kill_runs(launcher: Launcher, args: Callable[[str], list[str]], out: Path, references: dict, rng: random.Random, attempts: int) -> None:
    complete_data = {data for pairs in references.values() for _, data in pairs}
    tmp_path = out.parent

    # How long a whole run takes, for spreading the kill times over it.
    started = time.monotonic()
    assert _finish(launcher, args("onnx")) == 0
    total = time.monotonic() - started
    for leftover in tmp_path.iterdir():
        leftover.unlink()

    previous: tuple[str | None, str | None] = (None, None)  # nothing written yet
    outcomes = {"killed": 0, "finished": 0, "killed_while_writing": 0, "stale_staging_seen": 0, "unread_data_file": 0}
    for attempt in range(attempts):
        target = TARGETS[attempt % 2]
        if attempt % 2 == 0:  # anywhere in the run: start-up, loading, rewriting, writing
            status = _kill_at(launcher, args(target), tmp_path, delay=rng.uniform(0.0, total), after_staging=None)
        else:  # while it writes: its staging folder exists
            status = _kill_at(launcher, args(target), tmp_path, delay=None, after_staging=rng.uniform(0.0, 0.05))
            outcomes["killed_while_writing"] += status == -signal.SIGKILL
        outcomes["killed" if status == -signal.SIGKILL else "finished"] += 1
        assert status in (0, -signal.SIGKILL), f"attempt {attempt}: exit {status}"

        pair = _pair(out)
        # A complete model with the data it reads: the previous output, or this run's if it got that far;
        # nothing only before the first run got that far. Never a model gone once there was one.
        assert pair == previous or pair in references[target], f"attempt {attempt}: a missing, mismatched or partial model"
        assert previous[0] is None or pair[0] is not None, f"attempt {attempt}: the previous model is gone"
        previous = pair
        # Any data file present is complete (one nothing reads yet: a run killed between its renames).
        assert _data_digests(tmp_path) <= complete_data, f"attempt {attempt}: a partial data file"
        outcomes["unread_data_file"] += len(_data_digests(tmp_path)) > (pair[1] is not None)
        leftovers = _files_of(tmp_path) - {NAME, *DATA_NAMES}
        assert all(name.startswith(f".{NAME}.graphopt-") for name in leftovers), leftovers
        outcomes["stale_staging_seen"] += bool(leftovers)

        if attempt % (attempts // 2) == attempts // 2 - 1:  # a run that finishes cleans up what the killed ones left
            assert _finish(launcher, args(target)) == 0
            assert _files_of(tmp_path) in ({NAME, DATA_NAMES[0]}, {NAME, DATA_NAMES[1]})
            previous = _pair(out)
            assert previous in references[target]
    print(f"SIGKILL outcomes ({attempts} attempts, a whole run {total:.2f}s): {outcomes}")  # shown with -s, for RELIABILITY.md
    assert outcomes["killed"] >= attempts * 2 // 3 and outcomes["killed_while_writing"] >= attempts // 3, outcomes
    assert outcomes["stale_staging_seen"] >= attempts // 4, outcomes  # the finishing runs had something to clean


def test_stale_staging_is_removed_but_a_live_one_is_kept(tmp_path: Path) -> None:
    out = tmp_path / NAME
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".{NAME}.graphopt-{dead.pid}-abc"
    live = tmp_path / f".{NAME}.graphopt-{os.getpid()}-def"
    unrelated = tmp_path / ".other.onnx.graphopt-1-x"
    for folder in (stale, live, unrelated):
        folder.mkdir()
        (folder / NAME).write_bytes(b"partial")
    assert onnx_io.remove_stale_staging(out) == [stale]
    assert not stale.exists() and live.exists() and unrelated.exists()


# ------------------------------------------------------------------ the commit itself


def _tiny_model(value: float) -> onnx.ModelProto:
    from onnx import TensorProto, helper, numpy_helper

    weights = numpy_helper.from_array(np.full((64, 64), value, np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
        [weights],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _load_ir(model: onnx.ModelProto):
    import onnx_ir as ir

    return ir.serde.deserialize_model(model)


def test_crash_between_the_two_renames_never_shows_a_mismatched_pair(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The commit of a model with external data, interrupted after its first rename: the
    output path holds the old model with its own data (the new data went in under the
    other name), never the old model with the new data, and never nothing."""
    out = tmp_path / "m.onnx"
    onnx_io.save_model(_load_ir(_tiny_model(1.0)), out, external_data=True)
    assert out.exists() and (tmp_path / "m.onnx.data").exists()
    real_replace = os.replace
    calls = []

    def crash_after_first(src, dst):  # type: ignore[no-untyped-def]
        real_replace(src, dst)
        if Path(dst).parent == tmp_path:  # a rename into place (onnx-ir renames inside the staging folder too)
            calls.append(dst)
            raise KeyboardInterrupt("killed")  # not an OSError: nothing handles it, like a kill

    monkeypatch.setattr(onnx_io.os, "replace", crash_after_first)
    with pytest.raises(KeyboardInterrupt):
        onnx_io.save_model(_load_ir(_tiny_model(2.0)), out, external_data=True)
    monkeypatch.setattr(onnx_io.os, "replace", real_replace)
    assert [Path(c).name for c in calls] == ["m.onnx.alt.data"]
    assert float(onnx.numpy_helper.to_array(onnx.load(str(out)).graph.initializer[0]).max()) == 1.0  # the old model, whole
    assert _files_of(tmp_path) == {"m.onnx", "m.onnx.data", "m.onnx.alt.data"}  # and the staging folder went with the exception
    onnx_io.save_model(_load_ir(_tiny_model(2.0)), out, external_data=True)
    assert float(onnx.numpy_helper.to_array(onnx.load(str(out)).graph.initializer[0]).max()) == 2.0
    assert _files_of(tmp_path) == {"m.onnx", "m.onnx.alt.data"}  # the replaced model's data file went


# ------------------------------------------------------------------ full disk


class _DiskFull:
    """Make every write fail with ENOSPC once `budget` bytes were written."""

    def __init__(self, budget: int) -> None:
        self.budget = budget

    def spend(self, size: int) -> None:
        self.budget -= size
        if self.budget < 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("path_kind", ["fast_io", "onnx_ir"])
def test_full_disk_in_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path_kind: str) -> None:
    """ENOSPC part-way through writing (simulated, so it runs without root): a clear
    ModelError, the previous output intact, no staging folder left."""
    out = tmp_path / "m.onnx"
    onnx_io.save_model(_load_ir(_tiny_model(1.0)), out)
    before = _pair(out)
    disk = _DiskFull(budget=4096)
    if path_kind == "fast_io":
        real_write = fast_save._Writer.write

        def write(self, data):  # type: ignore[no-untyped-def]
            disk.spend(len(memoryview(data)))
            real_write(self, data)

        monkeypatch.setattr(fast_save._Writer, "write", write)
        monkeypatch.setattr(fast_save._Writer, "copy", lambda self, source, offset, length: disk.spend(length))
        # A mapped tensor, so fast_io's writer does the writing.
        saved = tmp_path / "src" / "big.onnx"
        saved.parent.mkdir()
        onnx.save(_tiny_model(3.0), str(saved))
        monkeypatch.setattr(onnx_io, "MIN_MAPPED_FILE_BYTES", 1)
        model = onnx_io.load_model(saved)
        assert any(isinstance(v.const_value, fast_io.MappedTensor) for v in model.graph.initializers.values())
    else:
        monkeypatch.setattr(fast_io, "ENABLED", False)
        import onnx_ir as ir

        real_save = ir.save

        def save(model, path, **kwargs):  # type: ignore[no-untyped-def]
            real_save(model, path, **kwargs)  # the files are there (partly, as far as we know): then the disk is full
            disk.spend(sum(p.stat().st_size for p in Path(path).parent.iterdir()))

        monkeypatch.setattr(onnx_io.ir, "save", save)
        model = _load_ir(_tiny_model(3.0))
    with pytest.raises(ModelError, match="No space left on device"):
        onnx_io.save_model(model, out, external_data=True)
    assert _pair(out) == before and _files_of(tmp_path) - {"src"} == {"m.onnx"}


def _mount_tmpfs(where: Path, size: str, *options: str) -> bool:
    where.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join([f"size={size}", *options]), "tmpfs", str(where)], capture_output=True)
    return done.returncode == 0


def _umount(where: Path) -> None:
    subprocess.run(["umount", "-l", str(where)], capture_output=True)


def _can_mount(tmp_path: Path) -> bool:
    probe = tmp_path / "probe"
    if _mount_tmpfs(probe, "1m"):
        _umount(probe)
        return True
    return False


def test_full_disk_on_a_real_small_filesystem(source: Path, tmp_path: Path) -> None:
    """A 20 MB tmpfs cannot hold the 50 MB output: exit 2, one `error:` line, the
    previous model there intact, nothing else left, the space given back."""
    if not _can_mount(tmp_path):
        pytest.skip("needs root to mount a small tmpfs (test_full_disk_in_process covers the same without it)")
    disk = tmp_path / "disk"
    assert _mount_tmpfs(disk, "20m")
    try:
        out = disk / NAME
        onnx.save(_tiny_model(1.0), str(out))
        before = _pair(out)
        result = run_cli("optimize", source, "-o", out, "--target", "onnx", cwd=tmp_path)
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith("error: ") and len(result.stderr.splitlines()) == 1, result.stderr
        assert "No space left on device" in result.stderr and "Traceback" not in result.stderr
        assert _pair(out) == before and _files_of(disk) == {NAME}
        usage = shutil.disk_usage(disk)
        assert usage.used < 1 << 20  # the partial data file is gone
    finally:
        _umount(disk)


def test_read_only_destination_keeps_the_previous_output(source: Path, tmp_path: Path) -> None:
    if not _can_mount(tmp_path):
        pytest.skip("needs root to mount a read-only tmpfs (tests/test_bad_input.py covers a read-only folder without it)")
    disk = tmp_path / "ro"
    assert _mount_tmpfs(disk, "4m")
    try:
        onnx.save(_tiny_model(1.0), str(disk / NAME))
        before = _pair(disk / NAME)
        assert subprocess.run(["mount", "-o", "remount,ro", str(disk)], capture_output=True).returncode == 0
        result = run_cli("optimize", source, "-o", disk / NAME, cwd=tmp_path)
        assert result.returncode == 2 and result.stderr.startswith("error: ") and len(result.stderr.splitlines()) == 1, result.stderr
        assert "Read-only file system" in result.stderr
        assert _pair(disk / NAME) == before and _files_of(disk) == {NAME}
    finally:
        _umount(disk)


# ------------------------------------------------------------------ concurrent runs


def test_concurrent_runs_do_not_interfere(source: Path, references: dict, tmp_path: Path) -> None:
    """Four runs at once on the same input: to four outputs, then to one output (two
    runs per target, so a mixed pair would show). Every output is a complete, matching pair."""
    separate = [tmp_path / f"out{i}" / NAME for i in range(4)]
    for out in separate:
        out.parent.mkdir()
    shared = tmp_path / "shared" / NAME
    shared.parent.mkdir()
    rounds = [[(out, TARGETS[i % 2]) for i, out in enumerate(separate)], [(shared, TARGETS[i % 2]) for i in range(4)]]
    for runs in rounds:
        children = [subprocess.Popen(_command(source, out, target), env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for out, target in runs]
        errors = [child.communicate(timeout=180)[1].decode() for child in children]
        assert [child.returncode for child in children] == [0] * 4, errors
        for out, target in runs:
            pair = _pair(out)
            if out == shared:
                assert any(pair in pairs for pairs in references.values())  # one run's model with that same run's data
            else:
                assert pair in references[target]
            assert _files_of(out.parent) in ({NAME, DATA_NAMES[0]}, {NAME, DATA_NAMES[1]})
    sess = ort.InferenceSession(str(shared), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((1, 3, SPEC.hidden)).astype(np.float32)
    assert np.isfinite(sess.run(None, {"x": x})[0]).all()
