"""The one check for every name that enters the store: recipe, engine and variant names, profiles, pins,
generation numbers, keys, store path names and the names of signing keys.

A name that passes is safe as one path component under any store directory: it matches its
pattern in full (`re.fullmatch`, so a trailing newline is refused), it has no separator, it does
not start with a dot (no `.`/`..`, no hidden temporary), and it is short enough that everything
the store derives from it (`<p>-<N>-link`, `.<p>.tmp-<pid>`, `<name>.partial`, a trash name) stays
under NAME_MAX (255). Anything else is a UsageError (exit 2) with one line, before anything is
written.
"""

from __future__ import annotations

import re

from llmgw_store.base.errors import UsageError
from llmgw_store.base.text import printable, shown  # noqa: F401  (re-exported: one escaping for every line shown)
from llmgw_store.core.keys import KEY_RE, NAME_RE, STORE_NAME_MAX, STORE_NAME_RE
from llmgw_store.core.locations import split_generation_link

USER_NAME_MAX = 100
GENERATION_MAX = 10**9
SIGNING_KEY_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def check(kind: str, text: object, pattern: re.Pattern[str] = NAME_RE, max_len: int = USER_NAME_MAX,
          rule: str = "use [a-z0-9._-], starting with a letter or digit") -> str:
    """`text` if it is a valid `kind` name, else UsageError naming the rule it breaks."""
    if not isinstance(text, str) or not pattern.fullmatch(text):
        raise UsageError(f"{shown(text)} is not a {kind} name: {rule}")
    if len(text) > max_len:
        raise UsageError(f"{shown(text)} is not a {kind} name: at most {max_len} characters")
    return text


def check_engine(text: str) -> str:
    check("store", text)
    if ".." in text:
        raise UsageError(f"{shown(text)} is not a store name: no '..'")
    return text


VARIANT_MAX = 32  # a variant is part of every store path name: cu128, cpu, rocm6.3 ...


def check_variant(text: str) -> str:
    return check("variant", text, max_len=VARIANT_MAX)


def check_profile(text: str) -> str:
    check("profile", text)
    if split_generation_link(text) is not None:
        raise UsageError(f"{shown(text)} is not a profile name: it would look like one of its generations (-N-link)")
    return text


def check_pin(text: str) -> str:
    return check("pin", text)


def check_generation(number: object) -> int:
    if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= GENERATION_MAX:
        raise UsageError(f"{shown(number)} is not a generation number: a whole number from 1 to {GENERATION_MAX}")
    return number


def check_key(text: str) -> str:
    return check("key", text, KEY_RE, 32, "32 characters of Nix's base-32 alphabet")


def check_store_name(text: str) -> str:
    """`<key>-<engine>-<version>-<variant>`, as keys.path_name makes it."""
    check("store path", text, STORE_NAME_RE, STORE_NAME_MAX, "<key>-<name>, [a-z0-9._-]")
    return text


def check_signing_key_name(text: str) -> str:
    return check("signing key", text, SIGNING_KEY_RE, USER_NAME_MAX, "use [A-Za-z0-9._-], starting with a letter or digit")


KEY_LENGTHS = (32, 64)  # an ed25519 public key; a secret key (seed + public key), as Nix writes them


def inline_key(value: str) -> tuple[str, bytes] | None:
    """(name, bytes) when `value` is a signing key written inline: `name:base64` of a public or a
    secret key's length, else None. The one rule for a key argument (flag, variable or config
    file): such a value is a key and never a path, whatever files exist (about half of all keys
    hold a `/`, and anyone may make `builder:AB/CD=` in a shared directory)."""
    import base64

    name, sep, b64 = value.strip().partition(":")
    if not sep or not name or len(b64) > 128:
        return None
    try:
        raw = base64.b64decode(b64, validate=True)
    except ValueError:
        return None
    return (name, raw) if len(raw) in KEY_LENGTHS else None

