"""The one TOML loader for files a person writes and the store reads: the config file and recipes.

    loads(data, limits) -> dict      the document, or TomlRefused saying why not

tomllib recurses once per bracket (thousands of `[` are a RecursionError) and takes time
quadratic in the parts of one dotted key (60 KiB of `a.a.a...` is 15 s). So before tomllib sees a
byte, one linear pass (`shape_problem`) refuses a file larger than `max_bytes`, nested deeper than
`max_depth` brackets, or with a key of more than `max_parts` dotted parts; what passes is parsed
in time linear in its size, and the parsed document is checked again (dotted keys and table
headers nest without brackets).

Invariants:
- The pass lexes what changes where a key or a bracket is: basic strings (`\\` escapes), literal
  strings, both multi-line kinds (a closing run of 3 to 5 quotes ends one, its first 1 or 2 quotes
  being content), and comments. What it cannot lex as TOML (a string cut by a newline or by the end
  of the file, a run of 6 quotes closing a multi-line string) is refused, never guessed past: the
  pass and tomllib must never disagree on where a string ends, or a hostile key hides in "a string".
- Outside strings, dots are counted over one run of key characters (letters, digits, `_`, `-`,
  quoted parts, blanks); anything else (`=`, a newline, a bracket, a comma) ends the run. A float
  or a date in a value has at most one dot, so no honest file comes near the bound.
"""

from __future__ import annotations

from dataclasses import dataclass


class TomlRefused(ValueError):
    """The text is not one the store parses: too large, too deep, a key of too many parts, not
    UTF-8, or not valid TOML. str() is one line, for the caller to prefix with the file's name;
    `syntax` is tomllib's own message when the parser refused the text (else None)."""

    def __init__(self, message: str, syntax: str | None = None):
        super().__init__(message)
        self.syntax = syntax


@dataclass(frozen=True)
class Limits:
    max_bytes: int
    max_depth: int
    max_parts: int
    what: str  # "the config file", "the recipe": how a message names the file


def loads(data: bytes, limits: Limits) -> dict:
    """The document `data` holds, parsed by tomllib once `shape_problem` finds nothing and checked
    by `depth_problem` after; TomlRefused otherwise (a RecursionError included: never a traceback)."""
    import tomllib

    if len(data) > limits.max_bytes:
        raise TomlRefused(f"{limits.what} is larger than {limits.max_bytes // 1024} KiB")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise TomlRefused(f"{limits.what} is not UTF-8 text") from None
    if (why := shape_problem(text, limits)) is not None:
        raise TomlRefused(why)
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TomlRefused(f"not valid TOML: {exc}", syntax=str(exc)) from None
    except RecursionError:
        raise TomlRefused(f"{limits.what} is nested deeper than {limits.max_depth} levels") from None
    if (why := depth_problem(doc, limits)) is not None:
        raise TomlRefused(why)
    return doc


_KEY_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_- \t")


def shape_problem(text: str, limits: Limits) -> str | None:
    """Why `text` is nested deeper than the limits allow, or cannot be lexed (see the module's
    invariants); None when tomllib may parse it. One pass, linear in the text."""
    depth = parts = 0
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == '"' or c == "'":
            end = _string_end(text, i)
            if end is None:
                return f"not valid TOML: a string at character {i} is not closed where TOML closes it"
            i = end
            continue  # a quoted key part: the run of key parts goes on
        if c == "#":
            i = text.find("\n", i)
            if i < 0:
                break
            continue
        if c in "[{":
            depth += 1
            if depth > limits.max_depth:
                return f"{limits.what} is nested deeper than {limits.max_depth} levels"
        elif c in "]}":
            depth = max(0, depth - 1)
        if c == ".":
            parts += 1
            if parts >= limits.max_parts:
                return f"{limits.what} has a dotted key of more than {limits.max_parts} parts"
        elif c not in _KEY_CHARS:
            parts = 0
        i += 1
    return None


def _string_end(text: str, i: int) -> int | None:
    """The index just past the string that starts at `i` (a quote), as TOML ends it; None when
    TOML would not end it there (a newline in a one-line string, the end of the text, a closing
    run of more than 5 quotes)."""
    q = text[i]
    n = len(text)
    if text.startswith(q * 3, i):
        j = i + 3
        while j < n:
            c = text[j]
            if c == "\\" and q == '"':
                j += 2
                continue
            if c == q:
                run = 1
                while j + run < n and text[j + run] == q:
                    run += 1
                if run >= 3:
                    return j + run if run <= 5 else None
                j += run
                continue
            j += 1
        return None
    j = i + 1
    while j < n:
        c = text[j]
        if c == "\\" and q == '"':
            j += 2
            continue
        if c == q:
            return j + 1
        if c == "\n":
            return None
        j += 1
    return None


def depth_problem(doc: dict, limits: Limits) -> str | None:
    """Why the parsed document is nested deeper than `max_depth` (table headers and dotted keys
    make depth without a bracket), or None. Iterative, and it stops at the bound: the caller may
    then show a value (repr recurses)."""
    stack: list[tuple[object, int]] = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > limits.max_depth:
            return f"{limits.what} is nested deeper than {limits.max_depth} levels"
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        stack.extend((v, depth + 1) for v in children if isinstance(v, (dict, list)))
    return None
