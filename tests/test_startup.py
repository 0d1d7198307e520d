"""The command line's start-up (issue 19): garbage collection paused while libraries are
imported and resumed before a command works on a model; the commands still work.

The times themselves live in benchmarks/RESULTS.md (benchmarks/startup.py); these tests
check behaviour only. Each case that runs main() does so in a fresh interpreter: main()
freezes the objects of the process it runs in."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import graphopt.cli as cli

REPO = Path(__file__).resolve().parent.parent


def _run(code: str, cwd: Path, *args: str) -> list[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return [line for line in done.stdout.splitlines() if line.startswith("PROBE ")]


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("example") / "model.onnx"
    subprocess.run([sys.executable, str(REPO / "examples" / "make_example.py"), str(path)], check=True, capture_output=True)
    return path


def test_optimize_collects_garbage_again_before_loading_the_model(example: Path, tmp_path: Path) -> None:
    out = _run(
        """
        import gc, sys
        import graphopt.ir.onnx_io as onnx_io
        real = onnx_io.load_model
        def spy(path):
            print("PROBE load: collecting", gc.isenabled(), "frozen", gc.get_freeze_count() > 0, "threshold", gc.get_threshold()[0])
            return real(path)
        onnx_io.load_model = spy
        from graphopt.cli import main
        print("PROBE before main: collecting", gc.isenabled())
        try:
            main(["optimize", sys.argv[1], "-o", sys.argv[2], "-q"])
        except SystemExit as stop:
            print("PROBE exit", stop.code)
        print("PROBE after main: collecting", gc.isenabled(), "threshold", gc.get_threshold()[0])
        """,
        tmp_path,
        str(example),
        str(tmp_path / "out.onnx"),
    )
    assert out == [
        "PROBE before main: collecting True",
        # the start-up's objects frozen, collection on for the model, the young generation collected less often
        f"PROBE load: collecting True frozen True threshold {cli.WORK_GC_THRESHOLD}",
        "PROBE exit 0",
        f"PROBE after main: collecting True threshold {gc.get_threshold()[0]}",  # as it was
    ]
    assert (tmp_path / "out.onnx").stat().st_size > 0


def test_start_up_runs_without_collection(tmp_path: Path) -> None:
    # --version's callback runs after typer parsed the command line, before any command.
    out = _run(
        """
        import gc
        import graphopt.cli as cli
        real = cli._version_line
        def spy():
            print("PROBE version: collecting", gc.isenabled())
            return real()
        cli._version_line = spy
        try:
            cli.main(["--version"])
        except SystemExit as stop:
            print("PROBE exit", stop.code)
        print("PROBE after main: collecting", gc.isenabled())
        """,
        tmp_path,
    )
    assert out == ["PROBE version: collecting False", "PROBE exit 0", "PROBE after main: collecting True"]


def test_main_leaves_collection_off_when_it_was_off(tmp_path: Path) -> None:
    out = _run(
        """
        import gc
        gc.disable()
        from graphopt.cli import main, _collect_from_here
        try:
            main(["--version"])
        except SystemExit:
            pass
        _collect_from_here()  # main() is over: nothing to resume
        print("PROBE collecting", gc.isenabled())
        """,
        tmp_path,
    )
    assert out == ["PROBE collecting False"]


def test_collect_from_here_does_nothing_outside_main() -> None:
    # A test's CliRunner or an embedding calls the commands without main(): their
    # process's collection is left as it was, nothing frozen.
    assert gc.isenabled()
    frozen = gc.get_freeze_count()
    cli._collect_from_here()
    assert gc.isenabled()
    assert gc.get_freeze_count() == frozen


def test_python_dash_m_runs_the_commands(example: Path, tmp_path: Path) -> None:
    # graphopt/__main__.py pauses collection around its import of the command line.
    env = dict(os.environ, PYTHONPATH=str(REPO), NO_COLOR="1", COLUMNS="200")
    optimized, report = tmp_path / "o.onnx", tmp_path / "r.json"
    expected = {
        ("--version",): "graphopt ",
        ("--help",): "optimize",
        ("optimize", str(example), str(optimized), "-q", "--report", str(report)): "",
        ("explain", str(example), "--rule", "FoldConvBatchNorm"): "FoldConvBatchNorm",
        ("diff", str(example), str(optimized)): "removed",
        ("report", str(report)): "wrote",
    }
    for args, said in expected.items():
        done = subprocess.run([sys.executable, "-m", "graphopt", *args], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
        assert done.returncode == 0, (args, done.stderr)
        assert said in done.stdout, (args, done.stdout)
    assert optimized.stat().st_size > 0 and report.with_suffix(".html").stat().st_size > 0


def test_optimize_imports_only_what_it_needs(example: Path, tmp_path: Path) -> None:
    # With the pattern cache warm, a quiet optimize of a small model needs no parser (lark),
    # no terminal library (rich), no torch and no sympy (the example has a symbolic batch dim).
    code = """
        import sys
        from graphopt.cli import main
        try:
            main(["optimize", sys.argv[1], "-o", sys.argv[2], "-q"])
        except SystemExit as stop:
            print("PROBE exit", stop.code)
        print("PROBE loaded:", ",".join(m for m in ("lark", "rich", "torch", "sympy") if m in sys.modules))
    """
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    env.pop("GRAPHOPT_NO_CACHE", None)
    runs = []
    for _ in range(2):  # the first fills the pattern cache
        done = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code), str(example), str(tmp_path / "out.onnx")],
            capture_output=True,
            text=True,
            env=dict(env, PYTHONPATH=str(REPO)),
            cwd=tmp_path,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        runs.append([line for line in done.stdout.splitlines() if line.startswith("PROBE ")])
    assert runs[0] == ["PROBE exit 0", "PROBE loaded: lark"]  # parsed: the cache was empty
    assert runs[1] == ["PROBE exit 0", "PROBE loaded: "]
