"""The ONNX backend test suite through onnxruntime, without and with graphopt.

Every test model of the suite shipped in the ``onnx`` package is run in
onnxruntime (CPU) twice: as it is, and after ``graphopt.optimize`` rewrote it.
Outputs are compared with the test's expected outputs exactly as onnx's backend
runner compares them (``onnx.backend.test.runner.Runner.assert_similar_outputs``,
the test case's rtol/atol: 1e-3 / 1e-7 unless the case says otherwise).

The suite is what ``onnx.backend.test.loader`` finds:

* ``node``: one test per operator case. onnx 1.23 no longer ships these as
  files (``onnx/backend/test/data/node`` is absent): they are generated once
  from ``onnx.backend.test.case.node`` (``collect_testcases``, ~15 s) and
  written, in the standard layout (model.onnx, test_data_set_*/input_*.pb,
  output_*.pb, data.json with rtol/atol), to ``.cache/onnx-backend/node``;
* ``simple``, ``pytorch-converted``, ``pytorch-operator``: from the package's data folder;
* ``real``: the package points these at its ``data/light`` models; their inputs
  and expected outputs are made as onnx's runner makes them (deterministic
  inputs, the shipped ``*_output_0.pb``) under ``.cache/onnx-backend/real``.

Counts printed: total, pass without graphopt, pass with graphopt, and every
test that passes without graphopt but fails with it (that list must be empty;
the exit code is 1 otherwise).

    python benchmarks/backend_suite.py                      # all ~2000 tests, target onnx
    python benchmarks/backend_suite.py --limit 200 --target ort-cpu
    python benchmarks/backend_suite.py --filter 'conv|gemm' -v

Tests run in worker subprocesses (a crash or hang in one test is recorded as that
test's failure, and the worker is restarted). From Python (e.g. a pytest)::

    from benchmarks.backend_suite import discover, run_suite
    result = run_suite(discover(limit=100), target="onnx")
    assert not result.regressions

``optimize_model`` is the one place graphopt is called: swap it there.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".cache" / "onnx-backend"
KINDS = ("node", "simple", "pytorch-converted", "pytorch-operator", "real")
GENERATED_VERSION = 1


# =========================================================================== graphopt: the one call


def optimize_model(model: Any, target: str) -> Any:
    """ModelProto in, optimized ModelProto out. The only place graphopt is called."""
    import graphopt

    optimized, _report = graphopt.optimize(model, target=target)
    return optimized


# =========================================================================== discovery


@dataclasses.dataclass(frozen=True)
class BackendTest:
    kind: str
    name: str
    model_dir: str  # model.onnx and test_data_set_*/ inside
    rtol: float = 1e-3
    atol: float = 1e-7

    @property
    def id(self) -> str:
        return f"{self.kind}/{self.name}"


def _onnx_data_dir() -> Path:
    import onnx.backend.test

    return Path(onnx.backend.test.__file__).parent / "data"


def _ensure_node_data() -> Path:
    """The node tests on disk: the package's folder if shipped, else generated into .cache."""
    shipped = _onnx_data_dir() / "node"
    if shipped.is_dir() and any(shipped.iterdir()):
        return shipped
    import onnx

    out = CACHE / "node"
    stamp = out / ".generated.json"
    want = {"onnx": onnx.__version__, "version": GENERATED_VERSION}
    if stamp.exists() and json.loads(stamp.read_text()) == want:
        return out
    print(f"[backend_suite] onnx {onnx.__version__} ships no node test data; generating it into {out} ...",
          file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    import warnings

    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the case generators' numpy overflow warnings
        cases = load_model_tests(kind="node")
    tmp = out.with_name(f".node.tmp{os.getpid()}")
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)
    for case in cases:
        _write_case(tmp / case.name, case.model, case.data_sets, case.rtol, case.atol)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    stamp.write_text(json.dumps(want))
    print(f"[backend_suite] generated {len(cases)} node tests in {time.perf_counter() - t0:.1f} s",
          file=sys.stderr, flush=True)
    return out


def _serialize_value(value: Any, type_proto: Any, name: str) -> bytes:
    """As onnx.backend.test.cmd_tools.generate_data serializes a test input or output."""
    from onnx import TensorProto, numpy_helper

    kind = type_proto.WhichOneof("value")
    if kind == "map_type":
        return numpy_helper.from_dict(value, name).SerializeToString()
    if kind == "sequence_type":
        return numpy_helper.from_list(value, name).SerializeToString()
    if kind == "optional_type":
        return numpy_helper.from_optional(value, name).SerializeToString()
    if isinstance(value, TensorProto):
        return value.SerializeToString()
    return numpy_helper.from_array(value, name).SerializeToString()


