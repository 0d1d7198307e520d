"""The objects a Python rule function builds (`op.Conv(x, w)`, `native.FoldBN(...)`,
`alt(...)`, `attr(...)`, parameters): a small symbolic graph, recorded in creation
order, that `graphopt.pattern.python_compile` turns into pattern IR."""

from __future__ import annotations

import inspect
import itertools
import linecache
import math
import sys
from collections.abc import Callable

from graphopt.errors import PatternError
from graphopt.pattern.ir import MISSING, OpsetGuard, SourceLoc, ValueConstraint, parse_op_key
from graphopt.pattern.pdll import check_value_constraint, parse_pdll

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
    """What one run of a rule function created, in creation order, and the run's frame
    (its final locals name the let-bound ops: `conv = op.Conv(...)` gives `let conv`)."""

    def __init__(self, code: object = None) -> None:
        self.created: list[_Sym] = []
        self.required: list[_NativeCall] = []
        self.code = code
        self.frame: object = None

    def note_frame(self) -> None:
        # The rule function's own frame, found once while it runs; it keeps its locals after returning.
        frame = sys._getframe(2)
        while self.frame is None and frame is not None:
            if frame.f_code is self.code:
                self.frame = frame
            frame = frame.f_back  # type: ignore[assignment]

    def local_vars(self) -> dict[str, object]:
        return dict(getattr(self.frame, "f_locals", {}))


_active: list[_Recording] = []


class _Sym:
    """Base of everything a rule function builds: remembers where and in which order."""

    def __init__(self) -> None:
        self.site = _user_site()
        self.seq = next(_seq)
        if not _active:
            raise _fail(self.site, f"{self.describe()} can only be used inside a @rule function")
        _active[-1].created.append(self)
        _active[-1].note_frame()

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
    """A reference to a name bound by the match: an alternative's tag, or (`type_of`) an op type."""

    def __init__(self, name: str, kind: str = "tag") -> None:
        self.name, self.kind = name, kind

    def describe(self) -> str:
        return f"{'tag' if self.kind == 'tag' else 'op type'} '{self.name}'"


class _OpNode(_Sym):
    """`op.Conv(x, w)`: a matched op or, in the replacement, an op to build."""

    def __init__(
        self, domain: str, op_type: str, operands: tuple[object, ...], alternatives: tuple[tuple[str, str], ...] = (), type_bind: str | None = None
    ) -> None:
        self.domain, self.op_type, self.operands = domain, op_type, operands
        self.alternatives, self.type_bind = alternatives, type_bind  # match: op<kind: A|B>
        self.type_ref: str | None = None  # rewrite: op<kind>(...)
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
        copy = _OpNode(self.domain, self.op_type, self.operands, self.alternatives, self.type_bind)
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
    def __init__(
        self, domain: str, op_type: str, alternatives: tuple[tuple[str, str], ...] = (), type_bind: str | None = None, type_ref: str | None = None
    ) -> None:
        self.domain, self.op_type, self.alternatives, self.type_bind, self.type_ref = domain, op_type, alternatives, type_bind, type_ref

    def __call__(self, *operands: object, **kwargs: object) -> _OpNode:
        if kwargs:
            raise _fail(_user_site(), f"op.{self.op_type}(...) takes operands only; set attributes with .attrs({', '.join(kwargs)}=...)")
        node = _OpNode(self.domain, self.op_type, operands, self.alternatives, self.type_bind)
        node.type_ref = self.type_ref
        return node


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

    def one_of(self, *types: str, bind: str | None = None) -> _OpFactory:
        """`op.one_of("Relu", "Tanh", bind="kind")(x)`: any of these op types (`op<kind: Relu|Tanh>`);
        a type of another domain is written "graphopt.FusedConv". `type_of("kind")` refers to the one that matched."""
        if not types:
            raise _fail(_user_site(), "op.one_of() needs at least one op type")
        (domain, op_type), *others = [parse_op_key(t) for t in types]
        return _OpFactory(domain, op_type, tuple(others), bind)

    def same_as(self, kind: _NameRef) -> _OpFactory:
        """`op.same_as(type_of("kind"))(y)`: in the rewrite, an op of the type that matched (`op<kind>(y)`)."""
        if not isinstance(kind, _NameRef) or kind.kind != "type":
            raise _fail(_user_site(), 'op.same_as() takes type_of("name") of an op.one_of(..., bind="name")')
        return _OpFactory("", "", type_ref=kind.name)


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


def type_of(name: str) -> _NameRef:
    """The op type bound by `op.one_of(..., bind=name)`: an attribute value, or `op.same_as(type_of(name))`."""
    return _NameRef(name, "type")


class _OpsetPick(_Sym):
    """`by_opset({">= 20": a, "< 20": b})`: the first value whose range holds the model's opset."""

    def __init__(self, branches: tuple[tuple[OpsetGuard, object], ...]) -> None:
        self.branches = branches
        super().__init__()

    def describe(self) -> str:
        return "by_opset(...)"

    def values(self) -> list[object]:
        return [value for _, value in self.branches]


class _FirstPick(_Sym):
    """`first_of(a, b)`: `first { a, b }`, the first replacement the target can run."""

    def __init__(self, options: tuple[object, ...]) -> None:
        self.options = options
        super().__init__()

    def describe(self) -> str:
        return "first_of(...)"

    def values(self) -> list[object]:
        return list(self.options)


def first_of(*options: object) -> _FirstPick:
    """The first of these replacements that the target can run (`first { a, b }` in .pdll)."""
    if not options:
        raise _fail(_user_site(), "first_of() needs at least one replacement")
    return _FirstPick(options)


def by_opset(branches: dict[str, object]) -> _OpsetPick:
    """`alt opset { >= 20: a, < 20: b }` of the .pdll form, keyed by `">= 20"` / `"opset(com.microsoft) < 2"`."""
    site = _user_site()
    return _OpsetPick(tuple((opset_guard(key if "opset" in key else f"opset {key}", site), value) for key, value in branches.items()))


def opset_guard(text: str, site: tuple[str, int]) -> OpsetGuard:
    """`"opset >= 20"` as an OpsetGuard, parsed by the .pdll front end itself."""
    try:
        (r,) = parse_pdll(f"Pattern G {{ let r = op<A>(); where {text}; replace r with r; }}").rules
    except (PatternError, ValueError):
        raise _fail(site, f"'{text}' is not an opset guard like 'opset >= 20' or 'opset(com.microsoft) < 2'") from None
    return r.guards[0]


def wildcard(*constraints: ValueConstraint, optional: bool = False) -> _Wildcard:
    """An operand that matches any value (`_`), optionally constrained or missing (`_?`)."""
    return _Wildcard(constraints, optional)


ANY = wildcard()




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


