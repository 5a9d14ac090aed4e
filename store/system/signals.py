"""The one signal guard: SIGTERM and SIGHUP end a command the way ^C does.

    SIGINT   KeyboardInterrupt (Python's own handler)   exit 130
    SIGTERM  Interrupted(SIGTERM)                        exit 143 (systemd stopping a unit, a timeout's kill)
    SIGHUP   Interrupted(SIGHUP)                         exit 129 (the terminal went away)

`Interrupted` is a KeyboardInterrupt, so every `finally` and every `except KeyboardInterrupt` the
library has for ^C runs for the other two as well: a scratch tree is removed, children are killed,
a `--then-check` switches the profile back, a lock is let go. The exit code is 128 + the signal's
number, what a process killed by the signal reports to its shell, so a caller sees which signal
ended it either way. The CLI (click and the fast path alike) installs the guard for the whole
command with `guard()` and turns the exception into one line and `exit_code(exc)`; library code
that must clean up even when used without the CLI wraps its work in `raising()`.

A handler exists only in the main thread (Python's rule): elsewhere both are no-ops, the default
action stays, and what a killed process leaves is removed by the next sweep of its kind.
Only _signal is imported (the signal module's enums cost more than a switch): this module is on
the hot path.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:  # typeshed types the signal module only; _signal is the same functions
    import signal
else:
    import _signal as signal

ENDING = (signal.SIGTERM, signal.SIGHUP)
SIGINT_EXIT = 128 + signal.SIGINT  # 130
NAMES: dict[int, str] = {signal.SIGTERM: "SIGTERM", signal.SIGHUP: "SIGHUP", signal.SIGINT: "SIGINT"}


class Interrupted(KeyboardInterrupt):
    """A signal that ends the command arrived (SIGTERM or SIGHUP): handled as ^C is, then the
    process exits `exit_code` (128 + the signal's number)."""

    def __init__(self, signum: int) -> None:
        super().__init__(NAMES.get(signum, f"signal {signum}"))
        self.signum, self.exit_code = signum, 128 + signum


def exit_code(exc: BaseException) -> int:
    """The exit code for an interruption: 143/129 for Interrupted, 130 for ^C."""
    return getattr(exc, "exit_code", SIGINT_EXIT)


class _Raise:
    """A handler that raises Interrupted once; a later signal, while the first one unwinds (its
    `finally` blocks removing scratch trees, switching a profile back), is ignored: a second
    SIGTERM must not cut that cleanup short. SIGKILL remains for a process that does not end."""

    def __init__(self) -> None:
        self.raised = False

    def __call__(self, signum: int, frame: object) -> None:
        if not self.raised:
            self.raised = True
            raise Interrupted(signum)


def guard() -> bool:
    """Install the guard for the rest of the process (the CLI's first step); False outside the
    main thread, where it cannot be."""
    handler = _Raise()
    try:
        for s in ENDING:
            signal.signal(s, handler)
    except ValueError:  # not the main thread
        return False
    return True


class raising:
    """`with raising():` — the guard for the block only, the previous handlers restored after it
    (for library code that must clean up on SIGTERM even when no CLI installed the guard)."""

    def __enter__(self) -> None:
        self.previous: dict[int, signal._HANDLER] = {}
        handler = _Raise()
        try:
            for s in ENDING:
                self.previous[s] = signal.signal(s, handler)
        except ValueError:  # not the main thread: nothing was installed
            pass

    def __exit__(self, *exc: object) -> None:
        for s, handler in self.previous.items():
            signal.signal(s, handler)


class Window:
    """SIGTERM and SIGHUP around a step that must be undone if interrupted (a `--then-check`: the
    profile stands at an unchecked generation). `hold` (before the step) installs the raising
    handler and blocks both signals, so none lands between the step and the `try` that undoes it;
    `arm` (inside that `try`) unblocks them; `block` (first thing when undoing) keeps the undo from
    being interrupted; `restore` puts the previous handlers back. Outside the main thread all four
    do nothing."""

    def __init__(self) -> None:
        self.handler = _Raise()
        self.old: dict[int, signal._HANDLER] = {}
        self.active = True

    def hold(self) -> None:
        try:
            signal.pthread_sigmask(signal.SIG_BLOCK, ENDING)
            for s in ENDING:
                self.old[s] = signal.signal(s, self.handler)
        except ValueError:  # not the main thread
            self.active = False
            signal.pthread_sigmask(signal.SIG_UNBLOCK, ENDING)

    def arm(self) -> None:
        if self.active:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, ENDING)

    def block(self) -> None:
        if self.active:
            self.handler.raised = True  # what arrives now is not raised: the undo is under way
            signal.pthread_sigmask(signal.SIG_BLOCK, ENDING)

    def restore(self) -> None:
        if self.active and self.old:
            for s, handler in self.old.items():
                signal.signal(s, handler)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, ENDING)
