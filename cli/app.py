"""The click group, its shared options and the error boundary; the commands live in cli/commands/,
one module per area, each command parsing, calling one library function and formatting its result.

Output contract: results on stdout (a store path, a table, or with --json one JSON document);
progress and errors on stderr, one line each. Exit codes: 0 ok, 1 failed, 2 bad usage or input,
75 a lock could not be had in time (cron may simply try again).
"""

from __future__ import annotations

import json
import time
from typing import Any

import click

from llmgw_store.core import defaults, locks, report
from llmgw_store.core.errors import StoreError, translated
from llmgw_store.core.names import printable

PROG = "llmgw-store"


class Context:
    def __init__(self, root: str | None, as_json: bool, verbose: int, progress: str = "auto"):
        self.root, self.as_json, self.verbose = root, as_json, verbose
        self.started = time.monotonic()
        self.reporter = report.renderer(progress, verbose=verbose, started=self.started)

    def progress(self, message: str) -> None:
        report.say(message)

    def exit(self, code: int) -> None:
        click.get_current_context().exit(code)

    def emit(self, document: Any, text: str) -> None:
        if self.as_json:
            click.echo(json.dumps(document, indent=2, sort_keys=True, default=str))
        elif text:
            click.echo(text)


def _end_progress(ctx: click.Context) -> None:
    """Clear a live progress line before an error is printed below it."""
    obj = ctx.find_object(Context)
    if obj is not None:
        obj.reporter.close()


class StoreGroup(click.Group):
    """Turns every StoreError into one line on stderr and its exit code, never a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            with translated():  # a full, read-only or foreign disk: a typed error, not an internal one
                return super().invoke(ctx)
        except StoreError as err:
            _end_progress(ctx)
            click.echo(f"{PROG}: error: {printable(str(err))}", err=True)  # one line, whatever it quotes
            obj = ctx.find_object(Context)
            if getattr(err, "output_tail", None) and obj is not None and obj.verbose:
                click.echo("\n".join(printable(ln) for ln in err.output_tail.splitlines()), err=True)
            ctx.exit(err.exit_code)
        except KeyboardInterrupt as exc:  # ^C; or SIGTERM/SIGHUP where handled as ^C (exit_code 143/129)
            _end_progress(ctx)
            click.echo(f"{PROG}: interrupted", err=True)
            ctx.exit(getattr(exc, "exit_code", 130))
        except (click.exceptions.Exit, click.exceptions.ClickException, click.exceptions.Abort):
            raise
        except Exception as exc:  # a bug: still one line, the traceback with -v
            _end_progress(ctx)
            obj = ctx.find_object(Context)
            if obj is not None and obj.verbose:
                import traceback

                traceback.print_exc()
            click.echo(f"{PROG}: internal error: {type(exc).__name__}: {exc} (run with -v for the traceback)", err=True)
            ctx.exit(1)


@click.group(cls=StoreGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--root", type=click.Path(), envvar="LLMGW_STORE_ROOT",
              help="Store root. Default: $LLMGW_STORE_ROOT, else /var/lib/llmgw-store (root) or $XDG_DATA_HOME/llmgw-store.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout; human text goes to stderr.")
@click.option("-v", "--verbose", count=True, help="Show the commands run, and a failed command's output.")
@click.option("--progress", "progress", type=click.Choice(report.MODES), default="auto", show_default=True,
              envvar="LLMGW_STORE_PROGRESS",
              help="Progress on stderr: auto (a live line on a terminal, else plain), tty, plain (timestamped "
                   "lines), json (one JSON object per line: t, step, done, total, unit), none. "
                   "Env: LLMGW_STORE_PROGRESS.")
@click.version_option(package_name="llmgw-store", prog_name=PROG)
@click.pass_context
def cli(ctx: click.Context, root: str | None, as_json: bool, verbose: int, progress: str) -> None:
    """A content-addressed store for the uv-built Python environments of LLM inference engines.

    \b
    Example:
      llmgw-store --root ./.llmgw-store build examples/black.toml
    """
    ctx.obj = Context(root, as_json, verbose, progress)
    # The library reports progress through one reporter (core/report.py): it goes to stderr here,
    # for the whole command, rendered as --progress says.
    ctx.with_resource(report.reporting_to(ctx.obj.reporter))


def lock_timeout_option(default: float, waits_for: str):
    """--lock-timeout for a command that takes a lock; its default is the library's."""
    return click.option("--lock-timeout", type=click.FloatRange(min=0), default=default, show_default=True,
                        help=f"Seconds to wait for {waits_for}; then exit 75 naming the holder.")


