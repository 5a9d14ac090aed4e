"""Durations (`30d`) and sizes (`10G`) as users write them on the command line."""

from __future__ import annotations

import re

from llmgw_store.core.errors import UsageError

_DURATION = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_SIZE = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_duration(text: str) -> float:
    """`45s`, `90m`, `12h`, `30d`, `2w` → seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text.lower())
    if not m:
        raise UsageError(f"{text!r} is not a duration: use a number and s, m, h, d or w (e.g. 30d)")
    return float(m.group(1)) * _DURATION[m.group(2)]


def parse_size(text: str) -> int:
    """`500M`, `10G`, `1.5T`, `4096` (bytes; K/M/G/T are powers of 1024, an optional trailing B or iB)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", text.lower())
    if not m:
        raise UsageError(f"{text!r} is not a size: use a number with K, M, G or T (e.g. 50G)")
    return int(float(m.group(1)) * _SIZE[m.group(2)])


def human_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
