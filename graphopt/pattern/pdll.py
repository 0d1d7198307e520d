"""The `.pdll` text front end: pattern text -> `graphopt.pattern.ir.PatternFile`.

lark parses the text with the grammar in `pdll.lark` (syntax errors are reported
here); `graphopt.pattern.pdll_build` then walks the tree in source order, resolving
names and building the frozen IR. Every problem, syntactic or semantic, is a
`PatternError` whose first line is `file:line:col: message`, followed by the source
line and a caret. Parsed files are cached on disk, keyed by their bytes.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from graphopt._digest import sha256
from graphopt.errors import PatternError
from graphopt.pattern.ir import PatternFile
from graphopt.pattern.pdll_source import RESERVED_WORDS, check_value_constraint, format_error, is_name

if TYPE_CHECKING:  # imported where text is parsed: rules read from the cache need no lark
    from lark import Lark
    from lark.exceptions import UnexpectedInput

__all__ = ["parse_pdll", "parse_pdll_file", "RESERVED_WORDS", "is_name", "check_value_constraint", "format_error"]

# Readable names for the grammar's regex terminals in "expected ..." lists.
_TERMINAL_WORDS = {"NAME": "a name", "INT": "an integer", "FLOAT": "a number", "STRING": "a string", "$END": "end of file"}


def parse_pdll(text: str, path: str = "<string>") -> PatternFile:
    """Parse pattern text; `path` is only used in locations and error messages."""
    from lark.exceptions import UnexpectedInput

    from graphopt.pattern.pdll_build import FileBuilder

    try:
        tree = _parser().parse(text)
    except UnexpectedInput as e:
        raise _syntax_error(e, text, path) from None
    try:
        return FileBuilder(text, path).build(tree)
    except RecursionError:
        raise PatternError(f"{path}:1:1: pattern is nested too deeply") from None


def parse_pdll_file(path: str | Path) -> PatternFile:
    """Read and parse one .pdll file (UTF-8)."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise PatternError(f"{p}: cannot read pattern file: {e.strerror or e}") from None
    try:
        text = data.decode("utf-8-sig")  # a BOM is not part of the text
    except UnicodeDecodeError as e:
        before = data[: e.start]
        line = before.count(b"\n") + 1
        col = len(before) - (before.rfind(b"\n") + 1) + 1
        raise PatternError(f"{p}:{line}:{col}: file is not valid UTF-8") from None
    cached = _cache_path(data, p)
    if cached is not None:
        try:
            with open(cached, "rb") as f:
                return pickle.load(f)
        except (OSError, pickle.PickleError, EOFError, AttributeError, ImportError):
            pass  # no cache yet, or one from another version: parse
    result = parse_pdll(text, str(p))
    if cached is not None:
        for rule in result.rules:  # cached properties: computed once, kept in the pickle
            rule.effective_benefit  # noqa: B018
            rule.first_choice  # noqa: B018
        _write_cache(cached, result)
    return result


# ------------------------------------------------------------------ cache
# Parsing the library costs more than optimizing a small model (building the LALR
# tables alone takes ~0.1 s), so a parsed file is kept, keyed by its bytes, its path
# (locations name it) and the front end's own sources (_FRONT_END_FILES); set
# GRAPHOPT_NO_CACHE=1 to turn this off.


def _cache_path(data: bytes, path: Path) -> Path | None:
    front_end = _front_end_digest()
    if os.environ.get("GRAPHOPT_NO_CACHE") == "1" or front_end is None:
        return None
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "graphopt" / "patterns"
    key = sha256()
    for part in (front_end, str(path).encode(), data):
        key.update(len(part).to_bytes(8, "little"))
        key.update(part)
    return root / f"{key.hexdigest()[:32]}.pickle"


def _write_cache(target: Path, result: PatternFile) -> None:
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=target.parent, suffix=".tmp")
    except OSError:
        return  # a read-only home is no reason to fail: parse next time
    try:
        with os.fdopen(fd, "wb") as f:
            pickle.dump(result, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(temp, target)  # whole or not at all: a reader never sees half a file
    except (OSError, pickle.PicklingError):
        Path(temp).unlink(missing_ok=True)


# The files whose text decides what a .pdll file parses to: the grammar, the front end
# that builds the IR and the IR's classes (the pickles hold their instances). Any edit to
# one of them is a new cache key, so a stale parse is never read back.
_FRONT_END_FILES = ("pdll.lark", "pdll.py", "pdll_build.py", "pdll_rule_build.py", "pdll_source.py", "ir.py")


@lru_cache(maxsize=1)
def _front_end_digest() -> bytes | None:
    key = sha256()
    for name in _FRONT_END_FILES:
        try:
            source = Path(__file__).with_name(name).read_bytes()
        except OSError:
            return None  # installed without its sources (bytecode only): no key to trust, no cache
        key.update(name.encode() + len(source).to_bytes(8, "little") + source)
    return key.digest()


# ------------------------------------------------------------------ syntax


@lru_cache(maxsize=1)
def _grammar_text() -> str:
    return Path(__file__).with_name("pdll.lark").read_text(encoding="utf-8")


@lru_cache(maxsize=1)
def _parser() -> Lark:
    from lark import Lark

    return Lark(_grammar_text(), parser="lalr", propagate_positions=True, maybe_placeholders=True)


def _describe_terminal(name: str) -> str:
    if name in _TERMINAL_WORDS:
        return _TERMINAL_WORDS[name]
    try:
        pattern = _parser().get_terminal(name).pattern
    except KeyError:
        return name
    return f"'{pattern.value}'" if pattern.type == "str" else name


def _syntax_error(e: UnexpectedInput, text: str, path: str) -> PatternError:
    from lark.exceptions import UnexpectedCharacters, UnexpectedToken

    if isinstance(e, UnexpectedToken):
        token = e.token
        if token.type == "$END":
            # lark borrows the position of the last token; point just after it.
            line = token.end_line or 1
            col = token.end_column or 1
            what = "end of file"
        else:
            line, col, what = token.line or 1, token.column or 1, f"'{token.value}'"
        try:  # exact for this state; e.expected is LALR's merged (looser) lookahead set
            accepted = e.interactive_parser.accepts() if e.interactive_parser is not None else e.expected
        except Exception:  # best effort only: the error itself is what matters
            accepted = e.expected
        expected = sorted({_describe_terminal(t) for t in accepted})
    elif isinstance(e, UnexpectedCharacters):
        line, col = e.line, e.column
        what = f"character {e.char!r}"
        expected = sorted({_describe_terminal(t) for t in (e.allowed or ())})
    else:  # other lark input errors carry a position too
        line, col, what, expected = getattr(e, "line", 1) or 1, getattr(e, "column", 1) or 1, "input", []
    message = f"syntax error: unexpected {what}"
    if expected:
        shown = expected if len(expected) <= 8 else expected[:8] + ["..."]
        message += f" (expected {', '.join(shown)})"
    return format_error(path, text, line, col, message)