def substitute_only_option():
    return click.option("--substitute-only", is_flag=True, envvar="LLMGW_STORE_SUBSTITUTE_ONLY",
                        help="Pull from the --substituter caches and never build: a miss is exit 1 naming the key and "
                             "the caches asked, with nothing built. For a node; the recipe's version and as_of "
                             "pinned (or a recorded generation), its key needs no index. Env: LLMGW_STORE_SUBSTITUTE_ONLY.")


def offline_option():
    return click.option("--offline", is_flag=True, envvar="LLMGW_STORE_OFFLINE",
                        help="No network but file:// caches: uv reads only its cache, http(s)/s3 caches are passed "
                             "over, and what would need the index says so (exit 1). Env: LLMGW_STORE_OFFLINE.")


def build_options(f):
    """The options that decide a build, shared by `build` and `activate RECIPE.toml`."""
    for opt in reversed([
        click.option("--version", "version", help="Engine version to build (default: the recipe's, else the latest release)."),
        click.option("--variant", help="Which [[build]] of the recipe (default: the first)."),
        click.option("--as-of", help="Resolve as the index stood at this ISO 8601 time (default: the recipe's as_of, else publication + 24 h)."),
        click.option("--index-url", default=defaults.PYPI_SIMPLE, show_default=True, envvar="LLMGW_STORE_INDEX_URL",
                     help="Package index (simple API, PEP 691 JSON). Env: LLMGW_STORE_INDEX_URL."),
        click.option("--uv", "uv_path", type=click.Path(dir_okay=False), envvar="LLMGW_STORE_UV",
                     help="Use this uv binary instead of the store's pinned one (its --version enters the key). Env: LLMGW_STORE_UV."),
        click.option("--python", "python", metavar="PATH|VERSION", envvar="LLMGW_STORE_PYTHON",
                     help="Use this interpreter (an absolute path) or version request (3.12) instead of the recipe's "
                          "build.python; it enters the key as the recipe's field would. Env: LLMGW_STORE_PYTHON."),
        click.option("--python-preference", envvar="LLMGW_STORE_PYTHON_PREFERENCE", default=defaults.PYTHON_PREFERENCE,
                     show_default=True, type=click.Choice(defaults.PYTHON_PREFERENCES),
                     help="Where the interpreter may come from: managed uses a store-managed one, else the host's, and "
                          "downloads one only if neither exists; only-managed always wants a managed one (the "
                          "host's if the download fails); only-system never downloads."),
        lock_timeout_option(locks.BUILD_LOCK_TIMEOUT_S, "each lock (another process building the same key, a gc, the profile)"),
        click.option("--substituter", "substituters", multiple=True, envvar="LLMGW_STORE_SUBSTITUTERS",
                     help="Binary cache to ask before building (file:///dir, http(s)://...); repeatable. "
                          "Env: LLMGW_STORE_SUBSTITUTERS (space-separated)."),
        click.option("--trusted-key", "trusted_keys", multiple=True,
                     help="Public key (name:base64, or a .public file) whose signatures are accepted; repeatable. "
                          "Also LLMGW_STORE_TRUSTED_KEYS."),
        substitute_only_option(),
        offline_option(),
    ]):
        f = opt(f)
    return f


def options_from(kw: dict):
    from llmgw_store.build.builder import BuildOptions

    return BuildOptions(version=kw["version"], variant=kw["variant"], as_of=kw["as_of"], index_url=kw["index_url"],
                        uv=kw["uv_path"], python_preference=kw["python_preference"], lock_timeout=kw["lock_timeout"],
                        substitute_only=kw["substitute_only"], offline=kw["offline"],
                        python=kw["python"])


def caches_from(kw: dict) -> dict:
    return {"substituters": tuple(kw["substituters"]), "trusted_keys": tuple(kw["trusted_keys"])}


def quoted(name: str) -> str:
    """A file name on one line of human output: as it is when printable, else repr (a newline in a
    name cannot start a line of its own, such as a forged `identical:`)."""
    return name if name.isprintable() else repr(name)
