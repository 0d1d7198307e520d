"""graphopt.ir.runtime_verdicts: a graph onnxruntime loaded is not checked again (onnxruntime not
imported); a refusal is never remembered; the key holds the graph, the check's code and onnxruntime."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from graphopt.errors import ModelError
from graphopt.ir import runtime_check, runtime_verdicts
from graphopt.ir.runtime_check import check_loads_in_onnxruntime, runtime_load_error

REPO = Path(__file__).resolve().parent.parent


def _add_model(path: Path, y_shape: list[int]) -> Path:
    """X[2,3] + Y: onnxruntime loads it for Y [2,3] and refuses it (Incompatible dimensions) for Y [4,5]."""
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, y_shape)
    z = helper.make_tensor_value_info("Z", TensorProto.FLOAT, None)
    graph = helper.make_graph([helper.make_node("Add", ["X", "Y"], ["Z"])], "g", [x, y], [z])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("GRAPHOPT_NO_CACHE", raising=False)
    return tmp_path / "cache" / "graphopt" / "ort-loads"


class _Sessions:
    """Counts the sessions the check makes."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.made = 0
        real = runtime_check._load_error

        def counted(model: bytes | str) -> str | None:
            self.made += 1
            return real(model)

        monkeypatch.setattr(runtime_check, "_load_error", counted)


def test_a_loaded_graph_is_not_checked_again(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sessions = _Sessions(monkeypatch)
    model = _add_model(tmp_path / "ok.onnx", [2, 3])
    assert runtime_load_error(model) is None and sessions.made == 1
    assert len(list(cache.iterdir())) == 1
    assert runtime_load_error(model) is None and sessions.made == 1  # remembered
    other = _add_model(tmp_path / "other.onnx", [1, 3])  # another graph: checked
    assert runtime_load_error(other) is None and sessions.made == 2


def test_a_refusal_is_never_remembered(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sessions = _Sessions(monkeypatch)
    bad = _add_model(tmp_path / "bad.onnx", [4, 5])
    for made in (1, 2):
        assert "Incompatible dimensions" in (runtime_load_error(bad) or "") and sessions.made == made
    assert not cache.exists() or not list(cache.iterdir())
    with pytest.raises(ModelError, match="does not load in onnxruntime"):
        check_loads_in_onnxruntime(bad, None, "out.onnx")


@pytest.mark.parametrize("change", ["onnxruntime", "check"])
def test_another_onnxruntime_or_check_checks_again(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str) -> None:
    sessions = _Sessions(monkeypatch)
    model = _add_model(tmp_path / "ok.onnx", [2, 3])
    assert runtime_load_error(model) is None and sessions.made == 1
    if change == "onnxruntime":  # another build (reinstalled, upgraded): other binaries
        identity = runtime_verdicts.onnxruntime_identity()
        assert identity is not None and b"onnxruntime_pybind11_state" in identity
        monkeypatch.setattr(runtime_verdicts, "onnxruntime_identity", lambda: identity + b" upgraded")
    else:  # the check makes its session another way
        monkeypatch.setattr(runtime_verdicts, "_check_code", lambda: b"other session options")
    assert runtime_load_error(model) is None and sessions.made == 2


def test_no_cache_checks_every_time(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRAPHOPT_NO_CACHE", "1")
    sessions = _Sessions(monkeypatch)
    model = _add_model(tmp_path / "ok.onnx", [2, 3])
    assert runtime_load_error(model) is None and runtime_load_error(model) is None and sessions.made == 2
    assert not cache.exists()


def test_an_unwritable_cache_is_no_error(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache.parent.mkdir(parents=True)
    cache.write_text("a file where the folder would be")
    sessions = _Sessions(monkeypatch)
    model = _add_model(tmp_path / "ok.onnx", [2, 3])
    assert runtime_load_error(model) is None and runtime_load_error(model) is None and sessions.made == 2


def test_without_onnxruntime_there_is_no_check(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime_check, "onnxruntime_identity", lambda: None)
    monkeypatch.setattr(runtime_check, "_importable", lambda: False)
    assert runtime_load_error(_add_model(tmp_path / "bad.onnx", [4, 5])) is None
    (tmp_path / "unreadable.onnx").write_bytes(b"not a model")
    assert runtime_load_error(tmp_path / "unreadable.onnx") is None


def test_the_second_run_on_a_model_does_not_import_onnxruntime(tmp_path: Path) -> None:
    # The command line, twice on the README's model: the same output, onnxruntime imported only the first time.
    model = tmp_path / "model.onnx"
    subprocess.run([sys.executable, str(REPO / "examples" / "make_example.py"), str(model)], check=True, capture_output=True)
    env = dict(os.environ, PYTHONPATH=str(REPO), XDG_CACHE_HOME=str(tmp_path / "cache"))
    env.pop("GRAPHOPT_NO_CACHE", None)
    outputs = []
    for run in (1, 2):
        out = tmp_path / f"out{run}.onnx"
        probe = (
            "import sys\nfrom graphopt.cli import main\n"
            f"sys.argv = ['graphopt', 'optimize', {str(model)!r}, '-o', {str(out)!r}, '-q']\n"
            "try:\n    main()\nexcept SystemExit as exit:\n    assert not exit.code, exit.code\n"
            "print('ORT', 'onnxruntime' in sys.modules)\n"
        )
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        outputs.append((done.stdout, out.read_bytes()))
    assert outputs[0][0] == "ORT True\n" and outputs[1][0] == "ORT False\n"
    assert outputs[0][1] == outputs[1][1]


def test_no_home_folder_means_nothing_remembered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.delenv("GRAPHOPT_NO_CACHE", raising=False)

    def no_home() -> Path:
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    sessions = _Sessions(monkeypatch)
    model = _add_model(tmp_path / "ok.onnx", [2, 3])
    assert runtime_load_error(model) is None and runtime_load_error(model) is None and sessions.made == 2


def test_a_broken_onnxruntime_is_not_taken_for_a_refusal(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # onnxruntime failing to import (not missing) stops the run as it did before the verdicts:
    # it is not the model's refusal (which the input model's refusal would excuse).
    def broken() -> bool:
        raise RuntimeError("onnxruntime's library could not be loaded")

    monkeypatch.setattr(runtime_check, "_importable", broken)
    with pytest.raises(RuntimeError, match="could not be loaded"):
        runtime_load_error(_add_model(tmp_path / "ok.onnx", [2, 3]))
