"""Reading a store process's retries as it makes them: its progress lines on stderr say each wait
(`…; trying again in 1.3s (attempt 3)`), so a test can wait for the client's own clock instead of
sleeping on its own."""

from __future__ import annotations

import re


def waits_until(proc, seconds: float, url: str) -> list[str]:
    """Read `proc`'s stderr until one request of `url` has announced retries whose waits add up to
    `seconds` (the client's own clock: the test sleeps nowhere); the lines read."""
    waited: dict[str, float] = {}
    lines = []
    for line in proc.stderr:
        lines.append(line)
        m = re.search(r"^(?:.*?\] )?(\S+ \S+): .*; trying again in ([0-9.]+)s", line)
        if m and url in m.group(1):
            waited[m.group(1)] = waited.get(m.group(1), 0.0) + float(m.group(2))
            if max(waited.values()) >= seconds:
                return lines
    raise AssertionError(f"the pull ended (exit {proc.wait()}) before it had waited {seconds}s: {''.join(lines)}")
