"""Text shown on a terminal: the one escaping of control characters, for error lines (core/names,
app/units, the CLI) and progress lines (base/report) alike. Imports nothing: it is on every path."""

from __future__ import annotations


def printable(text: str, *, tabs: bool = False) -> str:
    """`text` with every control character (ESC, BEL, \\r, \\n, DEL, C1 ...) shown as an escape, so
    what a hostile command printed or was given can never drive the terminal it is shown on.
    `tabs`: leave tab characters as they are (a progress line may align with them)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or (tabs and c == "\t") else repr(c)[1:-1] for c in text)


def shown(value: object, limit: int = 60) -> str:
    """`value` quoted for a one-line error, cut short: a hostile value can be megabytes long."""
    s = repr(value)
    return s if len(s) <= limit else s[: limit - 20] + f"...' ({len(str(value))} characters)"


def human_size(n: float) -> str:
    """`n` bytes in IEC units: `512 B`, `12.0 KiB`, `1.5 GiB` (negative sizes keep their sign).
    Here, not in app/units (which loads `re`), for the reads the fast path answers (`list`)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
