"""SHA-1 and SHA-256 without loading OpenSSL on the command line's start-up.

`import hashlib` loads OpenSSL's libcrypto for its own constructors (~3 ms of a small model's
start-up, `python -X importtime`), yet the digests graphopt takes on every run (the pattern
cache's keys, the rule modules' names) are a few hundred bytes. CPython's builtin modules give
the same digests; where they are missing (another interpreter, a build without them) hashlib's
are used.
"""

from __future__ import annotations

from typing import Any

__all__ = ["sha1", "sha256"]


def _builtin(module: str, name: str) -> Any:
    try:
        return getattr(__import__(module), name)
    except ImportError:  # another interpreter, a build without it, or another CPython version
        return None


#: CPython 3.12 on has its SHA-2 family in _sha2; 3.10 and 3.11 in _sha256.
sha256: Any = _builtin("_sha2", "sha256") or _builtin("_sha256", "sha256")
sha1: Any = _builtin("_sha1", "sha1")
if sha256 is None or sha1 is None:  # pragma: no cover - depends on the interpreter's build
    import hashlib

    sha256, sha1 = sha256 or hashlib.sha256, sha1 or hashlib.sha1
