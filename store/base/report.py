"""Progress: one reporter for the whole process, set once by whoever drives the library (the CLI),
and called wherever a step starts or moves on. No callback is threaded through signatures.

Library code calls three things, from any thread:

    say("resolving 3 requirement(s) ...")          one line: what happens now
    progress("hashing", files, total, "files")     how far a counted step is (rate-limited here,
                                                   so call it per item; a step shorter than a
                                                   second shows nothing); done == total ends it
    with heartbeat("uv pip install", tail=...):    a step that cannot count (a child running):
        ...                                        "uv pip install: 12s" every second meanwhile

The sink is a module global rather than a context variable on purpose: hashing and downloads run
in worker threads, which must report to the same place as the thread that started them.

This module is on every command's path, the fast path's included: it imports no dataclasses,
typing or contextlib, and loads threading only when a thread is started (a heartbeat, the watchdog
once a step has been announced).

Renderers (chosen by the CLI's --progress): `Tty` (one live line, rewritten in place with \\r),
`Plain` (one timestamped line per event, at most one per step per second), `JsonLines` (one JSON
object per event: {"t": unix time, "step", "done", "total", "unit", ...} or {"t", "msg"}). Every
text renderer escapes control characters: a message may quote a file name or a child's output,
and a terminal must never receive an escape sequence from either.
"""

from __future__ import annotations

import _thread
import os
import sys
import time

from llmgw_store.base import defaults
from llmgw_store.base.text import printable

TYPE_CHECKING = False
if TYPE_CHECKING:
    import threading
    from collections.abc import Callable
    from typing import IO

MODES = defaults.PROGRESS_MODES
HEARTBEAT_S = 1.0  # a step that cannot count reports this often; the promise is "at least every 2 s"


class Update:
    """One progress update as renderers receive it. `rate` is per second over the step so far and
    `eta` seconds left (None when unknown); `final` is the step's last update; `idle` marks the
    watchdog's update (the announced step, still running)."""

    __slots__ = ("detail", "done", "elapsed", "eta", "final", "idle", "rate", "step", "total", "unit")

    def __init__(self, step: str, done: int, total: int | None, unit: str, elapsed: float,
                 rate: float | None = None, eta: float | None = None, detail: str = "", final: bool = False,
                 idle: bool = False) -> None:
        self.step, self.done, self.total, self.unit, self.elapsed = step, done, total, unit, elapsed
        self.rate, self.eta, self.detail, self.final, self.idle = rate, eta, detail, final, idle

    def __repr__(self) -> str:
        return "Update(" + ", ".join(f"{k}={getattr(self, k)!r}" for k in self.__slots__) + ")"


class Reporter:
    """Where progress goes. This base drops everything (a library used without a CLI is silent);
    renderers override `message` and `show`. `interval` is how often one step may be shown."""

    interval = 1.0
    active = False  # whether a heartbeat should bother starting its thread

    def message(self, text: str) -> None:
        pass

    def show(self, update: Update) -> None:
        pass

    def end(self, step: str) -> None:
        """`step` is over, whether or not its last update said so."""

    def close(self) -> None:
        pass


class _Step:
    __slots__ = ("first_done", "last_done", "last_shown", "shown", "started")

    def __init__(self, started: float, first_done: int, last_shown: float, last_done: int, shown: bool) -> None:
        self.started, self.first_done, self.last_shown, self.last_done, self.shown = (
            started, first_done, last_shown, last_done, shown)


_reporter: Reporter = Reporter()
_lock = _thread.RLock()  # guards _steps, _watchdog and every renderer's output
_steps: dict[str, _Step] = {}
_MAX_STEPS = 256  # a step never ended (an exception) must not grow this forever
_beating = _thread._local()  # depth: whether this thread is inside a heartbeat
_announced: tuple[str, float] | None = None  # the last step `say` announced, and when
WATCHDOG_S = 1.5  # silence after which the announced step is said to be still running


def say(message: str) -> None:
    """Report one line of progress (`$ cmd` lines are the commands run: shown with -v). The line
    names the step now under way: if nothing else is reported for WATCHDOG_S, the watchdog says
    that this step is still running (see `reporting_to`)."""
    global _announced
    with _lock:
        _reporter.message(message)
        if not message.startswith("$ "):
            _announced = (message, time.monotonic())
            _start_watchdog()


