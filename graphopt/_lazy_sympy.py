"""sympy, imported when first used instead of at `import onnx_ir`.

onnx-ir imports sympy as it is imported (`onnx_ir/_core.py`), although it needs it only for
arithmetic on symbolic dims (`SymbolicDim("N") + 1`). That costs a quarter of a second and
some 80,000 objects that every full garbage collection then walks, in runs that mostly never
need sympy: `graphopt optimize` on a CNN asks no symbolic question.

So `defer_sympy()`, run by `import graphopt`, hooks the import of onnx-ir: while onnx-ir's own
code runs, `import sympy` hands it a stand-in, and so does `from onnx_ir import
_symbolic_shapes` (that module reads `sympy.Max` when imported). A stand-in imports the real
module when one of its attributes is first read. Only onnx-ir keeps them: once it is
imported, `sys.modules` holds none, and everyone else imports sympy as usual. graphopt's own
code reads sympy through the stand-in `sympy` below.

(`importlib.util.LazyLoader` does not serve here: its module loads on the `__spec__` read of
every `import sympy`, and if it stayed in `sys.modules` unloaded, an `import sympy.printing`
before any use of sympy, as torch may do, would run `sympy.printing` twice.)
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from importlib.abc import Loader
    from importlib.machinery import ModuleSpec

__all__ = ["defer_sympy", "sympy"]

#: The modules onnx-ir gets stand-ins for while it is imported.
_DEFERRED = ("sympy", "onnx_ir._symbolic_shapes")


class _StandIn(types.ModuleType):
    """Stands for the module of its name, imported when an attribute is first read."""

    def __getattr__(self, name: str) -> Any:  # only for attributes not in this module's dict
        if sys.modules.get(self.__name__) is self:  # read during onnx-ir's import: import the real one now
            del sys.modules[self.__name__]
        real = importlib.import_module(self.__name__)
        self.__dict__.update(real.__dict__)  # later reads find them here directly
        return getattr(real, name)


#: sympy for graphopt's own code (graphopt.ir.symbolic): imported on first use.
sympy: Any = _StandIn("sympy")


class _LoaderWithStandIns:
    """onnx-ir's own loader, run with stand-ins for `_DEFERRED` in sys.modules. (The import
    system's protocols, not importlib.abc's classes: importing those costs 10 ms.)"""

    def __init__(self, loader: Loader) -> None:
        self.loader = loader

    def create_module(self, spec: ModuleSpec) -> types.ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        stand_ins = {name: _StandIn(name) for name in _DEFERRED if name not in sys.modules}
        sys.modules.update(stand_ins)
        try:
            self.loader.exec_module(module)
        finally:
            for name, stand_in in stand_ins.items():
                if sys.modules.get(name) is stand_in:
                    del sys.modules[name]
            module.__loader__ = self.loader  # the module keeps its real loader
            if module.__spec__ is not None:
                module.__spec__.loader = self.loader


class _OnnxIrHook:
    """A finder on sys.meta_path that hands onnx-ir's import to `_LoaderWithStandIns`, once."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
        if name != "onnx_ir":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)  # found as it would be without this hook
        if spec is not None and spec.loader is not None:
            spec.loader = _LoaderWithStandIns(spec.loader)  # type: ignore[assignment]
        return spec


def defer_sympy() -> None:
    """Let onnx-ir import without sympy, unless sympy or onnx-ir is imported already."""
    if "sympy" in sys.modules or "onnx_ir" in sys.modules or any(isinstance(f, _OnnxIrHook) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _OnnxIrHook())
