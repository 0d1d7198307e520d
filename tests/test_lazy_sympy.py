"""onnx-ir imports without sympy; sympy is imported when first used (graphopt/_lazy_sympy.py).

Each case runs in a fresh interpreter: in this one sympy is long imported."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _run(code: str, timeout: float = 120) -> list[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, cwd=REPO, timeout=timeout)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_onnx_ir_imports_without_sympy_until_a_symbolic_dim_computes() -> None:
    out = _run("""
        import sys
        import graphopt
        import onnx_ir as ir
        print("after import:", "sympy" in sys.modules, "onnx_ir._symbolic_shapes" in sys.modules)
        shape = ir.Shape(["N", 3, None])  # named and unknown dims need no sympy
        print("after shape:", "sympy" in sys.modules, shape)
        d = (ir.SymbolicDim("N") + 1) * 2
        print("arithmetic:", d.value, d.evaluate({"N": 3}), "sympy" in sys.modules)
        print("parsed:", ir.SymbolicDim("max(a, b) + 1").evaluate({"a": 2, "b": 5}))
    """)
    assert out == ["after import: False False", "after shape: False [N,3,None]", "arithmetic: 2*N + 2 8 True", "parsed: 6"]


def test_onnx_ir_keeps_its_loader_and_leaves_no_stand_in_behind() -> None:
    out = _run("""
        import sys
        import graphopt
        import onnx_ir
        print(type(onnx_ir.__loader__).__name__, type(onnx_ir.__spec__.loader).__name__)
        print([m for m in ("sympy", "onnx_ir._symbolic_shapes") if m in sys.modules])
        print([type(f).__name__ for f in sys.meta_path if "OnnxIr" in type(f).__name__])
    """)
    assert out == ["SourceFileLoader SourceFileLoader", "[]", "[]"]


def test_sympy_submodules_imported_first_as_torch_does() -> None:
    # torch.utils._sympy.printers: `import sympy` then `from sympy.printing.str import StrPrinter`.
    out = _run("""
        import graphopt
        import onnx_ir as ir
        import sympy
        from sympy.printing.str import StrPrinter
        print(StrPrinter().doprint(sympy.Symbol("n") ** 2), sympy.printing.str.StrPrinter is StrPrinter)
        print((ir.SymbolicDim("N") * 3).value)
    """)
    assert out == ["n**2 True", "3*N"]


def test_sympy_imported_before_graphopt_is_what_onnx_ir_uses() -> None:
    out = _run("""
        import sys
        import sympy
        import graphopt
        import onnx_ir
        print(sys.modules["onnx_ir._core"].sympy is sympy)
    """)
    assert out == ["True"]


def test_the_example_model_is_optimized_without_sympy(tmp_path: Path) -> None:
    # A CNN with a symbolic batch dim asks no question the recorded shapes cannot answer.
    model = tmp_path / "model.onnx"
    subprocess.run([sys.executable, str(REPO / "examples" / "make_example.py"), str(model)], check=True, capture_output=True)
    out = _run(f"""
        import sys
        from graphopt.cli import main
        sys.argv = ["graphopt", "optimize", {str(model)!r}, "-o", {str(tmp_path / "out.onnx")!r}, "-q"]
        try:
            main()
        except SystemExit as e:
            assert not e.code, e.code
        print("sympy imported:", "sympy" in sys.modules)
    """)
    assert (tmp_path / "out.onnx").is_file()
    assert out == ["sympy imported: False"]


def test_torch_compile_after_graphopt() -> None:
    # torch imports sympy after graphopt and onnx-ir; inductor's dynamic shapes compute with it.
    out = _run("""
        import graphopt
        import onnx_ir
        import torch

        def f(x):
            return torch.sin(x) * 2 + x.shape[0]

        compiled = torch.compile(f, dynamic=True)
        for n in (5, 7):
            x = torch.randn(n)
            print(torch.allclose(compiled(x), f(x)))
    """, timeout=600)
    assert out == ["True", "True"]