def said(message: str) -> None:
    """`say` for the last line of a command's work: no step follows it for the watchdog to watch
    (a switch's line; the watchdog's thread would cost the switch a third of its time)."""
    with _lock:
        _reporter.message(message)


def progress(step: str, done: int, total: int | None, unit: str = "", *, since: float | None = None,
             detail: str = "") -> None:
    """Report that `step` has done `done` of `total` (None: unknown) `unit`s ("files", "modules";
    "B" for bytes, shown in IEC units). Cheap enough to call per item: updates closer together than
    the renderer's interval are dropped, except the first and the last. `done == total` ends the
    step (its last line says how long it took); a `done` lower than the previous one starts it
    again (a retry). `since` is when the step began (time.monotonic()), if before its first report;
    `detail` is a second count the line carries ("3/10 files")."""
    now = time.monotonic()
    with _lock:
        if not _reporter.active:
            return
        state = _steps.get(step)
        if state is None or done < state.last_done:
            if len(_steps) >= _MAX_STEPS:
                _steps.clear()
            began = now if since is None else min(since, now)
            state = _steps[step] = _Step(began, done, began, done, False)
        final = total is not None and done >= total
        state.last_done = done
        # A step shows itself once it has run for an interval, then at most once per interval,
        # and its end only if it showed itself: a quick step stays silent.
        if not (state.shown if final else now - state.last_shown >= _reporter.interval):
            if final:
                del _steps[step]
            return
        state.last_shown, state.shown = now, True
        elapsed = now - state.started
        rate = eta = None
        if elapsed >= 0.5 and done > state.first_done:
            rate = (done - state.first_done) / elapsed
            if total is not None and not final:
                eta = max(0.0, (total - done) / rate)
        if final:
            del _steps[step]
        _reporter.show(Update(step, done, total, unit, elapsed, rate, eta, detail, final=final))


class heartbeat:
    """`with heartbeat(step, tail=...):` — while the block runs, report `step` with the seconds it
    has taken, every `every` seconds, from a timer thread (with `tail()`, e.g. the last line a child
    printed, as its detail). A block shorter than `every` reports nothing; a longer one ends with a
    line saying how long it took. Inside another heartbeat of the same thread it says nothing: the
    outer step speaks for it."""

    def __init__(self, step: str, *, tail: Callable[[], str | None] | None = None, every: float = HEARTBEAT_S) -> None:
        self.step, self.tail, self.every = step, tail, every
        self.thread: threading.Thread | None = None

    def __enter__(self) -> None:
        if not _reporter.active or getattr(_beating, "depth", 0) != 0:
            return
        import threading

        _beating.depth = 1
        self.started = time.monotonic()
        self.stop = threading.Event()
        self.beats = 0
        self.thread = threading.Thread(target=self._loop, name=f"heartbeat {self.step}", daemon=True)
        self.thread.start()

    def _beat(self, final: bool) -> None:
        detail: str | None = ""
        if self.tail is not None:
            try:
                detail = self.tail()
            except Exception:  # a detail is never worth failing the step for
                detail = ""
        if detail is None:  # the step reported its own progress
            return
        elapsed = time.monotonic() - self.started
        with _lock:
            _reporter.show(Update(self.step, int(elapsed), None, "s", elapsed, detail=detail, final=final))

    def _loop(self) -> None:
        while not self.stop.wait(self.every):
            self._beat(False)
            self.beats += 1

    def __exit__(self, *exc: object) -> None:
        if self.thread is None:
            return
        _beating.depth = 0
        self.stop.set()
        self.thread.join()
        if self.beats:
            self._beat(True)
        with _lock:
            _steps.pop(self.step, None)
            _reporter.end(self.step)


