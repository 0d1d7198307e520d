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
import itertools
import linecache
import math
import sys
from collections.abc import Callable
from typing import Any

from graphopt.errors import PatternError
from graphopt.pattern.ir import (
    MISSING,
    AltMatch,
    AttrMatch,
    Build,
    Call,
    Expr,
    Let,
    Lit,
    MatchNode,
    NativeDecl,
    OpMatch,
    Ref,
    Replace,
    Rule,
    SourceLoc,
    Statement,
    ValueConstraint,
    Var,
)
from graphopt.pattern.pdll import check_value_constraint, is_name

__all__ = [
    "rule",
    "op",
    "native",
    "replace",
    "attr",
    "alt",
    "wildcard",
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

_seq = itertools.count()


# ------------------------------------------------------------------ locations


def _user_site() -> tuple[str, int]:
    """File and line of the nearest caller outside this module."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__") == __name__:
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return "<unknown>", 1
    return frame.f_code.co_filename, frame.f_lineno


def _site_loc(file: str, line: int) -> SourceLoc:
    text = linecache.getline(file, line)
    col = len(text) - len(text.lstrip()) + 1 if text.strip() else 1
    return SourceLoc(file, line, col)


def _fail(site: tuple[str, int], message: str) -> PatternError:
    return PatternError(f"{_site_loc(*site)}: {message}")


# ------------------------------------------------------------------ constraints


class _Parametric:
    """`Rank[4]`, `DType["f16", "bf16"]`: a value constraint that takes arguments."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def __getitem__(self, args: object) -> ValueConstraint:
        return self(*(args if isinstance(args, tuple) else (args,)))

    def __call__(self, *items: object) -> ValueConstraint:
        """`DType("f16")`: the same as `DType["f16"]`, for linters that read subscripts in annotations as types."""
        problem = check_value_constraint(self.kind, items)
        if problem:
            raise _fail(_user_site(), problem)
        return ValueConstraint(self.kind, items)

    def __repr__(self) -> str:
        return self.kind


class _OptionalOf:
    def __init__(self, constraints: tuple[object, ...]) -> None:
        self.constraints = constraints


class _OptionalMarker:
    """`Optional` (any value, may be missing) or `Optional[Const]` / `Optional[Const, Rank[4]]`."""

    def __getitem__(self, item: object) -> _OptionalOf:
        return _OptionalOf(item if isinstance(item, tuple) else (item,))

    def __repr__(self) -> str:
        return "Optional"


Const = ValueConstraint("Const")
OneUse = ValueConstraint("OneUse")
Scalar = ValueConstraint("Scalar")
Rank = _Parametric("Rank")
DType = _Parametric("DType")
Optional = _OptionalMarker()


def _annotation(ann: object, site: tuple[str, int], param: str) -> tuple[tuple[ValueConstraint, ...], bool]:
    """(constraints, optional) from a parameter annotation."""
    if ann is inspect.Parameter.empty:
        return (), False
    items = list(ann) if isinstance(ann, (tuple, list)) else [ann]
    constraints: list[ValueConstraint] = []
    optional = False
    while items:
        item = items.pop(0)
        if item is Optional:
            optional = True
        elif isinstance(item, _OptionalOf):
            optional = True
            items[:0] = list(item.constraints)
        elif isinstance(item, ValueConstraint):
            problem = check_value_constraint(item.kind, item.args)
            if problem:
                raise _fail(site, f"parameter '{param}': {problem}")
            if item not in constraints:
                constraints.append(item)
        else:
            raise _fail(
                site,
                f"parameter '{param}': annotation {item!r} is not a value constraint (use Const, Rank[n], DType[...], OneUse, Scalar, Optional[...])",
            )
    return tuple(constraints), optional


# ------------------------------------------------------------------ symbolic objects


class _Recording:
    """What one run of a rule function created, in creation order."""

    def __init__(self) -> None:
        self.created: list[_Sym] = []
        self.required: list[_NativeCall] = []


_active: list[_Recording] = []


class _Sym:
    """Base of everything a rule function builds: remembers where and in which order."""

    def __init__(self) -> None:
        self.site = _user_site()
        self.seq = next(_seq)
        if not _active:
            raise _fail(self.site, f"{self.describe()} can only be used inside a @rule function")
        _active[-1].created.append(self)

    def describe(self) -> str:
        return type(self).__name__


class _Value(_Sym):
    """A parameter of the rule function: a pattern value."""

    def __init__(self, name: str, constraints: tuple[ValueConstraint, ...], optional: bool) -> None:
        self.name, self.constraints, self.optional = name, constraints, optional
        super().__init__()

    def describe(self) -> str:
        return f"parameter '{self.name}'"


class _Wildcard:
    """`wildcard()`: any value, bound to no name. Usable outside rule functions."""

    def __init__(self, constraints: tuple[ValueConstraint, ...], optional: bool) -> None:
        self.constraints, self.optional = constraints, optional

    def describe(self) -> str:
        return "wildcard()"


class _AttrSpec:
    """`attr("eps")`, `attr("eps", default=1e-5)`, `attr(equals=1, default=1)`."""

    def __init__(self, bind: str | None, equals: object, default: object) -> None:
        self.bind, self.equals, self.default = bind, equals, default

    def describe(self) -> str:
        return f"attr({self.bind!r})"


class _NameRef:
    """A reference to a name bound by the match (an alternative's tag)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def describe(self) -> str:
        return f"tag '{self.name}'"


class _OpNode(_Sym):
    """`op.Conv(x, w)`: a matched op or, in the replacement, an op to build."""

    def __init__(self, domain: str, op_type: str, operands: tuple[object, ...]) -> None:
        self.domain, self.op_type, self.operands = domain, op_type, operands
        self.attr_items: list[tuple[str, object]] = []
        self.copy_from: object = None
        self.output = 0
        self.num_outputs = 1
        self.indexed = False  # replaced by a copy through [i]
        self.is_shared = False
        super().__init__()

    def describe(self) -> str:
        return f"op.{self.op_type}(...)" if not self.domain else f"op[{self.domain!r}].{self.op_type}(...)"

    def attrs(self, **values: object) -> _OpNode:
        """Attributes: literals, or `attr(...)` to bind / default them (match), or any rewrite value (build)."""
        for key, value in values.items():
            if any(k == key for k, _ in self.attr_items):
                raise _fail(_user_site(), f"attribute '{key}' of {self.describe()} is given twice")
            self.attr_items.append((key, value))
        return self

    def shared(self) -> _OpNode:
        """An interior op that may have users outside the match (`shared op<...>`)."""
        self.is_shared = True
        return self

    def copy_attrs(self, matched: _OpNode) -> _OpNode:
        """Copy every attribute of a matched op (`{..conv}`); set further ones with .attrs()."""
        self.copy_from = matched
        return self

    def outputs(self, n: int) -> _OpNode:
        """The number of outputs of an op built by the rewrite (`op<T, n>`)."""
        self.num_outputs = n
        return self

    def __getitem__(self, index: int) -> _OpNode:
        """Output `index` of a matched op (`op<Split>(x)[1]`)."""
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            raise _fail(_user_site(), f"output index of {self.describe()} must be a non-negative int, got {index!r}")
        copy = _OpNode(self.domain, self.op_type, self.operands)
        copy.attr_items, copy.copy_from, copy.num_outputs = list(self.attr_items), self.copy_from, self.num_outputs
        copy.is_shared = self.is_shared
        copy.output = index
        self.indexed = True
        return copy


class _Alt(_Sym):
    def __init__(self, tag_var: str, branches: tuple[tuple[str, object], ...]) -> None:
        self.tag_var, self.branches = tag_var, branches
        super().__init__()

    def describe(self) -> str:
        return f"alt({self.tag_var!r}, ...)"

    @property
    def tag(self) -> _NameRef:
        """The tag of the branch that matched, for the rewrite and native helpers."""
        return _NameRef(self.tag_var)


class _NativeCall(_Sym):
    """`native.Name(args)`: a native Rewrite call, or with `.require()` a native Constraint."""

    def __init__(self, name: str, args: tuple[object, ...]) -> None:
        self.name, self.args = name, args
        self.required = False
        super().__init__()

    def describe(self) -> str:
        return f"native.{self.name}(...)"

    def require(self) -> _NativeCall:
        """Make this call a constraint of the rule: the match holds only if it returns true."""
        if not self.required:
            self.required = True
            _active[-1].required.append(self)
        return self

    def __getattr__(self, field: str) -> _Field:
        if field.startswith("_"):
            raise AttributeError(field)
        return _Field(self, field)

    def __getitem__(self, field: str) -> _Field:
        return _Field(self, field)


class _Field:
    """`f.w`: one named result of a native Rewrite."""

    def __init__(self, call: _NativeCall, field: str) -> None:
        self.call, self.field = call, field

    def describe(self) -> str:
        return f"{self.call.describe()}.{self.field}"


class _Replace(_Sym):
    def __init__(self, target: object, values: tuple[object, ...]) -> None:
        self.target, self.values = target, values
        super().__init__()

    def describe(self) -> str:
        return "replace(...)"


class _OpFactory:
    def __init__(self, domain: str, op_type: str) -> None:
        self.domain, self.op_type = domain, op_type

    def __call__(self, *operands: object, **kwargs: object) -> _OpNode:
        if kwargs:
            raise _fail(_user_site(), f"op.{self.op_type}(...) takes operands only; set attributes with .attrs({', '.join(kwargs)}=...)")
        return _OpNode(self.domain, self.op_type, operands)


class _OpNamespace:
    """`op.Conv(...)`, `op["com.microsoft"].FusedConv(...)`."""

    def __init__(self, domain: str = "") -> None:
        self._domain = domain

    def __getattr__(self, op_type: str) -> _OpFactory:
        if op_type.startswith("__"):
            raise AttributeError(op_type)
        return _OpFactory(self._domain, op_type)

    def __getitem__(self, domain: str) -> _OpNamespace:
        return _OpNamespace(domain)


class _NativeNamespace:
    """`native.FoldBN(...)`: calls of helpers registered with @native_rewrite / @native_constraint."""

    def __getattr__(self, name: str) -> Callable[..., _NativeCall]:
        if name.startswith("__"):
            raise AttributeError(name)

        def call(*args: object, **kwargs: object) -> _NativeCall:
            if kwargs:
                raise _fail(_user_site(), f"native.{name}(...) takes positional arguments only")
            return _NativeCall(name, args)

        return call


op = _OpNamespace()
native = _NativeNamespace()


def replace(target: _OpNode, *values: object) -> _Replace:
    """`replace(root, value)`, or one value per output: `replace(root, a, b)` / `replace(root, (a, b))`."""
    if len(values) == 1 and isinstance(values[0], tuple):
        values = values[0]
    return _Replace(target, values)


def attr(bind: str | None = None, *, equals: object = MISSING, default: object = MISSING) -> _AttrSpec:
    """An attribute in `.attrs(...)`: bind it to a name, and/or give a default.

    In the rewrite, `attr("eps")` refers to the bound value."""
    return _AttrSpec(bind, equals, default)


def alt(tag: str, branches: dict[str, object] | None = None, /, **more: object) -> _Alt:
    """Tagged alternatives: `alt("kind", mm=op.MatMul(a, b), gemm=op.Gemm(a, b, wildcard(optional=True)))`.

    `.tag` on the result refers to the tag of the branch that matched."""
    items = dict(branches or {})
    items.update(more)
    return _Alt(tag, tuple(items.items()))


def wildcard(*constraints: ValueConstraint, optional: bool = False) -> _Wildcard:
    """An operand that matches any value (`_`), optionally constrained or missing (`_?`)."""
    return _Wildcard(constraints, optional)


ANY = wildcard()


# ------------------------------------------------------------------ the decorator


def rule(fn: Callable[..., Any] | None = None, *, name: str | None = None, benefit: int | None = None) -> Any:
    """`@rule` or `@rule(benefit=3, name="Other")`: turn the function into an `ir.Rule`.

    Returns the Rule (the function itself is not kept) and appends it to RULES."""
    if fn is None:
        return lambda f: rule(f, name=name, benefit=benefit)
    compiled = _compile(fn, name or fn.__name__, benefit)
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


def _run(fn: Callable[..., Any], args: list[_Value]) -> tuple[object, dict[str, object]]:
    """Call fn and capture its locals as it returns (for readable let names)."""
    captured: dict[str, object] = {}
    code = fn.__code__

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "return" and frame.f_code is code:
            captured.update(frame.f_locals)

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        result = fn(*args)
    finally:
        sys.setprofile(previous)
    return result, captured


def _compile(fn: Callable[..., Any], name: str, benefit: int | None) -> Rule:
    loc = _def_loc(fn)
    def_site = (loc.file, loc.line)
    if not is_name(name):
        raise _fail(def_site, f"'{name}' cannot be a rule name (an identifier that is not a reserved word of the pattern language)")
    if benefit is not None and (not isinstance(benefit, int) or isinstance(benefit, bool) or benefit < 0):
        raise _fail(def_site, f"benefit must be a non-negative int, got {benefit!r}")
    try:
        annotations = inspect.get_annotations(fn, eval_str=True)
    except Exception as e:  # a string annotation that does not evaluate
        raise _fail(def_site, f"cannot evaluate the annotations of {name}: {e}") from None
    recording = _Recording()
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
        result, local_vars = _run(fn, params)
    finally:
        _active.pop()
    doc = (inspect.getdoc(fn) or "").strip().split("\n")[0].strip()
    return _Compiler(name, benefit, doc, loc, params, recording, local_vars).compile(result)


# ------------------------------------------------------------------ symbolic graph -> IR


def _literal(value: object, site: tuple[str, int]) -> object:
    """A Python value as a pattern literal (tuples become lists, like the text form's [..])."""
    if isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _fail(site, f"{value} cannot be a pattern literal (only finite numbers)")
        return value
    if isinstance(value, (list, tuple)):
        return [_literal(v, site) for v in value]
    raise _fail(site, f"{_describe(value)} cannot be used here")


def _is_literal(value: object) -> bool:
    if isinstance(value, (bool, int, float, str)):
        return True
    return isinstance(value, (list, tuple)) and all(_is_literal(v) for v in value)


def _describe(value: object) -> str:
    if isinstance(value, (_Sym, _Wildcard, _AttrSpec, _NameRef, _Field)):
        return value.describe()
    return f"{type(value).__name__} {value!r}"


class _Compiler:
    """Splits what the function built into match and rewrite halves and builds the Rule."""

    def __init__(
        self,
        name: str,
        benefit: int | None,
        doc: str,
        loc: SourceLoc,
        params: list[_Value],
        recording: _Recording,
        local_vars: dict[str, object],
    ) -> None:
        self.name, self.benefit, self.doc, self.loc = name, benefit, doc, loc
        self.def_site = (loc.file, loc.line)
        self.params = params
        self.recording = recording
        # First local name of each op / native call, in the function's variable order.
        self.local_names: dict[int, str] = {}
        for var, value in local_vars.items():
            if isinstance(value, (_OpNode, _NativeCall)) and id(value) not in self.local_names and is_name(var):
                self.local_names[id(value)] = var
        self.taken: set[str] = set(local_vars) | {p.name for p in params}
        self.owner: dict[str, str] = {p.name: f"parameter '{p.name}'" for p in params}  # match-level names

        self.match_ops: dict[int, _OpNode] = {}
        self.match_uses: dict[int, int] = {}
        self.used_params: set[str] = set()
        self.attr_binds: set[str] = set()
        self.tags: set[str] = set()
        self.needs_name: set[int] = set()  # match ops the rewrite or a constraint refers to
        self.rw_nodes: dict[int, _OpNode | _NativeCall] = {}
        self.rw_uses: dict[int, int] = {}
        self.rw_fields: set[int] = set()
        self.rw_walking: set[int] = set()  # on the current walk path, to catch cycles

    def error(self, site: tuple[str, int], message: str) -> PatternError:
        return _fail(site, f"rule {self.name}: {message}")

    def claim(self, name: str, what: str, site: tuple[str, int]) -> None:
        """Reserve a match-level name; two different things may not share one."""
        if name in self.owner and self.owner[name] != what:
            raise self.error(site, f"'{name}' names both {self.owner[name]} and {what}")
        self.owner[name] = what
        self.taken.add(name)

    def fresh(self, base: str) -> str:
        base = base.lower() if is_name(base.lower()) else "t"
        name, i = base, 1
        while name in self.taken or not is_name(name):
            i += 1
            name = f"{base}{i}"
        self.taken.add(name)
        return name

    # -------------------------------------------------------------- analysis
    def compile(self, result: object) -> Rule:
        if isinstance(result, _Replace):
            replaces = [result]
        elif isinstance(result, (list, tuple)) and result and all(isinstance(r, _Replace) for r in result):
            replaces = list(result)
        else:
            raise self.error(self.def_site, f"the function must return replace(...) or a list of them, not {_describe(result)}")
        root = replaces[0].target
        if not isinstance(root, _OpNode):
            raise self.error(replaces[0].site, f"replace() needs an op as its first argument, not {_describe(root)}")
        self.walk_match(root, replaces[0].site)
        for r in replaces:
            if not (isinstance(r.target, _OpNode) and id(r.target) in self.match_ops):
                raise self.error(r.site, f"only a matched op can be replaced, not {_describe(r.target)}")
            self.needs_name.add(id(r.target))
            if not r.values:
                raise self.error(r.site, "replace() needs at least one value")
            for v in r.values:
                self.walk_rewrite(v, r.site)
        for call in self.recording.required:
            for a in call.args:
                self.check_constraint_arg(a, call.site)
        self.check_everything_used(replaces)
        for p in self.params:
            if p.name not in self.used_params:
                raise self.error(self.def_site, f"parameter '{p.name}' is not used by the match")
        self.assign_names(root)
        return self.build(root, replaces)

    def walk_match(self, node: object, site: tuple[str, int]) -> None:
        if isinstance(node, _Value):
            self.used_params.add(node.name)
        elif isinstance(node, _Wildcard):
            pass
        elif isinstance(node, _OpNode):
            self.match_uses[id(node)] = self.match_uses.get(id(node), 0) + 1
            if id(node) in self.match_ops:
                return
            self.match_ops[id(node)] = node
            if node.copy_from is not None or node.num_outputs != 1:
                raise self.error(node.site, f"{node.describe()} is matched; copy_attrs() and outputs() are for ops the rewrite builds")
            for key, value in node.attr_items:
                self.check_match_attr(node, key, value)
            for i, operand in enumerate(node.operands):
                if not isinstance(operand, (_Value, _Wildcard, _OpNode, _Alt)):
                    raise self.error(
                        node.site,
                        f"operand {i + 1} of matched {node.describe()} is {_describe(operand)}; a match takes parameters, ops, alt(...) or wildcard()",
                    )
                self.walk_match(operand, node.site)
        elif isinstance(node, _Alt):
            self.match_uses[id(node)] = self.match_uses.get(id(node), 0) + 1
            if id(node) in self.match_ops:
                return
            self.match_ops[id(node)] = node  # type: ignore[assignment]
            if node.tag_var in self.tags:
                raise self.error(node.site, f"two alternatives use the tag '{node.tag_var}'")
            if not is_name(node.tag_var):
                raise self.error(node.site, f"'{node.tag_var}' cannot be an alternative tag")
            self.tags.add(node.tag_var)
            self.claim(node.tag_var, f"the tag of {node.describe()}", node.site)
            if not node.branches:
                raise self.error(node.site, "alt() needs at least one branch")
            for label, branch in node.branches:
                if not is_name(label):
                    raise self.error(node.site, f"'{label}' cannot be a branch label")
                if not isinstance(branch, (_Value, _Wildcard, _OpNode, _Alt)):
                    raise self.error(node.site, f"branch '{label}' is {_describe(branch)}; a branch is a parameter, an op or alt(...)")
                self.walk_match(branch, node.site)
        else:
            raise self.error(site, f"{_describe(node)} cannot be matched")

    def check_match_attr(self, node: _OpNode, key: str, value: object) -> None:
        if isinstance(value, _AttrSpec):
            if (value.bind is None) == (value.equals is MISSING):
                raise self.error(node.site, f"attribute '{key}': give attr() either a name to bind or equals=, not both or neither")
            if value.bind is not None:
                if not is_name(value.bind):
                    raise self.error(node.site, f"attribute '{key}': '{value.bind}' cannot be a binding name")
                self.claim(value.bind, "an attribute binding", node.site)
                self.attr_binds.add(value.bind)
            for lit in (value.equals, value.default):
                if lit is not MISSING:
                    _literal(lit, node.site)
        elif not _is_literal(value):
            raise self.error(node.site, f"attribute '{key}' of matched {node.describe()} is {_describe(value)}; use a literal or attr(...)")
        else:
            _literal(value, node.site)

    def walk_rewrite(self, obj: object, site: tuple[str, int], operand: bool = False) -> None:
        if isinstance(obj, _OpNode) and id(obj) in self.match_ops:
            if obj.indexed:
                raise self.error(site, f"{obj.describe()} was indexed with [i]; refer to the indexed op instead")
            self.needs_name.add(id(obj))
        elif isinstance(obj, (_OpNode, _NativeCall)):
            if isinstance(obj, _NativeCall) and obj.required:
                raise self.error(obj.site, f"{obj.describe()} is a constraint (.require()) and cannot also be used in the rewrite")
            if id(obj) in self.rw_walking:
                raise self.error(obj.site, f"{obj.describe()} refers to itself (through .attrs())")
            self.rw_uses[id(obj)] = self.rw_uses.get(id(obj), 0) + 1
            if id(obj) in self.rw_nodes:
                return
            self.rw_nodes[id(obj)] = obj
            self.rw_walking.add(id(obj))
            if isinstance(obj, _NativeCall):
                if not is_name(obj.name):
                    raise self.error(obj.site, f"'{obj.name}' cannot be a native name")
                for a in obj.args:
                    self.walk_rewrite(a, obj.site)
            else:
                self.walk_build(obj)
            self.rw_walking.discard(id(obj))
        elif isinstance(obj, _Field):
            if not is_name(obj.field):
                raise self.error(site, f"'{obj.field}' cannot be a result name")
            self.rw_fields.add(id(obj.call))
            self.walk_rewrite(obj.call, site)
        else:
            self.check_name_ref(obj, site, operand)

    def walk_build(self, obj: _OpNode) -> None:
        if obj.output != 0:
            raise self.error(obj.site, f"{obj.describe()}[{obj.output}]: output selection is only for matched ops")
        if not isinstance(obj.num_outputs, int) or isinstance(obj.num_outputs, bool) or obj.num_outputs < 1:
            raise self.error(obj.site, f"outputs() takes a positive int, got {obj.num_outputs!r}")
        for o in obj.operands:
            self.walk_rewrite(o, obj.site, operand=True)
        for _, v in obj.attr_items:
            self.walk_rewrite(v, obj.site)
        if obj.copy_from is not None:
            src = obj.copy_from
            if not (isinstance(src, _OpNode) and id(src) in self.match_ops):
                raise self.error(obj.site, f"copy_attrs() takes a matched op, not {_describe(src)}")
            self.needs_name.add(id(src))

    def check_constraint_arg(self, obj: object, site: tuple[str, int]) -> None:
        if isinstance(obj, _OpNode):
            if id(obj) not in self.match_ops:
                raise self.error(site, f"constraint argument {obj.describe()} is not part of the match")
            self.needs_name.add(id(obj))
        elif isinstance(obj, (_NativeCall, _Field)):
            raise self.error(site, f"constraint arguments must be parameters, matched ops, attr(...) or literals, not {_describe(obj)}")
        else:
            self.check_name_ref(obj, site, operand=False)

    def check_name_ref(self, obj: object, site: tuple[str, int], operand: bool) -> None:
        """A leaf of the rewrite or a constraint: a bound name, a literal, or (operand) None."""
        if isinstance(obj, _Value):
            if obj.name not in self.used_params:
                raise self.error(site, f"parameter '{obj.name}' is not bound by the match")
        elif isinstance(obj, _AttrSpec):
            if obj.bind is None or obj.equals is not MISSING or obj.default is not MISSING:
                raise self.error(site, 'in the rewrite, attr() takes just the name of a bound attribute: attr("eps")')
            if obj.bind not in self.attr_binds:
                raise self.error(site, f"attribute binding '{obj.bind}' is not bound by the match")
        elif isinstance(obj, _NameRef):
            if obj.name not in self.tags:
                raise self.error(site, f"tag '{obj.name}' is not bound by the match")
        elif obj is None:
            if not operand:
                raise self.error(site, "None (an omitted input) can only be an operand of an op the rewrite builds")
        elif _is_literal(obj):
            _literal(obj, site)
        else:
            raise self.error(site, f"{_describe(obj)} cannot be used in the rewrite")

    def check_everything_used(self, replaces: list[_Replace]) -> None:
        returned = {id(r) for r in replaces}
        for sym in self.recording.created:  # first: a forgotten replace explains the unused ops it holds
            if isinstance(sym, _Replace) and id(sym) not in returned:
                raise self.error(sym.site, "this replace(...) is not returned by the function")
        for sym in self.recording.created:
            if isinstance(sym, _OpNode) and not sym.indexed and id(sym) not in self.match_ops and id(sym) not in self.rw_nodes:
                raise self.error(sym.site, f"{sym.describe()} is neither connected to the root nor used by the replacement")
            if isinstance(sym, _Alt) and id(sym) not in self.match_ops:
                raise self.error(sym.site, f"{sym.describe()} is not connected to the root")
            if isinstance(sym, _NativeCall) and not sym.required and id(sym) not in self.rw_nodes:
                raise self.error(
                    sym.site, f"{sym.describe()} is not used: call .require() to make it a constraint, or use its result in the replacement"
                )

    def assign_names(self, root: _OpNode) -> None:
        self.op_names: dict[int, str] = {}
        for key, node in self.match_ops.items():
            if isinstance(node, _OpNode) and key in self.local_names:
                self.claim(self.local_names[key], f"matched {node.describe()}", node.site)
                self.op_names[key] = self.local_names[key]
        self.let_names: dict[int, str] = {}
        for key, value in self.rw_nodes.items():
            if key in self.local_names:
                self.claim(self.local_names[key], f"rewrite value {value.describe()}", value.site)
                self.let_names[key] = self.local_names[key]
        # Generated names only where the rule needs one, in creation order for stable output.
        for key, node in sorted(self.match_ops.items(), key=lambda kv: kv[1].seq):
            if isinstance(node, _OpNode) and key not in self.op_names:
                if node is root or key in self.needs_name or self.match_uses[key] > 1:
                    self.op_names[key] = self.fresh(node.op_type)
        for key, value in sorted(self.rw_nodes.items(), key=lambda kv: kv[1].seq):
            if key not in self.let_names and (self.rw_uses[key] > 1 or key in self.rw_fields):
                self.let_names[key] = self.fresh(value.op_type if isinstance(value, _OpNode) else value.name)

    # -------------------------------------------------------------- IR
    def build(self, root: _OpNode, replaces: list[_Replace]) -> Rule:
        self.match_ir: dict[int, MatchNode] = {}
        root_ir = self.to_match(root)
        assert isinstance(root_ir, OpMatch)
        body = self.statements(replaces)
        constraints = tuple(Call(c.name, tuple(self.to_expr(a) for a in c.args)) for c in self.recording.required)  # type: ignore[misc]
        natives: dict[tuple[str, str], NativeDecl] = {}
        for sym in self.recording.created:
            if isinstance(sym, _NativeCall):
                kind = "Constraint" if sym.required else "Rewrite"
                natives.setdefault((kind, sym.name), NativeDecl(kind, sym.name, loc=_site_loc(*sym.site)))
        return Rule(self.name, root_ir, body, constraints, self.benefit, self.doc, self.loc, tuple(natives.values()))

    def to_match(self, node: object) -> MatchNode:
        if isinstance(node, _Value):
            return Var(node.name, node.constraints, node.optional)
        if isinstance(node, _Wildcard):
            return Var("_", node.constraints, node.optional)
        if id(node) in self.match_ir:
            return self.match_ir[id(node)]
        if isinstance(node, _Alt):
            out: MatchNode = AltMatch(node.tag_var, tuple((label, self.to_match(b)) for label, b in node.branches))
        else:
            assert isinstance(node, _OpNode)
            attrs = tuple(self.attr_match(k, v, node.site) for k, v in node.attr_items)
            operands = tuple(self.to_match(o) for o in node.operands)
            out = OpMatch(node.op_type, node.domain, operands, attrs, self.op_names.get(id(node)), node.output, shared=node.is_shared)
        self.match_ir[id(node)] = out
        return out

    @staticmethod
    def attr_match(key: str, value: object, site: tuple[str, int]) -> AttrMatch:
        if isinstance(value, _AttrSpec):
            equals = value.equals if value.equals is MISSING else _literal(value.equals, site)
            default = value.default if value.default is MISSING else _literal(value.default, site)
            return AttrMatch(key, equals, value.bind, default)
        return AttrMatch(key, _literal(value, site))

    def statements(self, replaces: list[_Replace]) -> tuple[Statement, ...]:
        """Lets and replaces in creation order, each let after the lets it uses."""
        body: list[Statement] = []
        emitted: set[int] = set()

        def emit(node: _OpNode | _NativeCall) -> None:
            if id(node) in emitted:
                return
            emitted.add(id(node))
            for dep in self.let_deps(node):
                emit(dep)
            body.append(Let(self.let_names[id(node)], self.value_expr(node)))

        def emit_for(value: object) -> None:
            target = value.call if isinstance(value, _Field) else value
            if isinstance(target, (_OpNode, _NativeCall)) and id(target) in self.let_names:
                emit(target)
            else:
                for dep in self.let_deps(target):
                    emit(dep)

        items: list[_Sym] = [n for k, n in self.rw_nodes.items() if k in self.let_names] + list(replaces)
        for item in sorted(items, key=lambda s: s.seq):
            if isinstance(item, _Replace):
                for v in item.values:
                    emit_for(v)
                body.append(Replace(self.op_names[id(item.target)], tuple(self.to_expr(v) for v in item.values)))  # type: ignore[misc]
            else:
                emit(item)  # type: ignore[arg-type]
        return tuple(body)

    def let_deps(self, obj: object) -> list[_OpNode | _NativeCall]:
        """The let-bound rewrite values that `obj`'s expression refers to directly."""
        if isinstance(obj, _Field):
            return self.let_deps(obj.call)
        if not (isinstance(obj, (_OpNode, _NativeCall)) and id(obj) in self.rw_nodes):
            return []
        children = list(obj.args) if isinstance(obj, _NativeCall) else list(obj.operands) + [v for _, v in obj.attr_items]
        deps: list[_OpNode | _NativeCall] = []
        for c in children:
            target = c.call if isinstance(c, _Field) else c
            if isinstance(target, (_OpNode, _NativeCall)) and id(target) in self.let_names:
                deps.append(target)
            else:
                deps += self.let_deps(target)
        return deps

    def value_expr(self, obj: _OpNode | _NativeCall) -> Expr:
        """The full expression of a rewrite value (not a reference to its let)."""
        if isinstance(obj, _NativeCall):
            return Call(obj.name, tuple(self.to_expr(a) for a in obj.args))  # type: ignore[misc]
        copy_from = self.op_names[id(obj.copy_from)] if obj.copy_from is not None else None
        return Build(
            obj.op_type,
            obj.domain,
            tuple(self.to_expr(o) for o in obj.operands),
            tuple((k, self.to_expr(v)) for k, v in obj.attr_items),  # type: ignore[misc]
            copy_from,
            obj.num_outputs,
        )

    def to_expr(self, obj: object) -> Expr | None:
        if isinstance(obj, _OpNode) and id(obj) in self.match_ops:
            return Ref(self.op_names[id(obj)])
        if isinstance(obj, (_OpNode, _NativeCall)):
            return Ref(self.let_names[id(obj)]) if id(obj) in self.let_names else self.value_expr(obj)
        if isinstance(obj, _Field):
            return Ref(self.let_names[id(obj.call)], obj.field)
        if isinstance(obj, _Value):
            return Ref(obj.name)
        if isinstance(obj, _AttrSpec):
            return Ref(obj.bind)  # type: ignore[arg-type]  # checked in check_name_ref
        if isinstance(obj, _NameRef):
            return Ref(obj.name)
        if obj is None:
            return None
        return Lit(_literal(obj, self.def_site))