def _write_case(case_dir: Path, model: Any, data_sets: Any, rtol: float, atol: float) -> None:
    case_dir.mkdir(parents=True)
    (case_dir / "model.onnx").write_bytes(model.SerializeToString())
    (case_dir / "data.json").write_text(json.dumps({"rtol": rtol, "atol": atol}))
    for i, (inputs, outputs) in enumerate(data_sets):
        ds = case_dir / f"test_data_set_{i}"
        ds.mkdir()
        for j, value in enumerate(inputs):
            vi = model.graph.input[j]
            (ds / f"input_{j}.pb").write_bytes(_serialize_value(value, vi.type, vi.name))
        for j, value in enumerate(outputs):
            vi = model.graph.output[j]
            (ds / f"output_{j}.pb").write_bytes(_serialize_value(value, vi.type, vi.name))


def _ensure_real_data(case_name: str, url: str, model_name: str) -> Path | None:
    """A 'real' test whose url names a light model in the package: prepared as onnx's runner does."""
    if not url.startswith("onnx/backend/test/data/light/"):
        return None  # would need a download
    import numpy as np
    import onnx
    from onnx import numpy_helper
    from onnx.backend.test.runner import Runner

    src = _onnx_data_dir() / "light" / Path(url).name
    if not src.exists():
        return None
    out = CACHE / "real" / case_name
    if (out / "model.onnx").exists():
        return out
    model = onnx.load(str(src))
    tmp = out.with_name(f".{case_name}.tmp{os.getpid()}")
    ds = tmp / "test_data_set_0"
    ds.mkdir(parents=True, exist_ok=True)
    (tmp / "model.onnx").write_bytes(model.SerializeToString())
    inits = {i.name for i in model.graph.initializer}
    feeds = {}
    graph_inputs = [x for x in model.graph.input if x.name not in inits]
    for n, x in enumerate(graph_inputs):
        value = Runner.generate_dummy_data(x, seed=0, name=model_name, random=False)
        feeds[x.name] = value
        (ds / f"input_{n}.pb").write_bytes(numpy_helper.from_array(value).SerializeToString())
    prefix = str(src)[: -len(".onnx")]
    expected = [f"{prefix}_output_{i}.pb" for i in range(len(model.graph.output))]
    if all(os.path.exists(e) for e in expected):
        for i, e in enumerate(expected):
            (ds / f"output_{i}.pb").write_bytes(Path(e).read_bytes())
    else:
        ref = onnx.reference.ReferenceEvaluator(model).run(None, feeds)
        for i, o in enumerate(ref):
            (ds / f"output_{i}.pb").write_bytes(numpy_helper.from_array(np.asarray(o)).SerializeToString())
    os.replace(tmp, out)
    return out


def discover(
    kinds: Iterable[str] = KINDS,
    *,
    pattern: str | None = None,
    limit: int | None = None,
) -> list[BackendTest]:
    """The suite's tests, sorted by id; ``limit`` takes an evenly spread deterministic sample."""
    from onnx.backend.test.loader import load_model_tests

    tests: list[BackendTest] = []
    for kind in kinds:
        if kind == "node":
            root = _ensure_node_data()
            for d in sorted(root.iterdir()):
                if d.is_dir() and (d / "model.onnx").exists():
                    tol = json.loads((d / "data.json").read_text()) if (d / "data.json").exists() else {}
                    tests.append(BackendTest("node", d.name, str(d), tol.get("rtol", 1e-3), tol.get("atol", 1e-7)))
            continue
        if not (_onnx_data_dir() / kind).is_dir():
            continue
        for case in load_model_tests(kind=kind):
            if case.model_dir:
                tests.append(BackendTest(kind, case.name, case.model_dir, case.rtol, case.atol))
            elif case.url:
                d = _ensure_real_data(case.name, case.url, case.model_name)
                if d is not None:
                    tests.append(BackendTest(kind, case.name, str(d), case.rtol, case.atol))
    tests.sort(key=lambda t: t.id)
    if pattern:
        rx = re.compile(pattern)
        tests = [t for t in tests if rx.search(t.id)]
    if limit is not None and limit < len(tests):
        step = len(tests) / limit
        tests = [tests[int(i * step)] for i in range(limit)]
    return tests


# =========================================================================== running one test


@dataclasses.dataclass
class Outcome:
    status: str  # "pass", "fail" (wrong outputs), "error" (ORT could not load/run), "graphopt-error", "crash", "timeout"
    message: str = ""
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return self.status == "pass"