class reporting_to:
    """`with reporting_to(sink) as reporter:` — send progress to `sink` while the block runs (the
    CLI wraps each command in this): a Reporter, or a function taking each message and each progress
    update as one line of text. For a text renderer, the watchdog (`_watch`) starts with the first
    step announced, not before: a command that says nothing starts no thread."""

    def __init__(self, sink: Reporter | Callable[[str], None]) -> None:
        self.reporter = sink if isinstance(sink, Reporter) else _Lines(sink)

    def __enter__(self) -> Reporter:
        global _reporter, _announced
        with _lock:
            self.previous, _reporter = _reporter, self.reporter
            _steps.clear()
            _announced = None
        return self.reporter

    def __exit__(self, *exc: object) -> None:
        global _reporter, _announced, _watchdog
        with _lock:
            watchdog, _watchdog = _watchdog, None
        if watchdog is not None:
            watchdog[1].set()
            watchdog[0].join()
        with _lock:
            try:
                self.reporter.close()
            finally:
                _reporter = self.previous
                _steps.clear()
                _announced = None


_watchdog = None  # (thread, stop event) of the running watchdog, guarded by _lock


def _start_watchdog() -> None:
    """Under _lock: the watchdog of the current text reporter, if it has none yet."""
    global _watchdog
    if _watchdog is not None or not isinstance(_reporter, _Text):
        return
    import threading

    stop = threading.Event()
    thread = threading.Thread(target=_watch, args=(_reporter, stop), name="progress watchdog", daemon=True)
    _watchdog = (thread, stop)
    thread.start()


def _watch(reporter: _Text, stop) -> None:
    """The promise that a running command says something at least every 2 s, whatever it is doing
    (a lock wait, a slow import, a query, Python-side work between two children): after WATCHDOG_S
    of silence, the step last announced by `say` is reported as still running. Before any step is
    announced it says nothing (a command that fails early prints its error alone)."""
    while not stop.wait(0.25):
        with _lock:
            if _announced is None or _reporter is not reporter:
                continue
            now = time.monotonic()
            if now - reporter.last_write < WATCHDOG_S:
                continue
            text, since = _announced
            elapsed = now - since
            reporter.show(Update(text, int(elapsed), None, "s", elapsed, idle=True))


# -- renderers -------------------------------------------------------------------------------


def _printable(text: str) -> str:
    return printable(text, tabs=True)


def _duration(seconds: float) -> str:
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _amount(n: float, unit: str) -> str:
    if unit == "B":
        from llmgw_store.base.text import human_size

        return human_size(n)
    return f"{int(n):,}" + (f" {unit}" if unit else "")


def describe(u: Update) -> str:
    """One line of text for an update (what the plain and tty renderers print)."""
    if u.unit == "s":  # a heartbeat
        text = f"{u.step}: done in {u.elapsed:.1f}s" if u.final else f"{u.step}: {_duration(u.elapsed)}…"
        return text + (f" ({u.detail})" if u.detail and not u.final else "")
    if u.final:
        return f"{u.step}: {_amount(u.done, u.unit)} in {u.elapsed:.1f}s"
    if u.total is None:
        text = f"{u.step}: {_amount(u.done, u.unit)}"
    elif u.unit == "B":
        text = f"{u.step}: {_amount(u.done, 'B')} of {_amount(u.total, 'B')}"
    else:
        text = f"{u.step}: {u.done:,}/{u.total:,}" + (f" {u.unit}" if u.unit else "")
    extra = [u.detail] if u.detail else []
    if u.rate is not None:
        extra.append(f"{_amount(u.rate, u.unit)}/s" if u.unit == "B" else f"{u.rate:,.0f}/s")
    if u.eta is not None:
        extra.append(f"ETA {_duration(u.eta)}")
    return text + (f" ({', '.join(extra)})" if extra else "")


class _Text(Reporter):
    """Shared by the text renderers: `$ cmd` lines only when verbose, times since `started`."""

    active = True

    def __init__(self, stream: IO[str] | None = None, *, verbose: int = 0, started: float | None = None):
        self.stream = stream if stream is not None else sys.stderr
        self.verbose = verbose
        self.started = time.monotonic() if started is None else started
        self.last_write = self.started

    def wanted(self, text: str) -> bool:
        return self.verbose >= 1 or not text.startswith("$ ")

    def stamp(self, text: str) -> str:
        return f"[{time.monotonic() - self.started:6.1f}s] {_printable(text)}"

    def write(self, text: str) -> None:
        self.last_write = time.monotonic()
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: progress is never worth failing for
            pass


