"""JSON through the interpreter's C codec (`_json`), without the `json` package, which loads `re`
(and with it enum, functools, collections: as much as the interpreter's whole start) for the
pure-Python fallbacks a switch never uses. The same bytes as `json.dumps`/`json.loads` with the
arguments named below (tests/roots/test_switch.py compares them); what only the `json` package can say
(an error's position) is left to it: `loads` raises ValueError, json's own when there is one.
On a switch's path (roots/switch.py, core/proofs.py)."""

from __future__ import annotations

import _json

_CONSTANTS = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}


class _Context:
    """What _json.make_scanner reads from a json.JSONDecoder (json.loads' defaults)."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = _CONSTANTS.__getitem__


_scan = _json.make_scanner(_Context())  # type: ignore[arg-type]  # typeshed names the attributes' owner, not them
_SPACE = " \t\n\r"


def loads(text: str | bytes) -> object:
    """json.loads(text) for UTF-8 text; ValueError when it is not one JSON value."""
    if isinstance(text, bytes):
        text = text.decode("utf-8")  # UnicodeDecodeError is a ValueError
    s = text.strip(_SPACE)
    try:
        value, end = _scan(s, 0)
    except StopIteration:
        raise ValueError("not a JSON value") from None
    except SystemError:
        # The C scanner raises json.decoder.JSONDecodeError only when that module is loaded already
        # (3.11 looks it up in sys.modules); without it an error (an unterminated string) is this.
        raise ValueError("not a JSON value") from None
    if end != len(s):
        raise ValueError("extra data after the JSON value")
    return value


def _default(value: object) -> object:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _encoder(ascii: bool, key_sep: str, item_sep: str, sort_keys: bool):
    return _json.make_encoder({}, _default, _json.encode_basestring_ascii if ascii else _json.encode_basestring,
                              None, key_sep, item_sep, sort_keys, False, True)


_canonical = _encoder(False, ":", ",", True)
_line = _encoder(True, ": ", ", ", True)


def canonical(value: object) -> bytes:
    """json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    (keys.canonical_json)."""
    return "".join(_canonical(value, 0)).encode()


def line(value: object) -> str:
    """json.dumps(value, sort_keys=True)."""
    return "".join(_line(value, 0))


def indented(value: object, indent: int = 1) -> str:
    """json.dumps(value, indent=indent, sort_keys=True) (the C encoder of this Python has no indent).
    TypeError for what json would convert first (a key that is not a string, an object)."""
    out: list[str] = []
    _indent(value, " " * indent, 1, out)
    return "".join(out)


def _indent(value: object, step: str, level: int, out: list[str]) -> None:
    if isinstance(value, dict) and value:
        pad = step * level
        out.append("{")
        for i, k in enumerate(sorted(value)):
            if not isinstance(k, str):
                raise TypeError("keys must be str")  # json would convert numbers first
            _item(value[k], ("\n" if i == 0 else ",\n") + pad + _json.encode_basestring_ascii(k) + ": ", step, level,
                  out)
        out.append("\n" + step * (level - 1) + "}")
    elif isinstance(value, (list, tuple)) and value:
        pad = step * level
        out.append("[")
        for i, v in enumerate(value):
            _item(v, ("\n" if i == 0 else ",\n") + pad, step, level, out)
        out.append("\n" + step * (level - 1) + "]")
    else:
        _item(value, "", step, level - 1, out)


def _item(value: object, head: str, step: str, level: int, out: list[str]) -> None:
    """`head`, then `value` one level below `level`: the leaves most documents are made of are
    written here, without a call into the encoder or a level of recursion."""
    t = type(value)
    if type(value) is str:  # `t is str` does not narrow `value` for mypy
        out.append(head + _json.encode_basestring_ascii(value))
    elif value is None:
        out.append(head + "null")
    elif t is bool:
        out.append(head + ("true" if value else "false"))
    elif t is int:
        out.append(head + int.__repr__(value))
    elif (t is dict or t is list or t is tuple) and value or isinstance(value, (dict, list, tuple)) and value:
        out.append(head)
        _indent(value, step, level + 1, out)
    else:
        out.append(head + "".join(_line(value, 0)))