def _load_value(path: str, type_proto: Any) -> Any:
    """As onnx.backend.test.runner.Runner._load_proto reads a test value."""
    import onnx
    from onnx import numpy_helper

    data = Path(path).read_bytes()
    if type_proto.HasField("sequence_type"):
        seq = onnx.SequenceProto()
        seq.ParseFromString(data)
        return numpy_helper.to_list(seq)
    if type_proto.HasField("optional_type"):
        opt = onnx.OptionalProto()
        opt.ParseFromString(data)
        return numpy_helper.to_optional(opt)
    tensor = onnx.TensorProto()
    tensor.ParseFromString(data)
    return numpy_helper.to_array(tensor)


def _first_line(e: BaseException) -> str:
    # drop onnxruntime's C++ source location and function signature from its messages
    text = re.sub(r"/onnxruntime_src/\S+:\d+ [^()]*\([^)]*\) ", "", str(e))
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return f"{type(e).__name__}: {lines[0][:300] if lines else ''}"


_ORT_LEVELS = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED", "all": "ORT_ENABLE_ALL"}


def run_test(test: BackendTest, optimize: Callable[[Any], Any] | None = None, *, ort_level: str = "all") -> Outcome:
    """Run one test in this process: load, optionally optimize, run in onnxruntime, compare."""
    import onnx
    import onnxruntime as ort
    from onnx.backend.test.runner import Runner

    t0 = time.perf_counter()
    model = onnx.load(os.path.join(test.model_dir, "model.onnx"))
    # graph inputs that are also initializers (IR < 4) get no test data, as in onnx's runner
    inits = {t.name for t in model.graph.initializer}
    original_inputs = [x for x in model.graph.input if x.name not in inits]
    original_outputs = list(model.graph.output)
    if optimize is not None:
        try:
            model = optimize(model)
        except Exception as e:  # noqa: BLE001 - recorded as the test's outcome
            return Outcome("graphopt-error", _first_line(e), time.perf_counter() - t0)
    so = ort.SessionOptions()
    so.log_severity_level = 4
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, _ORT_LEVELS[ort_level])
    try:
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001
        return Outcome("error", "load: " + _first_line(e), time.perf_counter() - t0)
    for ds in sorted(glob.glob(os.path.join(test.model_dir, "test_data_set*"))):
        n_in = len(glob.glob(os.path.join(ds, "input_*.pb")))
        n_out = len(glob.glob(os.path.join(ds, "output_*.pb")))
        try:
            inputs = [_load_value(os.path.join(ds, f"input_{i}.pb"), original_inputs[i].type) for i in range(n_in)]
            refs = [_load_value(os.path.join(ds, f"output_{i}.pb"), original_outputs[i].type) for i in range(n_out)]
        except Exception as e:  # noqa: BLE001 - unreadable test data: same for both runs
            return Outcome("error", "test data: " + _first_line(e), time.perf_counter() - t0)
        # input_j.pb belongs to the original model's j-th non-initializer graph input
        feeds = {original_inputs[i].name: inputs[i] for i in range(n_in)}
        try:
            outs = sess.run(None, feeds)
        except Exception as e:  # noqa: BLE001
            return Outcome("error", "run: " + _first_line(e), time.perf_counter() - t0)
        try:
            Runner.assert_similar_outputs(refs, list(outs), rtol=test.rtol, atol=test.atol)
        except Exception as e:  # noqa: BLE001 - AssertionError, TypeError
            msg = " ".join(str(e).split())[:300]
            return Outcome("fail", f"{type(e).__name__}: {msg}", time.perf_counter() - t0)
    return Outcome("pass", "", time.perf_counter() - t0)


# =========================================================================== worker subprocesses


def _worker_main(target: str | None, ort_level: str) -> int:
    """Read test JSON lines on stdin; for each write 'base' then 'opt' result lines on stdout."""
    import warnings

    warnings.simplefilter("ignore")
    out = sys.stdout
    sys.stdout = sys.stderr  # anything else printed must not corrupt the protocol
    opt = (lambda m: optimize_model(m, target)) if target else None
    for line in sys.stdin:
        if not line.strip():
            continue
        test = BackendTest(**json.loads(line))
        for mode, fn in (("base", None), ("opt", opt)):
            if mode == "opt" and fn is None:
                continue
            try:
                o = run_test(test, fn, ort_level=ort_level)
            except Exception as e:  # noqa: BLE001 - a harness problem, reported as such
                o = Outcome("error", "harness: " + _first_line(e) + " " + traceback.format_exc()[-300:])
            out.write(json.dumps({"id": test.id, "mode": mode, **dataclasses.asdict(o)}) + "\n")
            out.flush()
    return 0


