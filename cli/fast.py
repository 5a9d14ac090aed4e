"""The console script's first step: `build`, `activate`, `rollback` and the reads without click (click's
import is 30 ms here, more than an activation needs in all).

The command line is parsed from the same declarations click's options are made from (cli/spec.py:
options, environment variables, the config file's values, defaults), and the command runs the same
body the click command runs (cli/handlers.py), printing through the same renderer (cli/output.py:
result, progress, one escaped error line, the JSON error document, exit codes) under the same signal
guard (system/signals.py: 130, 143, 129). So an answer of this path is the full command's answer:
tests/cli/test_cli_spec.py checks the two parsers against each other, option by option and variable by
variable, and tests/cli/test_fastpath_parity.py runs both on the cases where they once differed.

A `build` runs here only when the build memo answers it (build/memo.py: a cache hit, in a few
milliseconds); anything else — a miss, `--check`, another command, `--help`, an option this parser
is not sure of, a config file whose parsed values are not cached yet (cli/config.py) — goes to the
click app with argv untouched, which then does it all and says what is wrong.

An `activate` or a `rollback` is answered first by the switch's own path (roots/switch.py, through
handlers.switch_answer: a registered store path, a hot generation, no check), which loads none of
the library's other layers; what it leaves (nothing changed) runs the click command's body here.
A follow (`activate PROFILE --release NAME`, or `activate PROFILE` with the config file's
`releases`) of a release that has not moved is answered by roots/follow.py the same way: the
node's mark of the release, one read of the pointer and its checks, the profile's generation.

`list`, `info`, `env` and the listing of `generations` are answered by integrity/reads.py (through
handlers.read_answer) in the common case, with the same lines and document; what it leaves
(nothing printed) goes to the click app (tests/integrity/test_reads.py runs both ways and compares).
`config` is answered here from the declarations and the config file's cached values
(handlers.config_answer: the same function the click command prints with).
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    from types import ModuleType as _Module
else:
    _Module = type(sys)  # types.ModuleType, without importing types


def main() -> None:
    """The console script: the fast path where it applies, else the click app."""
    import time

    started = time.monotonic()
    from llmgw_store.system import signals

    signals.guard()  # SIGTERM and SIGHUP end the command as ^C does: exit 143, 129
    argv = sys.argv[1:]
    code = run(argv, started)
    if code is not None:
        sys.exit(code)
    from llmgw_store.cli.main import cli
    from llmgw_store.cli.output import PROG

    cli(prog_name=PROG)


def parse(argv: list[str], environ) -> object | None:
    """`argv` parsed as click would parse it (cli/spec.py), every parameter's value resolved from
    argv, `environ`, the config file's cached values and the defaults; None to leave it to click."""
    from llmgw_store.cli import config, spec

    parsed = spec.parse(argv)
    if parsed is None:
        return None
    known, file_values = config.read_cached(parsed.given.get("config_file"), environ)  # type: ignore[arg-type]
    if not known or not spec.resolve(parsed, environ, file_values):
        return None
    return parsed


def run(argv: list[str], started: float) -> int | None:
    """The exit code of `argv` run here, or None to leave it to the click app (nothing was printed
    or changed then)."""
    parsed = parse(argv, os.environ)
    if parsed is None:
        return None
    params = parsed.params  # type: ignore[attr-defined]
    command = parsed.command  # type: ignore[attr-defined]
    if (command == "build" and params["check"]) or (command == "verify" and params["repair"]):
        return None
    from llmgw_store.cli import handlers, output

    ctx = output.Context(params["root"], params["as_json"], params["verbose"], params["progress"],
                         quiet=bool(params["quiet"]), started=started, containment=params["containment"])
    if command == "build":
        answered = [False]

        def hit() -> None:
            answered[0] = handlers.memo_answer(ctx, params)

        code = output.run(ctx, hit)
        return code if answered[0] or code != 0 else None
    if command in handlers.READS:
        read = [False]

        def answer() -> None:
            if command == "config":
                read[0] = handlers.config_answer(ctx, params, parsed.sources, parsed.file, os.environ)  # type: ignore[attr-defined]
            else:
                read[0] = handlers.read_answer(ctx, command, params)

        code = output.run(ctx, answer)
        return code if read[0] or code != 0 else None
    if command in ("activate", "rollback"):
        switched = [False]

        def switch() -> None:
            switched[0] = handlers.switch_answer(ctx, command, params)

        code = output.run(ctx, switch)
        if switched[0] or code != 0:
            return code
    defer("inspect")
    return output.run(ctx, lambda: handlers.HANDLERS[command](ctx, params))


def defer(name: str) -> None:
    """Load the module `name` when something first uses one of its names, not when it is imported
    (as importlib.util.LazyLoader means to, whose module Python 3.11's `import` statement loads at
    once). For `inspect`: `dataclasses` imports it at its top (10 ms here, a third of a switch) only
    to write a docstring for a dataclass that has none, and every dataclass a switch loads has one
    (tests/cli/test_hot_paths.py checks that a switch loads no inspect). Only when the import happens
    changes: the first use of any of its names imports the real module, which then takes its
    place in sys.modules."""
    if name not in sys.modules:
        sys.modules[name] = _Deferred(name)


class _Deferred(_Module):
    def __getattr__(self, attr: str) -> object:
        if sys.modules.get(self.__name__) is self:
            del sys.modules[self.__name__]
        import importlib

        return getattr(importlib.import_module(self.__name__), attr)

    def __dir__(self) -> list[str]:
        import importlib

        return dir(importlib.import_module(self.__name__))
