"""The embedded Python front end: a rule written as a decorated Python function.

    from graphopt.pattern.python import rule, op, native, replace, attr, Const, Optional

    @rule(benefit=3)
    def FoldConvBatchNorm(x, w: Const, b: Optional[Const], g: Const, beta: Const, mean: Const, var: Const):
        '''Conv followed by inference BatchNormalization -> one Conv with folded weights'''
        conv = op.Conv(x, w, b)
        bn = op.BatchNormalization(conv, g, beta, mean, var).attrs(epsilon=attr("eps"), training_mode=0)
        f = native.FoldBN(w, b, g, beta, mean, var, attr("eps"))
        return replace(bn, op.Conv(x, f.w, f.b).copy_attrs(conv))

`@rule` runs the function once, at decoration, with one symbolic value per
parameter, and turns what it built into the same `ir.Rule` that the equivalent
`.pdll` text parses to. The parameters are the pattern's values; their
annotations are the value constraints (`Const`, `Rank[4]`, `DType["f16", "bf16"]`,
`OneUse`, `Scalar`, a tuple of several, `Optional[...]` for an operand that may be
missing). Whatever is reachable from the op passed first to `replace(...)` is the
match; the other ops and the native calls reached from the replacement are the
rewrite. A native call with `.require()` is a constraint.

Local variable names become the `let` names (so printed rules read like the
source); an op or rewrite value without one gets a generated name only where the
rule needs a name for it.
"""

from __future__ import annotations

import inspect
import linecache
from collections.abc import Callable
from typing import Any

from graphopt.pattern.ir import Rule, SourceLoc
from graphopt.pattern.pdll import is_name
from graphopt.pattern.python_compile import RuleCompiler
from graphopt.pattern.python_symbols import (
    ANY,
    Const,
    DType,
    OneUse,
    Optional,
    Rank,
    Scalar,
    _active,
    _annotation,
    _fail,
    _Recording,
    _Value,
    alt,
    attr,
    by_opset,
    first_of,
    native,
    op,
    opset_guard,
    replace,
    type_of,
    wildcard,
)

__all__ = [
    "rule",
    "op",
    "native",
    "replace",
    "attr",
    "alt",
    "wildcard",
    "type_of",
    "by_opset",
    "first_of",
    "ANY",
    "Const",
    "Rank",
    "DType",
    "OneUse",
    "Scalar",
    "Optional",
    "RULES",
]

#: Every rule defined with `@rule`, in definition order.
RULES: list[Rule] = []


# ------------------------------------------------------------------ the decorator


def rule(
    fn: Callable[..., Any] | None = None, *, name: str | None = None, benefit: int | None = None, where: tuple[str, ...] | str = ()
) -> Any:
    """`@rule` or `@rule(benefit=3, name="Other", where="opset >= 20")`: turn the function into an `ir.Rule`.

    `where` takes the text of one or more `where` guards of the .pdll form.
    Returns the Rule (the function itself is not kept) and appends it to RULES."""
    if fn is None:
        return lambda f: rule(f, name=name, benefit=benefit, where=where)
    compiled = _compile(fn, name or fn.__name__, benefit, (where,) if isinstance(where, str) else tuple(where))
    RULES.append(compiled)
    return compiled


def _def_loc(fn: Callable[..., Any]) -> SourceLoc:
    """The `def` line (co_firstlineno is the first decorator's line)."""
    code = fn.__code__
    lines = linecache.getlines(code.co_filename)
    for i in range(code.co_firstlineno - 1, min(len(lines), code.co_firstlineno + 100)):
        stripped = lines[i].lstrip()
        if stripped.startswith(("def ", "async def ")):
            return SourceLoc(code.co_filename, i + 1, len(lines[i]) - len(stripped) + 1)
    return SourceLoc(code.co_filename, code.co_firstlineno, 1)


def _compile(fn: Callable[..., Any], name: str, benefit: int | None, where: tuple[str, ...]) -> Rule:
    loc = _def_loc(fn)
    def_site = (loc.file, loc.line)
    guards = tuple(opset_guard(text, def_site) for text in where)
    if not is_name(name):
        raise _fail(def_site, f"'{name}' cannot be a rule name (an identifier that is not a reserved word of the pattern language)")
    if benefit is not None and (not isinstance(benefit, int) or isinstance(benefit, bool) or benefit < 0):
        raise _fail(def_site, f"benefit must be a non-negative int, got {benefit!r}")
    try:
        annotations = inspect.get_annotations(fn, eval_str=True)
    except Exception as e:  # a string annotation that does not evaluate
        raise _fail(def_site, f"cannot evaluate the annotations of {name}: {e}") from None
    recording = _Recording(fn.__code__)
    _active.append(recording)
    try:
        params: list[_Value] = []
        for p in inspect.signature(fn).parameters.values():
            if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
                raise _fail(def_site, f"parameter '{p.name}': rule parameters must be plain positional parameters")
            if not is_name(p.name):
                raise _fail(def_site, f"parameter '{p.name}' cannot be a value name (it is a reserved word of the pattern language)")
            constraints, optional = _annotation(annotations.get(p.name, inspect.Parameter.empty), def_site, p.name)
            params.append(_Value(p.name, constraints, optional))
        result = fn(*params)
    finally:
        _active.pop()
    local_vars = recording.local_vars()
    doc = (inspect.getdoc(fn) or "").strip().split("\n")[0].strip()
    return RuleCompiler(name, benefit, doc, loc, params, recording, local_vars, guards).compile(result)


