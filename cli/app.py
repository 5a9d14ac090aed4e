"""The click group, its global options, the options made from the declarations, and the error
boundary; the commands live in cli/commands/, one module per area, each parsing, calling one
library function and formatting its result.

Options: the group's and those of `build`, `activate` and `rollback` are made from cli/spec.py (the
fast path reads the same declarations); every setting (cli/config.py) is an option made from its
declaration (`setting_option`), so its flag, variable, config key and default are the same
everywhere. A config file's values reach click as its `default_map`: click's own order — flag,
variable, default map, default — is the settings' precedence.

Conventions: the global options (--root, --config, --json, -v, -q, --progress) are taken before or
after the command's name, as uv, pixi and nix take them (`hoist`); every error, a usage error
included, is one line on stderr (cli/output.py), and under --json also a JSON document on stdout.
Exit codes: 0 ok, 1 failed, 2 bad usage or input, 75 a lock could not be had in time (cron may
simply try again), 130/143/129 interrupted.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from llmgw_store.base import report
from llmgw_store.base.errors import StoreError, translated
from llmgw_store.cli import config, output, spec
from llmgw_store.cli.handlers import caches_from, options_from, quoted  # noqa: F401  (the commands' helpers)
from llmgw_store.cli.output import PROG, Context

CONFIG_ERROR = "llmgw_store.config_error"
CONFIG_NOTE = "llmgw_store.config_note"
# Commands every user who can read the store may run (docs/operations.md "Service users"): the
# default config file below another user's home is no file to them (cli/config.ConfigUnreachable).
READERS = frozenset({"run", "env", "packages", "why", "export"})
HELP = "llmgw_store.help"


# -- options made from declarations ------------------------------------------------------------------


def _help(p: spec.Param) -> str:
    text = p.help
    if p.env:
        text += f" Env: {p.env}."
    if p.setting is not None:
        name = p.setting.name
        text += f" Config: {name.split('.', 1)[1] + ' in [' + name.split('.', 1)[0] + ']' if '.' in name else name}."
    return text


def _type(p: spec.Param) -> Any:
    if p.kind == "choice":
        return click.Choice(p.choices)
    if p.kind == "seconds":
        return click.FloatRange(min=0)
    if p.kind == "positive":
        return click.IntRange(min=1)
    if p.kind in ("int", "ints"):
        return int
    if p.kind == "timeout":
        return float
    if p.kind == "path":
        # A key file is checked by cache/signing.py, which says what is wrong with it in one way for
        # every command that takes one ("is not a regular file"), not click's "is a directory".
        return click.Path(dir_okay=p.name in ("root", "secret_key"))
    return None


def _check_timeout(ctx: click.Context, param: click.Parameter, value: float) -> float:
    try:
        return spec.check_timeout(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def click_param(p: spec.Param):
    """The click option or argument of a declared parameter."""
    if p.argument:
        kw: dict[str, Any] = {"metavar": p.metavar} if p.metavar else {}
        if p.kind == "list":
            kw["nargs"] = -1
        if p.default is not None:
            kw.update(required=False, default=p.default)
        return click.argument(p.name, type=_type(p), **kw)
    kw = {"help": _help(p)}
    if p.kind in ("flag", "bool"):
        kw["is_flag"] = True
    elif p.kind == "count":
        kw["count"] = True
    else:
        kw["type"] = _type(p)
        if p.kind in ("list", "ints"):
            kw["multiple"] = True
        if p.default is not None and p.kind not in ("list", "ints"):
            kw["default"] = p.default
            kw["show_default"] = p.show_default
    if p.env:
        kw["envvar"] = p.env
    if p.metavar:
        kw["metavar"] = p.metavar
    if p.kind == "timeout":
        kw["callback"] = _check_timeout
    return click.option(*p.flags, p.name, **kw)


def spec_params(command: str):
    """Every declared parameter of `command` (cli/spec.py), in the declared order."""
    def apply(f):
        for p in reversed(spec.COMMANDS[command]):
            f = click_param(p)(f)
        return f
    return apply


def setting_option(name: str, default: object = None, help: str | None = None):
    """The option of the setting `name` (cli/config.py) for a command that is not the fast path's."""
    return click_param(spec.setting(name, default, help))


def lock_timeout_option(default: float, waits_for: str):
    """--lock-timeout for a command that takes a lock; its default is the library's."""
    return setting_option("lock_timeout", default, f"Seconds to wait for {waits_for}; then exit 75 naming the holder.")


def build_options(f):
    """The options that decide a build (as `build` and `activate` declare them in cli/spec.py)."""
    for p in reversed([p for p in spec.COMMANDS["build"] if not p.argument and p.name != "check"]):
        f = click_param(p)(f)
    return f


