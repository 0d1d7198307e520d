"""onnxruntime's load check in a helper process (graphopt.ir.runtime_check_worker): the same
answers as the check made in this process, a fallback to it wherever the helper cannot
answer, no helper left behind; and numpy imported with one BLAS thread (graphopt.cli_blas)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from conftest import REPO, make_model
from onnx import TensorProto, helper

from graphopt.ir import runtime_check_worker as worker_module
from graphopt.ir.ort_graph_load import load_error
from graphopt.ir.runtime_check import runtime_load_error
from graphopt.ir.runtime_check_worker import NOT_ANSWERED, RuntimeCheckWorker, started_in_background

ort = pytest.importorskip("onnxruntime")
F = TensorProto.FLOAT


def _relu_model() -> onnx.ModelProto:
    return make_model([helper.make_node("Relu", ["x"], ["y"])], [helper.make_tensor_value_info("x", F, [2, 3])],
                      [helper.make_tensor_value_info("y", F, [2, 3])])


def _refused_model() -> onnx.ModelProto:
    # onnx reads it; onnxruntime refuses to resolve it (no such op in the default domain)
    return make_model([helper.make_node("NoSuchOp", ["x"], ["y"])], [helper.make_tensor_value_info("x", F, [2, 3])],
                      [helper.make_tensor_value_info("y", F, [2, 3])])


def _cuda_only_model() -> onnx.ModelProto:
    # A contrib op with no CPU kernel: graph resolution passes, the kernel is missing (tolerated)
    model = make_model([helper.make_node("NhwcConv", ["x", "w"], ["y"], domain="com.microsoft", kernel_shape=[1, 1])],
                       [helper.make_tensor_value_info("x", F, [1, 4, 4, 3]), helper.make_tensor_value_info("w", F, [2, 1, 1, 3])],
                       [helper.make_tensor_value_info("y", F, [1, 4, 4, 2])])
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return model


MODELS = {"loads": _relu_model, "refused": _refused_model, "cuda-only": _cuda_only_model}


@pytest.fixture
def worker():
    started = RuntimeCheckWorker.start()
    assert started is not None
    yield started
    started.close()


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_helper_answers_as_this_process_does(worker: RuntimeCheckWorker, name: str, tmp_path: Path) -> None:
    model = MODELS[name]()
    data = model.SerializeToString()
    path = tmp_path / "m.onnx"
    path.write_bytes(data)
    here = load_error(ort, data)
    assert worker.check(data) == here
    assert worker.check(str(path)) == load_error(ort, str(path))  # by path too (a skeleton written beside)
    if name == "refused":
        assert here is not None and "NoSuchOp" in here
    else:
        assert here is None


@pytest.mark.parametrize("name", sorted(MODELS))
def test_runtime_load_error_is_the_same_with_and_without_the_helper(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(MODELS[name](), str(path))
    alone = runtime_load_error(path)
    asked: list[object] = []
    original = RuntimeCheckWorker.check
    monkeypatch.setattr(RuntimeCheckWorker, "check", lambda self, model: asked.append(model) or original(self, model))
    monkeypatch.setattr(worker_module, "worth_starting", lambda: True)
    with started_in_background() as helper_process:
        assert helper_process is not None
        assert runtime_load_error(path) == alone
    assert len(asked) == 1  # the helper made the check
    assert (alone is None) == (name != "refused")


def test_a_helper_with_another_onnxruntime_is_not_asked(worker: RuntimeCheckWorker, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker_module, "_own_onnxruntime_file", lambda: "/elsewhere/onnxruntime/__init__.py")
    assert worker.check(_refused_model().SerializeToString()) == NOT_ANSWERED
    assert worker._process is None  # closed at once


def test_a_dead_helper_falls_back_to_this_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(_refused_model(), str(path))
    alone = runtime_load_error(path)
    monkeypatch.setattr(worker_module, "worth_starting", lambda: True)
    with started_in_background() as helper_process:
        assert helper_process is not None
        process = helper_process._process
        assert process is not None
        process.kill()
        process.wait()
        assert runtime_load_error(path) == alone  # made here
        assert helper_process._process is None


def test_no_helper_is_left_running(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker_module, "worth_starting", lambda: True)
    with started_in_background() as helper_process:
        assert helper_process is not None
        process = helper_process._process
        assert process is not None and process.poll() is None
    assert process.poll() is not None  # ended and reaped, used or not
    assert worker_module._active is None


def test_started_only_when_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    with started_in_background(False) as helper_process:
        assert helper_process is None
    monkeypatch.delitem(sys.modules, "onnxruntime")  # as in a fresh command line
    monkeypatch.delenv("GRAPHOPT_BACKGROUND_CHECK", raising=False)
    assert not worker_module.worth_starting()  # off by default (slower in median on 2 cores)
    monkeypatch.setenv("GRAPHOPT_BACKGROUND_CHECK", "0")
    assert not worker_module.worth_starting()
    monkeypatch.setenv("GRAPHOPT_BACKGROUND_CHECK", "1")
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    assert worker_module.worth_starting() == (cpus >= 2)
    monkeypatch.setitem(sys.modules, "onnxruntime", ort)  # imported already: a session here costs little
    assert not worker_module.worth_starting()


def _example(tmp_path: Path) -> Path:
    model = tmp_path / "model.onnx"
    subprocess.run([sys.executable, str(REPO / "examples" / "make_example.py"), str(model)], check=True, capture_output=True)
    return model


def _optimize_in_subprocess(tmp_path: Path, model: Path, out: Path, background: bool) -> str:
    probe = (
        "import sys\nimport graphopt.ir.runtime_check_worker as w\n"
        f"w.worth_starting = lambda: {background!r}\n"
        "from graphopt.cli import main\n"
        f"sys.argv = ['graphopt', 'optimize', {str(model)!r}, '-o', {str(out)!r}, '-q']\n"
        "try:\n    main()\nexcept SystemExit as exit:\n    assert not exit.code, exit.code\n"
        "print('ORT-IMPORTED:', 'onnxruntime' in sys.modules)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_optimize_with_the_helper_writes_the_same_model_without_importing_onnxruntime(tmp_path: Path) -> None:
    model = _example(tmp_path)
    with_helper = _optimize_in_subprocess(tmp_path, model, tmp_path / "a.onnx", True)
    alone = _optimize_in_subprocess(tmp_path, model, tmp_path / "b.onnx", False)
    assert "ORT-IMPORTED: False" in with_helper, with_helper
    assert "ORT-IMPORTED: True" in alone, alone
    assert (tmp_path / "a.onnx").read_bytes() == (tmp_path / "b.onnx").read_bytes()


# ------------------------------------------------------------------ numpy's BLAS threads (graphopt.cli_blas)

_THREADS = (
    "import os, sys\nfrom graphopt.cli_blas import import_numpy_single_threaded\n"
    "import_numpy_single_threaded()\n"
    "import numpy\n"
    "print(len(os.listdir('/proc/self/task')), os.environ.get('OPENBLAS_NUM_THREADS'), 'numpy' in sys.modules)\n"
)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir() or (os.cpu_count() or 1) < 2, reason="counts threads in /proc; needs 2 CPUs")
def test_numpy_comes_with_one_blas_thread_and_the_environment_back(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")}
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run([sys.executable, "-c", _THREADS], capture_output=True, text=True, env=env, check=True)
    assert done.stdout.split() == ["1", "None", "True"], done.stdout  # the process's only thread
    # numpy's own import starts more threads where the machine has more cores
    plain = subprocess.run([sys.executable, "-c", "import os, numpy\nprint(len(os.listdir('/proc/self/task')))"],
                           capture_output=True, text=True, env=env, check=True)
    assert int(plain.stdout) > 1, plain.stdout
    # a user's own choice is kept: left alone, numpy imported later
    env["OPENBLAS_NUM_THREADS"] = "2"
    done = subprocess.run([sys.executable, "-c", _THREADS], capture_output=True, text=True, env=env, check=True)
    assert done.stdout.split() == ["2", "2", "True"], done.stdout
