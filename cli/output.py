"""What a command prints, and how every way it can end becomes an exit code — free of click, used
alike by the click app (cli/app.py) and the fast path (cli/fast.py), so the two print the same bytes.

    stdout   the result: a store path, a table, or with --json one JSON document
    stderr   progress (base/report.py renders it as --progress / LLMGW_STORE_PROGRESS say; -q: none)
             and errors, each one line: `llmgw-store: error: ...`, control characters escaped

Exit codes: 0 ok, 1 the operation failed, 2 bad usage or input (nothing was changed), 75 a lock
could not be had in time, 66/69/77/65 --substitute-only got nothing: a miss, the caches
unreachable, signed by an untrusted key, damaged (base/errors.py), 130/143/129 interrupted by SIGINT/SIGTERM/SIGHUP (system/signals.py).
Under --json an error is also a JSON document on stdout:

    {"schema_version": 1, "exit_code": 2, "error": {"kind": "usage", "message": "..."}}

`kind` is the error's class in the store's error tree (base/errors.py) in snake case without
"Error" (`not_found`, `lock_timeout`, `integrity`, `usage`, `store` for the root, ...), or
`interrupted` (with `signal`) or `internal` (a bug). A CommandError also gives `log`; a
--substitute-only command that got nothing (`cache_miss`, `cache_unreachable`, `cache_untrusted`,
`cache_damaged`; exit 66, 69, 77, 65) gives `cause`, `key`, `name`, `caches`, `inputs`, `candidates`.
"""

from __future__ import annotations

import os
import sys
import time

from llmgw_store.base import report
from llmgw_store.base.errors import StoreError, translated
from llmgw_store.base.text import printable
from llmgw_store.system import signals

PROG = "llmgw-store"
SCHEMA_VERSION = 1  # of every JSON document the CLI prints (the key: "schema_version")


class CommandExit(Exception):
    """A command ends with `code` after printing its result (verify finding damage: 1)."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


class Context:
    """One command's output: where its result goes (`emit`), its progress reporter, and the global
    options (root, json, verbose, quiet, progress, the config file read)."""

    def __init__(self, root: str | None, as_json: bool, verbose: int, progress: str = "auto", *,
                 quiet: bool = False, config_file: str | None = None, started: float | None = None,
                 containment: str | None = None):
        self.root, self.as_json, self.verbose, self.quiet = root, as_json, verbose, quiet
        if containment:
            # The effective setting (flag, variable, config file or default, resolved by the parser)
            # is what supervise/cgroups.py reads when the first child starts; handed over in a variable
            # of its own, so `config` still says where the public one came from.
            if containment != os.environ.get("LLMGW_STORE_CONTAINMENT", "auto"):
                os.environ["_LLMGW_STORE_CONTAINMENT"] = containment
            else:
                os.environ.pop("_LLMGW_STORE_CONTAINMENT", None)
        self.config_file = config_file
        self.started = time.monotonic() if started is None else started
        self.reporter = report.renderer("none" if quiet else progress, verbose=verbose, started=self.started)

    def progress(self, message: str) -> None:
        report.say(message)

    def exit(self, code: int) -> None:
        raise CommandExit(code)

    def emit(self, document: object, text: str) -> None:
        """The result: `document` as JSON under --json, else `text` (nothing when empty)."""
        if self.as_json:
            write(sys.stdout, dumps(document) + "\n")
        elif text:
            write(sys.stdout, text + "\n")


def dumps(document: object) -> str:
    """json.dumps(document, indent=2, sort_keys=True, default=str), through system/jsontext when it
    can (the same text, without loading `json` and `re` on a switch's path)."""
    from llmgw_store.system import jsontext

    try:
        return jsontext.indented(document, 2)
    except (TypeError, ValueError):
        import json

        return json.dumps(document, indent=2, sort_keys=True, default=str)


def write(stream, text: str) -> None:
    stream.write(text)
    stream.flush()


def kind_of(err: BaseException) -> str:
    """`NotFoundError` → `not_found`, `IndexError_` → `index`, `StoreError` → `store`."""
    name = type(err).__name__.rstrip("_")
    if name.endswith("Error") and name != "Error":
        name = name[: -len("Error")]
    return "".join("_" + c.lower() if c.isupper() and i else c.lower() for i, c in enumerate(name))


def fail(as_json: bool, code: int, kind: str, message: str, *, detail: str = "", **extra: object) -> int:
    """Say an error: one line on stderr (and `detail`, -v's lines, below it), and under --json the
    error document on stdout. Returns `code`."""
    line = printable(message)
    write(sys.stderr, f"{PROG}: {line}\n" + (detail if not detail or detail.endswith("\n") else detail + "\n"))
    if as_json:
        import json

        doc = {"schema_version": SCHEMA_VERSION, "exit_code": code,
               "error": {"kind": kind, "message": line.removeprefix("error: "), **extra}}
        write(sys.stdout, json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n")
    return code


def store_error(err: StoreError, as_json: bool, verbose: int) -> int:
    """A StoreError: its one line, its exit code (with -v, the failed command's output below it)."""
    tail = getattr(err, "output_tail", "") if verbose else ""
    detail = "\n".join(printable(ln) for ln in tail.splitlines()) if tail else ""
    log = getattr(err, "log", None)  # a CommandError's
    extra = {"log": str(log)} if log else {}
    extra.update(getattr(err, "details", None) or {})  # a NotSubstituted: its cause, the key's inputs, the caches'
    return fail(as_json, err.exit_code, kind_of(err), f"error: {err}", detail=detail, **extra)


def interrupted(exc: BaseException, as_json: bool) -> int:
    code = signals.exit_code(exc)
    name = exc.args[0] if isinstance(exc, signals.Interrupted) else "SIGINT"
    return fail(as_json, code, "interrupted", "interrupted", signal=name)


def internal(exc: BaseException, as_json: bool, verbose: int) -> int:
    """A bug: still one line (the traceback with -v)."""
    if verbose:
        import traceback

        traceback.print_exc()
    return fail(as_json, 1, "internal", f"internal error: {type(exc).__name__}: {exc} (run with -v for the traceback)")


def usage(message: str, as_json: bool) -> int:
    """A usage error found by the parser (click's): one line, exit 2."""
    return fail(as_json, 2, "usage", f"error: {message}")


def run(ctx: Context, body) -> int:
    """Run `body()` with its progress going to ctx's reporter; every way it ends is an exit code
    (the fast path's boundary; click's is StoreGroup in cli/app.py, which calls the same functions)."""
    try:
        with report.reporting_to(ctx.reporter), translated():  # a full or read-only disk: one line, exit 1
            try:
                body()
            except BaseException:
                ctx.reporter.close()  # a live progress line is cleared before the error line
                raise
        return 0
    except CommandExit as done:
        return done.code
    except StoreError as err:
        return store_error(err, ctx.as_json, ctx.verbose)
    except KeyboardInterrupt as exc:  # ^C, SIGTERM, SIGHUP (system/signals.py)
        return interrupted(exc, ctx.as_json)
    except BrokenPipeError:
        _quiet_broken_pipe()
        return 1
    except Exception as exc:
        return internal(exc, ctx.as_json, ctx.verbose)


def _quiet_broken_pipe() -> None:
    """stdout's reader went away (`llmgw-store list | head`): say nothing more, and keep Python from
    complaining when it flushes stdout at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
