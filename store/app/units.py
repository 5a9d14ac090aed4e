"""Durations (`30d`) and sizes (`50G`) as users write them on the command line, and the one way sizes
are written in text output (IEC: `1.5 GiB`, `12.0 MiB`, `512 B`).

Sizes on input:
    50G  50GiB  50g  50gib     50 × 2^30 bytes (a bare letter is the binary unit, as in df -h and du)
    50GB  50gb                 50 × 10^9 bytes (the SI unit, as disk vendors count)
    4096  4096B                bytes
with K, M, G, T, P alike; at most MAX_SIZE. Durations: a number and s, m, h, d or w, at most
MAX_DURATION_S (a century): anything longer is a typo, and would overflow a date.
"""

from __future__ import annotations

import re

from llmgw_store.base.errors import UsageError
from llmgw_store.base.text import human_size, shown  # noqa: F401  (human_size: here for its users; defined without re)

_DURATION = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_POWER = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5}
MAX_DURATION_S = 100 * 366 * 86400
MAX_SIZE = (1 << 63) - 1
_SIZE_RE = re.compile(r"\s*([0-9]{1,20}(?:\.[0-9]{1,9})?)\s*(?:([kmgtp])(ib|b)?|(b))?\s*", re.IGNORECASE)


def parse_duration(text: str) -> float:
    """`45s`, `90m`, `12h`, `30d`, `2w` → seconds (at most a century). An empty value is an error,
    never "no limit" (`--keep-dead-for ''` must not mean no grace at all)."""
    if not text.strip():
        raise UsageError("an empty value is not a duration: give one (a number and s, m, h, d or w, e.g. 30d), "
                         "or leave the option out")
    m = re.fullmatch(r"\s*([0-9]{1,15}(?:\.[0-9]{1,9})?)\s*([smhdw])\s*", text.lower())
    if not m:
        raise UsageError(f"{shown(text)} is not a duration: use a number and s, m, h, d or w (e.g. 30d)")
    seconds = float(m.group(1)) * _DURATION[m.group(2)]
    if seconds > MAX_DURATION_S:
        raise UsageError(f"{shown(text)} is too long a duration: at most 100 years (36500d)")
    return seconds


def parse_size(text: str) -> int:
    """`500M`, `50G` or `50GiB` (powers of 1024), `50GB` (powers of 1000), `4096` (bytes) → bytes. An
    empty value is an error, never "no limit"."""
    if not text.strip():
        raise UsageError("an empty value is not a size: give one (e.g. 50G), or leave the option out")
    m = _SIZE_RE.fullmatch(text)
    if not m:
        raise UsageError(f"{shown(text)} is not a size: use a number with K, M, G, T or P "
                         "(50G or 50GiB: 50 × 2^30 bytes; 50GB: 50 × 10^9)")
    number, letter, suffix = m.group(1), (m.group(2) or "").lower(), (m.group(3) or "").lower()
    base = 1000 if suffix == "b" else 1024
    size = int(float(number) * base ** _POWER[letter]) if "." in number else int(number) * base ** _POWER[letter]
    if size > MAX_SIZE:
        raise UsageError(f"{shown(text)} is too large a size: at most 8 EiB")
    return size