class Plain(_Text):
    """One timestamped line per message and per shown update (for logs, pipes and cron)."""

    def message(self, text: str) -> None:
        if self.wanted(text):
            self.write(self.stamp(text) + "\n")

    def show(self, update: Update) -> None:
        self.write(self.stamp(describe(update)) + "\n")


class Tty(_Text):
    """Messages as lines; the steps in progress on one live line below them, rewritten in place."""

    interval = 0.1
    STALE_S = 10.0  # a step not updated for this long leaves the live line

    def __init__(self, stream: IO[str] | None = None, **kw) -> None:
        super().__init__(stream, **kw)
        self.live: dict[str, tuple[float, str]] = {}
        self.drawn = False

    def _clear(self) -> None:
        if self.drawn:
            self.write("\r\x1b[K")
            self.drawn = False

    def _draw(self) -> None:
        now = time.monotonic()
        self.live = {k: v for k, v in self.live.items() if now - v[0] < self.STALE_S}
        if not self.live:
            return
        import shutil

        width = max(20, shutil.get_terminal_size((100, 24)).columns - 1)
        line = _printable(" | ".join(text for _, text in self.live.values()))
        if len(line) > width:
            line = line[: width - 1] + "…"
        self.write("\r\x1b[K" + line)
        self.drawn = True

    def message(self, text: str) -> None:
        if self.wanted(text):
            self.live.pop(self.IDLE, None)  # a new step: the previous one is no longer "still running"
            self._clear()
            self.write(self.stamp(text) + "\n")
            self._draw()

    IDLE = "\0idle"  # the live line's key for the watchdog's update (no step has this name)

    def show(self, update: Update) -> None:
        if update.final:
            self.live.pop(update.step, None)
            self._clear()
            self.write(self.stamp(describe(update)) + "\n")
        else:
            self.live[self.IDLE if update.idle else update.step] = (time.monotonic(), describe(update))
        self._draw()

    def end(self, step: str) -> None:
        if self.live.pop(step, None) is not None:
            self._clear()
            self._draw()

    def close(self) -> None:
        self._clear()


class JsonLines(_Text):
    """One JSON object per line, for scripts: {"t", "msg"} or {"t", "step", "done", "total", "unit",
    "rate", "eta", "detail", "end"} (the optional keys only when known)."""

    def message(self, text: str) -> None:
        if self.wanted(text):
            self._emit({"msg": text})

    def show(self, u: Update) -> None:
        doc = {"step": u.step, "done": u.done, "total": u.total, "unit": u.unit, "elapsed": round(u.elapsed, 3)}
        if u.rate is not None:
            doc["rate"] = round(u.rate, 3)
        if u.eta is not None:
            doc["eta"] = round(u.eta, 1)
        if u.detail:
            doc["detail"] = u.detail
        if u.final:
            doc["end"] = True
        if u.idle:
            doc["idle"] = True
        self._emit(doc)

    def _emit(self, doc: dict) -> None:
        import json

        self.write(json.dumps({"t": round(time.time(), 3), **doc}) + "\n")


class _Lines(Reporter):
    """A plain function as a sink: messages as they are, updates as `describe` says them."""

    active = True

    def __init__(self, sink: Callable[[str], None]) -> None:
        self.sink = sink

    def message(self, text: str) -> None:
        self.sink(text)

    def show(self, update: Update) -> None:
        self.sink(describe(update))


def renderer(mode: str, stream: IO[str] | None = None, *, verbose: int = 0,
             started: float | None = None) -> Reporter:
    """The reporter for a --progress mode: `auto` is `tty` when `stream` is a terminal (and TERM is
    not dumb), else `plain`; `none` reports nothing."""
    if mode not in MODES:
        raise ValueError(f"progress mode {mode!r} is not one of {', '.join(MODES)}")
    stream = stream if stream is not None else sys.stderr
    if mode == "auto":
        try:
            tty = stream.isatty() and os.environ.get("TERM", "") != "dumb"
        except (AttributeError, ValueError):
            tty = False
        mode = "tty" if tty else "plain"
    if mode == "none":
        return Reporter()
    cls = {"tty": Tty, "plain": Plain, "json": JsonLines}[mode]
    return cls(stream, verbose=verbose, started=started)