def _worker_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _read_lines(proc: subprocess.Popen[str], lines: queue.Queue[str | None]) -> None:
    assert proc.stdout
    for line in proc.stdout:
        lines.put(line)
    lines.put(None)


def _write_tests(proc: subprocess.Popen[str], todo: list[BackendTest]) -> None:
    assert proc.stdin
    try:
        for t in todo:
            proc.stdin.write(json.dumps(dataclasses.asdict(t)) + "\n")
        proc.stdin.close()
    except (BrokenPipeError, OSError):
        pass


def _run_chunk(tests: list[BackendTest], target: str | None, ort_level: str, timeout: float,
               results: dict[tuple[str, str], Outcome], progress: Callable[[], None]) -> None:
    modes = ["base"] + (["opt"] if target else [])
    pending = list(tests)
    while pending:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--ort-level", ort_level]
        if target:
            cmd += ["--target", target]
        proc = subprocess.Popen(cmd, cwd=REPO, env=_worker_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True, bufsize=1)
        lines: queue.Queue[str | None] = queue.Queue()

        threading.Thread(target=_read_lines, args=(proc, lines), daemon=True).start()
        threading.Thread(target=_write_tests, args=(proc, list(pending)), daemon=True).start()
        died = None
        while pending:
            try:
                ln = lines.get(timeout=timeout)
            except queue.Empty:
                died = Outcome("timeout", f"no result within {timeout:.0f} s")
                proc.kill()
                break
            if ln is None:
                proc.wait()
                died = Outcome("crash", f"worker exited with code {proc.returncode}")
                break
            r = json.loads(ln)
            results[(r["id"], r["mode"])] = Outcome(r["status"], r["message"], r["seconds"])
            if r["mode"] == modes[-1]:
                pending.pop(0)
                progress()
        if died is not None and pending:
            t = pending.pop(0)  # the test in flight: its missing modes get the crash
            for m in modes:
                results.setdefault((t.id, m), died)
            progress()
        if proc.poll() is None:
            proc.kill()
        proc.wait()


@dataclasses.dataclass
class SuiteResult:
    target: str | None
    tests: list[BackendTest]
    base: dict[str, Outcome]
    opt: dict[str, Outcome]
    seconds: float

    @property
    def total(self) -> int:
        return len(self.tests)

    @property
    def passed_base(self) -> int:
        return sum(o.passed for o in self.base.values())

    @property
    def passed_opt(self) -> int:
        return sum(o.passed for o in self.opt.values())

    @property
    def regressions(self) -> list[tuple[str, Outcome]]:
        """Tests that pass without graphopt and fail with it."""
        return [(t.id, self.opt[t.id]) for t in self.tests
                if self.base[t.id].passed and t.id in self.opt and not self.opt[t.id].passed]

    @property
    def fixed(self) -> list[str]:
        return [t.id for t in self.tests if not self.base[t.id].passed and t.id in self.opt and self.opt[t.id].passed]

    def to_dict(self) -> dict[str, Any]:
        by_kind: dict[str, Counter[str]] = {}
        for t in self.tests:
            c = by_kind.setdefault(t.kind, Counter())
            c["total"] += 1
            c["pass_base"] += self.base[t.id].passed
            if t.id in self.opt:
                c["pass_opt"] += self.opt[t.id].passed
        return {
            "target": self.target, "total": self.total, "pass_without_graphopt": self.passed_base,
            "pass_with_graphopt": self.passed_opt if self.target else None, "seconds": round(self.seconds, 1),
            "by_kind": {k: dict(v) for k, v in by_kind.items()},
            "regressions": [{"test": tid, "status": o.status, "message": o.message} for tid, o in self.regressions],
            "fixed": self.fixed,
            "graphopt_errors": Counter(o.message for o in self.opt.values() if o.status == "graphopt-error").most_common(20),
            "tests": {t.id: {"base": dataclasses.asdict(self.base[t.id]),
                             **({"opt": dataclasses.asdict(self.opt[t.id])} if t.id in self.opt else {})} for t in self.tests},
        }


