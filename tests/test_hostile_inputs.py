"""Hostile inputs: every model and pattern file of tests/hostile/corpus.py is refused with
one clear `error:` line and exit code 2, or (where it is odd but valid) optimized into a
model that computes what the input does. In every case: nothing hangs (each run has a
time limit), nothing outside the model's folder is opened (FIFO traps: opening one for
reading blocks, so a run that tries hangs and is caught), no allocation follows a
tensor's declared size, and nothing is written at the output path unless the run
succeeded.

Each case runs `graphopt optimize` in its own process, forked from a warm server
(tests/hostile/runner.py) so the corpus takes seconds; two cases also run through a
plain `python -m graphopt` to show the two agree.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import run_cli
from hostile.corpus import CASES, Case, _relu_model, _write
from hostile.runner import Finished, WarmCli

#: Per case; the slowest take well under a second.
TIME_LIMIT_S = 30
#: A case may grow the process by this much at most: nothing declared is allocated.
MAX_GROWTH_BYTES = 512 << 20


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WarmCli]:
    folder = tmp_path_factory.mktemp("warm")
    model = _write(folder, _relu_model())
    with WarmCli(["optimize", str(model), "-o", str(folder / "warm.opt.onnx"), "-q"]) as server:
        yield server


def _run_ort(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]).run(None, feeds)


def check_outcome(case: Case, result: Finished, out: Path, setup_model: Path, feeds, expected) -> None:
    assert not result.timed_out, f"{case}: still running after {TIME_LIMIT_S}s (a trap opened? a loop?)"
    assert result.returncode >= 0, f"{case}: killed by signal {-result.returncode} (a crash)\n{result.stderr}"
    assert "Traceback" not in result.stderr + result.stdout, f"{case}: a traceback\n{result.stderr}"
    if case.expect == "refused":
        assert result.returncode == 2, f"{case}: exit {result.returncode}\nstdout: {result.stdout}\nstderr: {result.stderr}"
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), f"{case}: expected one error line, got:\n{result.stderr}"
        for needle in case.needles:
            assert needle.lower() in lines[0].lower(), f"{case}: {needle!r} not in {lines[0]!r}"
        assert list(out.parent.iterdir()) == [], f"{case}: written despite the error: {list(out.parent.iterdir())}"
        return
    assert result.returncode == 0, f"{case}: exit {result.returncode}\n{result.stderr}"
    assert out.exists()
    onnx.load(str(out))  # loads, with its external data if any
    assert out.stat().st_size + sum(p.stat().st_size for p in out.parent.iterdir() if p != out) < 64 << 20, f"{case}: a huge output"
    if feeds is not None:
        actual = _run_ort(out, feeds)
        reference = expected if expected is not None else _run_ort(setup_model, feeds)
        assert len(actual) == len(reference)
        for a, e in zip(actual, reference):
            np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6)


def _params() -> list[object]:
    params = []
    for case in CASES:
        marks = [pytest.mark.xfail(strict=True, reason=case.known_gap)] if case.known_gap else []
        params.append(pytest.param(case, id=case.name, marks=marks))
    return params


@pytest.mark.parametrize("case", _params())
def test_hostile_input(case: Case, cli: WarmCli, tmp_path: Path) -> None:
    folder = tmp_path / "case"
    folder.mkdir()
    setup = case.build(folder)
    out_folder = tmp_path / "out"
    out_folder.mkdir()
    out = out_folder / "model.opt.onnx"
    before = {p: p.lstat().st_mtime_ns for p in folder.rglob("*")}
    result = cli.run(["optimize", setup.model, "-o", out, *setup.args], cwd=tmp_path, timeout=TIME_LIMIT_S)
    check_outcome(case, result, out, setup.model, setup.feeds, setup.expected)
    assert result.max_rss_bytes - cli.baseline_rss_bytes < MAX_GROWTH_BYTES, f"{case}: grew by {(result.max_rss_bytes - cli.baseline_rss_bytes) >> 20} MiB"
    for trap in setup.traps:  # still a FIFO: nothing replaced it, and the run did not block on it
        assert trap.is_fifo()
    assert {p: p.lstat().st_mtime_ns for p in folder.rglob("*")} == before, f"{case}: the input folder changed"


@pytest.mark.parametrize("name", ["external-dotdot", "attribute-of-wrong-type", "constant-of-shape-bomb"])
def test_plain_command_line_agrees(name: str, tmp_path: Path) -> None:
    """The same cases through `python -m graphopt` (a fresh interpreter, not a fork)."""
    case = next(c for c in CASES if c.name == name)
    folder = tmp_path / "case"
    folder.mkdir()
    setup = case.build(folder)
    out = tmp_path / "out" / "model.opt.onnx"
    out.parent.mkdir()
    done = run_cli("optimize", setup.model, "-o", out, *setup.args, cwd=tmp_path, timeout=TIME_LIMIT_S)
    check_outcome(case, Finished(done.returncode, done.stdout, done.stderr, False, 0.0, 0), out, setup.model, setup.feeds, setup.expected)


def test_corpus_covers_the_brief() -> None:
    """The kinds of hostile input the corpus must hold, by name."""
    names = {c.name for c in CASES}
    wanted = {
        "truncated-half", "attribute-of-wrong-type", "dangling-input", "duplicate-initializers", "cycle", "huge-input-dims",
        "external-dotdot", "external-absolute", "external-symlink-out", "external-offset-past-end", "constant-bomb",
        "nested-ifs-400", "pattern-syntax-error", "pattern-unknown-op", "pattern-unknown-native", "pattern-deep-nesting",
    }  # fmt: skip
    assert wanted <= names, wanted - names
    assert len(CASES) >= 60
    assert len(names) == len(CASES)  # unique ids
