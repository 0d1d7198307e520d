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

sha1: Any
sha256: Any

try:
    from _sha1 import sha1
except ImportError:  # pragma: no cover - depends on the interpreter's build
    from hashlib import sha1
try:
    from _sha2 import sha256  # CPython 3.12 on
except ImportError:
    try:
        from _sha256 import sha256  # CPython 3.10, 3.11
    except ImportError:  # pragma: no cover - depends on the interpreter's build
        from hashlib import sha256
