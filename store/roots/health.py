"""Health checks of an environment: the command `activate --check` (or the recipe's `health`) runs
in a store path before (or, with --then-check, right after) the profile switches to it.

The check runs as `llmgw-store run` runs a command: the environment's `bin/` first on PATH,
VIRTUAL_ENV set to the store path, PYTHONHOME unset; stdin from /dev/null, stdout and stderr
captured together. It is started through supervise/procs.run: in a process group of its own that is
SIGKILLed whole when the timeout passes, and that dies with this process however it dies (SIGKILL
included), so a hung check never outlives the activation that started it.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmgw_store.app.results import Result
from llmgw_store.base.errors import CommandError, UsageError
from llmgw_store.base.report import say
from llmgw_store.base.text import shown
from llmgw_store.core.index import RegisteredPath
from llmgw_store.core.names import printable

DEFAULT_TIMEOUT_S = 120.0
MAX_TIMEOUT_S = 86400.0  # a day: inf, nan and 1e300 are refused before anything changes
TAIL_LINES = 20
TAIL_CHARS = 4000
ARGV_MAX = 256
ARG_MAX_CHARS = 4096


@dataclass(frozen=True)
class CheckResult(Result):
    """How a check ended: `passed` when it exited 0 within its timeout; `tail` its last lines."""

    argv: tuple[str, ...]
    passed: bool
    exit: int | None
    timed_out: bool
    seconds: float
    tail: str

    def summary(self) -> str:
        if self.timed_out:
            return f"timed out after {self.seconds:.0f}s (killed with its children)"
        return "passed" if self.passed else f"failed (exit {self.exit})"

    def record(self, mode: str) -> dict[str, Any]:
        """What the generation record and the history keep of it."""
        return {"argv": list(self.argv), "mode": mode, "result": "passed" if self.passed else "failed",
                "exit": self.exit, "timed_out": self.timed_out, "seconds": self.seconds, "tail": self.tail}


def parse(text: str) -> list[str]:
    """`--check 'CMD ARGS...'` as an argv (shell words, no shell run). UsageError when empty or huge."""
    import shlex

    try:
        argv = shlex.split(text)
    except ValueError as exc:
        raise UsageError(f"--check {shown(text)}: {exc}") from None
    return checked_argv(argv, "--check")


def checked_argv(argv: Any, where: str) -> list[str]:
    if not isinstance(argv, list) or not argv or len(argv) > ARGV_MAX \
            or not all(isinstance(a, str) and a and len(a) <= ARG_MAX_CHARS and "\0" not in a for a in argv):
        raise UsageError(f"{where}: a check is a command and its arguments (1 to {ARGV_MAX} non-empty words)")
    return argv


def recipe_health(row: RegisteredPath) -> list[str] | None:
    """The `health` command the recipe recorded in the path's inputs (index row), if any."""
    try:
        build = row.inputs.get("build") or {}
    except (TypeError, ValueError, KeyError, AttributeError):
        return None
    health = build.get("health") if isinstance(build, dict) else None
    if health is None:
        return None
    return checked_argv(health, f"the health command recorded for {row.name}")


def run(argv: list[str], env_dir: Path, timeout: float) -> CheckResult:
    """Run the check in the environment at `env_dir` (see the module docstring)."""
    import shlex

    from llmgw_store.supervise import procs  # here: an activation without a check starts no child

    env = dict(os.environ, VIRTUAL_ENV=str(env_dir))
    env["PATH"] = f"{env_dir / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env.pop("PYTHONHOME", None)
    say(f"checking {env_dir.name}: {shlex.join(argv)} (timeout {timeout:g}s)")
    started = time.monotonic()
    try:
        done = procs.run(argv, env=env, timeout=timeout)
    except (FileNotFoundError, PermissionError) as exc:
        return CheckResult(tuple(argv), False, 127, False, round(time.monotonic() - started, 3),
                           f"{argv[0]}: {exc.strerror or exc} (not in {env_dir / 'bin'} nor on PATH)")
    seconds = round(time.monotonic() - started, 3)
    result = CheckResult(tuple(argv), done.returncode == 0 and not done.timed_out,
                         None if done.timed_out else done.returncode, done.timed_out, seconds, _tail(done.output))
    say(f"check {result.summary()} in {seconds:.1f}s")
    return result


def _tail(output: str) -> str:
    """The last lines, each with its control characters escaped (an OSC or CSI sequence the check
    printed is shown, never sent to a terminal)."""
    lines = [printable(ln[:300]) for ln in output.splitlines() if ln.strip()][-TAIL_LINES:]
    return "\n".join(lines)[-TAIL_CHARS:]


def failure(result: CheckResult, what: str) -> CommandError:
    """The error for a failed check: one line ending in its last output lines (all of them with -v)."""
    import shlex

    last = " | ".join(result.tail.splitlines()[-5:])
    message = f"the check `{printable(shlex.join(result.argv))}` {result.summary()}; {what}"
    if last:
        message += f"; its last lines: {last}"
    err = CommandError(message)  # the lines are in the message already; -v prints all of them
    err.output_tail = result.tail
    return err