# -- global options before or after the command ------------------------------------------------------


def _option_names(command: click.Command) -> tuple[set[str], set[str]]:
    """(options of `command` that take a value, those that do not), by every spelling."""
    value: set[str] = set()
    plain = {"-h", "--help"}
    for p in command.params:
        if isinstance(p, click.Option):
            (plain if p.is_flag or p.count else value).update(p.opts + p.secondary_opts)
    return value, plain


def _interspersed(command: click.Command) -> bool:
    return command.context_settings.get("allow_interspersed_args", command.allow_interspersed_args)


def _cluster(a: str, flags: set[str]) -> bool:
    """`a` is short flags together (`-vq`), each one of `flags`."""
    return len(a) > 2 and a[0] == "-" and a[1] != "-" and all("-" + c in flags for c in a[1:])


def split_globals(group: click.Group, args: list[str]) -> tuple[list[str], list[str]]:
    """(the global options in `args`, with their values; the rest, in order). Global options are
    found before the command's name and after it: `build x.toml --json` has `--json`. A command's
    own option of the same spelling stays its own (`build --version V`); nothing after `--` is
    taken, nor anything after the first argument of a command that takes the rest as they are
    (`run P CMD --json`)."""
    g_value, g_plain = _option_names(group)
    g_plain -= {"-h", "--help", "--version"}
    found, i = [], 0
    while i < len(args) and args[i].startswith("-") and args[i] not in ("-", "--"):
        a = args[i]
        i += 1
        if a.split("=", 1)[0] in g_value | g_plain or _cluster(a, g_plain):
            found.append(a)
            if a in g_value and i < len(args):
                found.append(args[i])
                i += 1
        else:
            return found, args[i - 1:]  # --help, --version, an unknown option: click's
    rest: list[str] = []
    command: click.Command | None = group
    own_value: set[str] = set()
    own_plain: set[str] = set()
    while i < len(args):
        a = args[i]
        i += 1
        if a == "--":
            rest += args[i - 1:]
            break
        if not a.startswith("-") or a == "-":
            rest.append(a)
            if isinstance(command, click.Group):
                command = command.commands.get(a)
                if command is None:
                    rest += args[i:]
                    break
                own_value, own_plain = _option_names(command)
            elif command is not None and not _interspersed(command):
                rest += args[i:]
                break
            continue
        name = a.split("=", 1)[0]
        if a.startswith("--") or len(a) == 2:
            if name in own_value or name in own_plain or name not in g_value | g_plain:
                rest.append(a)  # the command's own (or unknown: click says what is wrong with it)
                if name in own_value and "=" not in a and i < len(args):
                    rest.append(args[i])
                    i += 1
            else:
                found.append(a)
                if name in g_value and "=" not in a and i < len(args):
                    found.append(args[i])
                    i += 1
        elif _cluster(a, g_plain - own_plain - own_value):
            found.append(a)  # -vq
        else:
            rest.append(a)
    return found, rest


def hoist(group: click.Group, args: list[str]) -> list[str]:
    """`args` with every global option before the command, where click's group parses it."""
    found, rest = split_globals(group, args)
    return found + rest


def _global_value(found: list[str], flag: str) -> str | None:
    """The value of the global option `flag` among `found` (the last one, as click takes it)."""
    value = None
    for j, a in enumerate(found):
        if a == flag and j + 1 < len(found):
            value = found[j + 1]
        elif a.startswith(flag + "="):
            value = a[len(flag) + 1:]
    return value


def default_map(group: click.Group, values: dict[str, object], path: tuple[str, ...] = ()) -> dict[str, Any]:
    """The config file's `values` as click's default_map: for each command, each of its options that
    is a setting the command takes (gc's --keep is `[gc] keep`; generations' --keep is not)."""
    out: dict[str, Any] = {}
    for p in group.params if not path else []:
        for s in config.for_command(config.GLOBAL):
            if s.param == p.name and s.name in values:
                out[p.name] = values[s.name]
    for name, cmd in getattr(group, "commands", {}).items():
        sub_path = (*path, name)
        sub: dict[str, Any] = {}
        for p in cmd.params:
            for s in config.for_command(" ".join(sub_path)):
                if s.param == p.name and s.name in values:
                    sub[p.name] = values[s.name]
        if isinstance(cmd, click.Group):
            sub.update(default_map(cmd, values, sub_path))
        if sub:
            out[name] = sub
    return out


# -- the group ------------------------------------------------------------------------------------------