def run_suite(
    tests: list[BackendTest],
    target: str | None = "onnx",
    *,
    jobs: int = 1,
    ort_level: str = "all",
    timeout: float = 120.0,
    isolate: bool = True,
    progress: Callable[[int, int], None] | None = None,
) -> SuiteResult:
    """Run the tests without graphopt and (unless ``target`` is None) with it.

    ``isolate=False`` runs in this process (faster to start, no protection from crashes).
    """
    t0 = time.perf_counter()
    results: dict[tuple[str, str], Outcome] = {}
    done = [0]
    lock = threading.Lock()

    def tick() -> None:
        with lock:
            done[0] += 1
            if progress:
                progress(done[0], len(tests))

    if not isolate:
        opt = (lambda m: optimize_model(m, target)) if target else None
        for t in tests:
            results[(t.id, "base")] = run_test(t, None, ort_level=ort_level)
            if opt:
                results[(t.id, "opt")] = run_test(t, opt, ort_level=ort_level)
            tick()
    else:
        chunks = [tests[i::jobs] for i in range(max(1, jobs))]
        threads = [threading.Thread(target=_run_chunk, args=(c, target, ort_level, timeout, results, tick))
                   for c in chunks if c]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    base = {t.id: results[(t.id, "base")] for t in tests}
    opt_res = {t.id: results[(t.id, "opt")] for t in tests if (t.id, "opt") in results}
    return SuiteResult(target, tests, base, opt_res, time.perf_counter() - t0)


def _graphopt_problem() -> str | None:
    try:
        import graphopt

        graphopt.optimize  # noqa: B018
    except Exception as e:  # noqa: BLE001
        return _first_line(e)
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="onnx", help="graphopt target (onnx, ort-cpu, ort-cuda); 'none': onnxruntime only")
    ap.add_argument("--limit", type=int, help="run an evenly spread sample of N tests")
    ap.add_argument("--filter", help="regular expression on 'kind/test_name'")
    ap.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated (default {','.join(KINDS)})")
    ap.add_argument("--jobs", "-j", type=int, default=max(1, min(4, os.cpu_count() or 1)), help="worker processes")
    ap.add_argument("--ort-level", choices=sorted(_ORT_LEVELS), default="all", help="onnxruntime graph optimization level")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per test before it counts as hung")
    ap.add_argument("--json", type=Path, help="write every outcome here")
    ap.add_argument("-v", "--verbose", action="store_true", help="list every failing test")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    target = None if a.target == "none" else a.target
    if str(REPO) not in sys.path:  # run as a script: graphopt from this checkout
        sys.path.insert(0, str(REPO))
    if a.worker:
        return _worker_main(target, a.ort_level)

    if target:
        problem = _graphopt_problem()
        if problem:
            print(f"*** graphopt is not importable ({problem}): running onnxruntime only ***", file=sys.stderr)
            target = None
    tests = discover([k for k in a.kinds.split(",") if k], pattern=a.filter, limit=a.limit)
    print(f"[backend_suite] {len(tests)} tests, target {target or '(none)'}, {a.jobs} workers", file=sys.stderr, flush=True)
    last = [0.0]

    def progress(done: int, total: int) -> None:
        if time.monotonic() - last[0] > 10 or done == total:
            last[0] = time.monotonic()
            print(f"[backend_suite] {done}/{total}", file=sys.stderr, flush=True)

    res = run_suite(tests, target, jobs=a.jobs, ort_level=a.ort_level, timeout=a.timeout, progress=progress)
    d = res.to_dict()
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(d, indent=1))
    print(f"\nONNX backend suite through onnxruntime {_ort_version()} (graph optimization level {a.ort_level}), "
          f"{res.seconds:.0f} s")
    print(f"{'kind':20s} {'total':>6s} {'pass w/o':>9s} {'pass with':>10s}")
    for kind, c in d["by_kind"].items():
        print(f"{kind:20s} {c['total']:6d} {c['pass_base']:9d} {c.get('pass_opt', 0) if target else '-':>10}")
    print(f"{'all':20s} {res.total:6d} {res.passed_base:9d} {res.passed_opt if target else '-':>10}")
    if a.verbose:
        for t in tests:
            b = res.base[t.id]
            if not b.passed:
                print(f"  without graphopt {b.status:8s} {t.id}: {b.message}")
    if target:
        if d["graphopt_errors"]:
            print("\ngraphopt raised on some models (most common):")
            for msg, n in d["graphopt_errors"][:10]:
                print(f"  {n:5d}  {msg}")
        if res.fixed:
            print(f"\n{len(res.fixed)} tests fail without graphopt and pass with it: {', '.join(res.fixed[:20])}"
                  + (" ..." if len(res.fixed) > 20 else ""))
        regs = res.regressions
        print(f"\npass without graphopt, fail with graphopt (target {target}): {len(regs)}")
        for tid, o in regs:
            print(f"  {tid}: {o.status}: {o.message}")
        return 1 if regs else 0
    return 0


def _ort_version() -> str:
    import onnxruntime

    return onnxruntime.__version__


if __name__ == "__main__":
    sys.exit(main())