class StoreGroup(click.Group):
    """Global options anywhere, the config file as click's default map, every error one line."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if ctx.parent is None:
            found, rest = split_globals(self, args)
            args = found + rest
            ctx.meta[HELP] = bool({"-h", "--help"} & set(rest))
            try:
                loaded = config.load(_global_value(found, "--config"))
            except config.ConfigUnreachable as err:
                if not rest or rest[0] not in READERS:
                    ctx.meta[CONFIG_ERROR] = err
                ctx.meta[CONFIG_NOTE] = err.note  # a reader runs without it, and says so under -v
                loaded = None
            except StoreError as err:
                ctx.meta[CONFIG_ERROR] = err  # said when a command runs; --help still works
                loaded = None
            if loaded is not None:
                ctx.default_map = default_map(self, loaded.values)
                ctx.meta["llmgw_store.config"] = loaded
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        obj = None
        try:
            with translated():  # a full, read-only or foreign disk: a typed error, not an internal one
                return super().invoke(ctx)
        except output.CommandExit as done:
            ctx.exit(done.code)
        except StoreError as err:
            obj = _end_progress(ctx)
            ctx.exit(output.store_error(err, _as_json(ctx), obj.verbose if obj else 0))
        except KeyboardInterrupt as exc:  # ^C, SIGTERM, SIGHUP (system/signals.py)
            _end_progress(ctx)
            ctx.exit(output.interrupted(exc, _as_json(ctx)))
        except (click.exceptions.Exit, click.exceptions.ClickException, click.exceptions.Abort):
            raise
        except Exception as exc:  # a bug: still one line, the traceback with -v
            obj = _end_progress(ctx)
            ctx.exit(output.internal(exc, _as_json(ctx), obj.verbose if obj else 0))

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        """click's main, with its usage errors said in one line (and as a JSON document under --json)."""
        args = list(sys.argv[1:] if args is None else args)
        as_json = "--json" in split_globals(self, args)[0]
        try:
            code = super().main(args, prog_name or PROG, complete_var, standalone_mode=False, **extra)
        except click.exceptions.ClickException as e:
            message = e.format_message().replace("\n", " ")
            where = getattr(e, "ctx", None)
            if isinstance(e, click.UsageError) and where is not None:
                message += f" (see `{where.command_path} --help`)"
            code = output.fail(as_json, e.exit_code, "usage", f"error: {message}")
        except click.exceptions.Abort as e:
            code = output.interrupted(e.__context__ or KeyboardInterrupt(), as_json)
        code = code if isinstance(code, int) else 0
        if standalone_mode:
            sys.exit(code)
        return code


def _as_json(ctx: click.Context) -> bool:
    obj = ctx.find_object(Context)
    return obj.as_json if obj is not None else False


def _end_progress(ctx: click.Context) -> Context | None:
    """Clear a live progress line before an error is printed below it."""
    obj = ctx.find_object(Context)
    if obj is not None:
        obj.reporter.close()
    return obj


def _group(f):
    for p in reversed(spec.GROUP):
        f = click_param(p)(f)
    return f


@click.group(cls=StoreGroup, context_settings={"help_option_names": ["-h", "--help"]})
@_group
@click.version_option(package_name="llmgw-store", prog_name=PROG)
@click.pass_context
def cli(ctx: click.Context, root: str | None, config_file: str | None, as_json: bool, verbose: int, quiet: bool,
        progress: str, containment: str) -> None:
    """A content-addressed store for the uv-built Python environments of LLM inference engines.

    Global options go before or after the command. Settings (each option that says `Config:`) can
    also come from a config file: --config FILE, else $LLMGW_STORE_CONFIG, else
    /etc/llmgw-store/config.toml as root or $XDG_CONFIG_HOME/llmgw-store/config.toml; a flag wins
    over its variable, which wins over the file. `llmgw-store config` shows what is in effect.

    \b
    Example:
      llmgw-store --root ./.llmgw-store build examples/black.toml
    """
    loaded = ctx.meta.get("llmgw_store.config")
    ctx.obj = Context(root, as_json, verbose, progress, quiet=quiet, config_file=loaded.path if loaded else None,
                      containment=containment)
    # The library reports progress through one reporter (base/report.py): it goes to stderr here,
    # for the whole command, rendered as --progress says.
    ctx.with_resource(report.reporting_to(ctx.obj.reporter))
    if CONFIG_ERROR in ctx.meta and not ctx.meta.get(HELP):
        raise ctx.meta[CONFIG_ERROR]
    if CONFIG_NOTE in ctx.meta and verbose:
        click.echo(f"{PROG}: {ctx.meta[CONFIG_NOTE]}", err=True)
