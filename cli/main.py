"""Click app. Each command parses, calls one library function, and formats what it returns.

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
from llmgw_store.core.errors import StoreError
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
    ]):
        f = opt(f)
    return f


def _options(kw: dict):
    from llmgw_store.build.builder import BuildOptions

    return BuildOptions(version=kw["version"], variant=kw["variant"], as_of=kw["as_of"], index_url=kw["index_url"],
                        uv=kw["uv_path"], python_preference=kw["python_preference"], lock_timeout=kw["lock_timeout"])


def _caches(kw: dict) -> dict:
    return {"substituters": tuple(kw["substituters"]), "trusted_keys": tuple(kw["trusted_keys"])}


@cli.command()
@click.argument("recipe", type=click.Path(dir_okay=False))
@build_options
@click.option("--check", "check", is_flag=True,
              help="Rebuild RECIPE's store path (it must exist) into a temporary tree from its recorded lock and "
                   "compare file by file; exit 1 naming the files that differ. The store path is never changed.")
@click.pass_obj
def build(obj: Context, recipe: str, check: bool, **kw) -> None:
    """Build RECIPE into the store (or find it there) and print its store path.

    \b
    Examples:
      llmgw-store build examples/black.toml
      llmgw-store --json build examples/vllm.toml --variant cu128 --as-of 2025-06-01T00:00:00Z
      llmgw-store build examples/black.toml --check    # is it reproducible? 0 identical, 1 differs
    """
    if check:
        _build_check(obj, recipe, kw)
        return
    from llmgw_store.api import build as do_build

    result = do_build(recipe, _options(kw), **_caches(kw), root=obj.root)
    obj.emit(result.to_json(), str(result.path))


def _build_check(obj: Context, recipe: str, kw: dict) -> None:
    from llmgw_store.build.check import check as do_check

    r = do_check(recipe, _options(kw), root=obj.root)
    if r.identical:
        obj.emit(r.to_json(), f"identical: {r.path} ({r.files} entries, content hash {r.content_hash})")
        return
    n = len(r.differences) + len(r.problems)
    lines = [f"{r.path}: {n} entr{'y differs' if n == 1 else 'ies differ'}"]
    lines += [f"  {msg}" for msg in r.problems]
    for d in r.differences:
        store, rebuilt = d["store"], d["rebuilt"]
        lines.append(f"  {_quoted(d['path'])}  store: {_side(store)}  rebuilt: {_side(rebuilt)}")
    obj.emit(r.to_json(), "\n".join(lines))
    click.echo(f"{PROG}: {r.name} differs from its rebuild in {n} entr{'y' if n == 1 else 'ies'} "
               "(not reproducible, or changed since it was built: `verify` tells which)", err=True)
    obj.exit(1)


def _quoted(name: str) -> str:
    """A file name on one line of human output: as it is when printable, else repr (a newline in a
    name cannot start a line of its own, such as a forged `identical:`)."""
    return name if name.isprintable() else repr(name)


def _side(s: dict | None) -> str:
    if s is None:
        return "absent"
    what = _quoted(s["target"]) if "target" in s else (s["digest"][:12] if "digest" in s else "")
    extra = [f"uid {s['uid']}"] + ([f"xattrs {','.join(map(_quoted, s['xattrs']))}"] if s.get("xattrs") else [])
    return " ".join(str(x) for x in (s["kind"], s.get("mode", ""), what, *extra) if x)


@cli.command(name="list")
@click.pass_obj
def list_cmd(obj: Context) -> None:
    """List the store paths the index holds: path, size, entries (files, links, directories), last used."""
    from llmgw_store.core.units import human_size
    from llmgw_store.integrity.queries import list_paths

    r = list_paths(obj.root)
    lines = [f"{p.path}  {human_size(p.size):>10}  {p.files:6d} entries  last used {p.last_used[:19]}Z"
             for p in r.paths]
    obj.emit(r.to_json(), "\n".join(lines))


@cli.command()
@click.argument("path")
@click.pass_obj
def info(obj: Context, path: str) -> None:
    """Show what the index and manifest say of PATH (a store path, its name or its key, PROFILE or PROFILE@N)."""
    from llmgw_store.core.units import human_size
    from llmgw_store.integrity.queries import path_info

    r = path_info(path, obj.root)
    row, manifest = r.row, r.manifest or {}
    text = "\n".join([
        f"path:         {row.path}",
        f"engine:       {row.engine} {row.version} ({row.variant})",
        f"key:          {row.key}",
        f"as of:        {row.as_of}",
        f"uv:           {row.uv_version}",
        f"python:       {row.python}",
        f"size:         {human_size(row.size)} in {row.files} entries",
        f"content hash: {row.content_hash}",
        f"built:        {row.created} in {row.build_seconds:.1f}s",
        f"last used:    {row.last_used}",
        f"requirements: {', '.join(manifest.get('requirements', []))}",
    ])
    obj.emit(r.to_json(), text)


def _check_timeout(ctx: click.Context, param: click.Parameter, value: float) -> float:
    """Finite, more than 0, at most a day: checked before anything is built or switched."""
    import math

    if not (math.isfinite(value) and 0 < value <= 86400):
        raise click.BadParameter(f"{value!r} is not a number of seconds more than 0 and at most 86400")
    return value


@cli.command()
@click.argument("profile")
@click.argument("target")
@build_options
@click.option("--check", "check", metavar="'CMD ...'",
              help="Run this command in TARGET's environment first; switch only if it exits 0 "
                   "(default: the recipe's `health` command, if it has one).")
@click.option("--check-timeout", type=float, default=120.0, show_default=True, callback=_check_timeout,
              help="Seconds the check may run (more than 0, at most 86400); then it is killed with its "
                   "children and counts as failed.")
@click.option("--then-check", is_flag=True,
              help="Switch first, then run the check; switch back by itself if it fails or times out.")
@click.option("--no-check", is_flag=True, help="Do not run the recipe's `health` command.")
@click.option("--keep-records", type=click.IntRange(min=1), default=100, show_default=True,
              help="Records of generations kept for this profile (the oldest cold ones are dropped beyond it).")
@click.pass_obj
def activate(obj: Context, profile: str, target: str, **kw) -> None:
    """Make TARGET the current generation of PROFILE (atomically).

    TARGET is a store path (or its name or key), or a RECIPE.toml that is built first if needed
    (the build options apply to it). Activating what is already current makes no new generation.
    With a check (--check, or the recipe's `health`), the profile switches only if the check
    passes; else it is left as it was and the command exits 1 with the check's last lines.

    \b
    Examples:
      llmgw-store activate vllm /var/lib/llmgw-store/store/5x...-vllm-0.6.3-cu128
      llmgw-store activate vllm examples/vllm.toml --variant cu128
      llmgw-store activate vllm examples/vllm.toml --check 'vllm --version' --check-timeout 60
      llmgw-store activate vllm vllm@7 --check 'systemctl restart vllm' --then-check
    """
    from llmgw_store.api import activate as do_activate
    from llmgw_store.roots.health import parse as parse_check

    if kw["no_check"] and kw["check"] is not None:
        raise click.UsageError("--no-check and --check exclude each other")
    # Build options are made (and the builder loaded) only for a recipe.
    options = _options(kw) if target.endswith(".toml") else None
    r = do_activate(profile, target, options, **_caches(kw), root=obj.root, lock_timeout=kw["lock_timeout"],
                    check=parse_check(kw["check"]) if kw["check"] is not None else None, no_check=kw["no_check"],
                    check_timeout=kw["check_timeout"], then_check=kw["then_check"], keep_records=kw["keep_records"])
    checked = f" (check {r.check['result']})" if r.check else ""
    text = (f"{profile}: generation {r.generation} -> {r.path}{checked}" if r.changed
            else f"{profile}: already at generation {r.generation} -> {r.path}")
    obj.emit(r.to_json(), text)


@cli.command()
@click.argument("profile")
@click.option("--to", "to", type=int, help="Generation number to switch to (default: the previous one). A cold "
                                           "generation is rebuilt from its record (or pulled) first.")
@click.option("--substituter", "substituters", multiple=True, envvar="LLMGW_STORE_SUBSTITUTERS",
              help="Binary cache to pull a cold generation's store path from; repeatable.")
@click.option("--trusted-key", "trusted_keys", multiple=True, help="Public key whose signatures are accepted; repeatable.")
@click.option("--uv", "uv_path", type=click.Path(dir_okay=False), envvar="LLMGW_STORE_UV",
              help="A uv binary of the version the cold generation was built with (default: the store's).")
@click.option("--python-preference", envvar="LLMGW_STORE_PYTHON_PREFERENCE", default=defaults.PYTHON_PREFERENCE,
              show_default=True, type=click.Choice(defaults.PYTHON_PREFERENCES),
              help="Where the interpreter of a rebuild may come from.")
@lock_timeout_option(locks.LOCK_TIMEOUT_S, "the profile's lock (and a rebuild's locks)")
@click.pass_obj
def rollback(obj: Context, profile: str, to: int | None, substituters: tuple[str, ...], trusted_keys: tuple[str, ...],
             uv_path: str | None, python_preference: str, lock_timeout: float) -> None:
    """Switch PROFILE back to its previous generation, or to generation N with --to N.

    A cold generation N (deleted, its store path collected) comes back from its record: pulled
    from a --substituter, else rebuilt from its recorded lock (offline from uv's cache when it
    can be: same hashes, no re-resolution), and switched to only if it has the recorded content hash.

    \b
    Example:
      llmgw-store rollback vllm          # the generation before the current one
      llmgw-store rollback vllm --to 3
    """
    from llmgw_store.api import rollback as do_rollback

    r = do_rollback(profile, to=to, substituters=substituters, trusted_keys=trusted_keys, uv=uv_path,
                    python_preference=python_preference, root=obj.root, lock_timeout=lock_timeout)
    back = f" (cold: {r.rebuilt})" if r.rebuilt else ""
    obj.emit(r.to_json(), f"{profile}: generation {r.previous} -> {r.generation} ({r.path}){back}")


@cli.command()
@click.argument("profile")
@click.option("--delete", "delete", type=int, multiple=True, help="Delete generation N (repeatable). Never the current "
                                                                 "one. Its record stays: the generation becomes cold.")
@click.option("--older-than", help="Delete generations older than this (30d, 12h, ...), except the current one.")
@click.option("--keep", type=int, help="Keep the newest N generations (and the current one), delete the rest.")
@click.option("--forget", "forget", type=int, multiple=True,
              help="Delete generation N and its record too: it can no longer be rolled back to (repeatable).")
@click.option("--keep-records", type=click.IntRange(min=1), help="Drop the oldest records of cold generations beyond N.")
@click.option("--history", is_flag=True, help="Also print the profile's recent events (switches, checks, rollbacks).")
@click.option("--dry-run", is_flag=True, help="Say what would be deleted, delete nothing.")
@lock_timeout_option(locks.LOCK_TIMEOUT_S, "the profile's lock")
@click.pass_obj
def generations(obj: Context, profile: str, delete: tuple[int, ...], older_than: str | None, keep: int | None,
                forget: tuple[int, ...], keep_records: int | None, history: bool, dry_run: bool,
                lock_timeout: float) -> None:
    """List PROFILE's generations (number, date, hot or cold, engine version, store path, current),
    or delete some.

    A generation is hot while its store path is on disk, cold once it is gone (deleted, then
    collected); a cold generation can still be rolled back to from its record.

    \b
    Examples:
      llmgw-store generations vllm
      llmgw-store generations vllm --delete 3 --delete 4
      llmgw-store generations vllm --older-than 30d
      llmgw-store generations vllm --forget 2 --keep-records 50
    """
    from llmgw_store.roots import profiles

    if delete or older_than or keep is not None or forget or keep_records is not None:
        from llmgw_store.core.units import parse_duration

        r = profiles.delete_generations(profile, numbers=list(delete), keep=keep, dry_run=dry_run, root=obj.root,
                                        older_than=parse_duration(older_than) if older_than else None,
                                        forget=list(forget), keep_records=keep_records, lock_timeout=lock_timeout)
        verb = "would delete" if dry_run else "deleted"
        text = f"{profile}: {verb} generation(s) {', '.join(map(str, r.deleted)) or 'none'}"
        if r.forgotten:
            text += f"; {'would forget' if dry_run else 'forgot'} {', '.join(map(str, r.forgotten))}"
        if r.records_dropped:
            text += f"; dropped the records of {', '.join(map(str, r.records_dropped))}"
        obj.emit(r.to_json(), text)
        return
    r = profiles.generations(profile, root=obj.root, lock_timeout=lock_timeout)
    for line in r.index_differs:
        obj.progress(f"index differs: {line} (the next change of the profile records it)")
    for line in r.records_refused:
        obj.progress(f"record refused: {line}")

    def check_note(g) -> str:
        if g.rolled_back_to is not None:
            return f"  (check failed: rolled back to {g.rolled_back_to})"
        return f"  (check {g.check['result']})" if g.check else ""

    lines = [
        f"{g.number:5d}  {g.created[:20]}  {g.state:4s}  {g.engine or '?'} {g.version or '?'} ({g.variant or '?'})  "
        f"{g.path}{'  (current)' if g.current else ''}{check_note(g)}"
        for g in r.generations
    ]
    if history:
        lines.append("history:")
        lines += [f"  {str(e.get('at', '?'))[:19]}Z  {e.get('event')}  {_event_text(e)}" for e in r.history]
    # One line per generation or event, whatever a check's argv or a hand-edited history holds.
    obj.emit(r.to_json(), "\n".join(printable(line) for line in lines))


def _event_text(e: dict) -> str:
    by = e.get("by") or {}
    parts = [f"{k} {e[k]}" for k in ("from", "to", "generation", "name") if e.get(k) is not None]
    check = e.get("check")
    if isinstance(check, dict):
        argv = check.get("argv")
        parts.append(f"check `{' '.join(map(str, argv)) if isinstance(argv, list) else '?'}` {check.get('result')}")
    by = by if isinstance(by, dict) else {}
    who = str(by.get("user", "?")) + (f" (sudo by {by['sudo_user']})" if by.get("sudo_user") else "")
    return ", ".join(parts) + f"  by {who}"


@cli.command(name="list-profiles")
@click.pass_obj
def list_profiles(obj: Context) -> None:
    """List profiles with their current generation and store path."""
    from llmgw_store.roots.profiles import list_profiles as do_list

    r = do_list(root=obj.root)
    obj.emit(r.to_json(), "\n".join(f"{p.profile}  generation {p.current} of {p.generations}  {p.path}" for p in r.profiles))


@cli.command()
@click.argument("name")
@click.argument("path")
@lock_timeout_option(locks.LOCK_TIMEOUT_S, "a gc to let go of the gc lock")
@click.pass_obj
def pin(obj: Context, name: str, path: str, lock_timeout: float) -> None:
    """Keep PATH from gc under the pin NAME (ROOT/gcroots/NAME).

    \b
    Example:
      llmgw-store pin vllm-known-good /var/lib/llmgw-store/store/5x...-vllm-0.6.3-cu128
    """
    from llmgw_store.roots.pins import pin as do_pin

    r = do_pin(name, path, root=obj.root, lock_timeout=lock_timeout)
    obj.emit(r.to_json(), f"pinned {r.path} as {name}")


@cli.command()
@click.argument("name")
@lock_timeout_option(locks.LOCK_TIMEOUT_S, "the index")
@click.pass_obj
def unpin(obj: Context, name: str, lock_timeout: float) -> None:
    """Remove the pin NAME (the store path stays until a gc finds nothing else holds it)."""
    from llmgw_store.roots.pins import unpin as do_unpin

    r = do_unpin(name, root=obj.root, lock_timeout=lock_timeout)
    obj.emit(r.to_json(), f"unpinned {name} ({r.path})")


@cli.command()
@click.argument("a")
@click.argument("b")
@click.pass_obj
def diff(obj: Context, a: str, b: str) -> None:
    """Packages added, removed, upgraded and downgraded from A to B, and the size change.

    A and B are store paths (or names or keys), PROFILE (its current generation) or PROFILE@N.

    \b
    Example:
      llmgw-store diff vllm@6 vllm@7
    """
    from llmgw_store.core.units import human_size
    from llmgw_store.integrity.diff import diff as do_diff

    r = do_diff(a, b, root=obj.root)
    lines = [f"+ {p['name']} {p['version']}" for p in r.added]
    lines += [f"- {p['name']} {p['version']}" for p in r.removed]
    lines += [f"↑ {p['name']} {p['from']} -> {p['to']}" for p in r.upgraded]
    lines += [f"↓ {p['name']} {p['from']} -> {p['to']}" for p in r.downgraded]
    sign = "+" if r.size_change >= 0 else "-"
    lines.append(f"size: {human_size(r.a['size'])} -> {human_size(r.b['size'])} ({sign}{human_size(abs(r.size_change))})")
    obj.emit(r.to_json(), "\n".join(lines))


@cli.command()
@click.argument("target", metavar="PROFILE|PATH")
@click.pass_obj
def env(obj: Context, target: str) -> None:
    """Print shell lines (PATH, VIRTUAL_ENV) for a profile (following its later switches), or for
    PROFILE@N or a store path (its name, its key): eval "$(llmgw-store env vllm)"."""
    from llmgw_store.roots.runenv import env_lines, shell_text

    variables = env_lines(target, root=obj.root).variables
    obj.emit(variables, shell_text(variables).rstrip("\n"))


@cli.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("target", metavar="PROFILE|PATH")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.pass_obj
def run(obj: Context, target: str, command: tuple[str, ...]) -> None:
    """Run COMMAND in a profile's current generation (for service units), or in PROFILE@N or a
    store path (its name, its key).

    \b
    Example:
      llmgw-store run vllm -- vllm serve Qwen/Qwen2.5-7B-Instruct --port 8000
    """
    from llmgw_store.roots.runenv import exec_in

    argv = list(command[1:] if command[:1] == ("--",) else command)
    exec_in(target, argv, root=obj.root)


@cli.command()
@click.option("--dry-run", is_flag=True, help="Say what would be deleted and how much it frees; delete nothing.")
@click.option("--delete-older-than", metavar="DURATION", help="First delete generations older than this (30d, 12h), never the current one.")
@click.option("--keep", type=int, help="First delete all but the newest N generations of each profile (never the current one).")
@click.option("--max-freed", metavar="SIZE", help="Stop after freeing this much (50G), least recently used first.")
@click.option("--min-free", metavar="SIZE", help="Collect only until the filesystem has this much free; nothing if it has.")
@click.option("--max-cache", metavar="SIZE", help="Prune the uv and bytecode caches down to SIZE on disk: entries no live path uses first, least recently used first.")
@click.option("--prune-live", is_flag=True, help="With --max-cache: also prune entries live paths were built from (repair and cold rollback then need the network).")
@click.option("--keep-dead-for", metavar="DURATION", help="Keep a dead path that was rooted or used within DURATION (1h): a rollback right after a switch finds it.")
@click.option("--keep-records", type=click.IntRange(min=1), help="Keep at most N records of cold generations per profile (the oldest go; `rollback --to` needs a record).")
@lock_timeout_option(locks.LOCK_TIMEOUT_S, "the gc lock and each profile's lock (so cron tries again later)")
@click.option("--print-roots", is_flag=True, help="Print each gc root and the store paths it holds; collect nothing.")
@click.pass_obj
def gc(obj: Context, dry_run: bool, delete_older_than: str | None, keep: int | None, max_freed: str | None,
       min_free: str | None, max_cache: str | None, prune_live: bool, keep_dead_for: str | None,
       keep_records: int | None, lock_timeout: float, print_roots: bool) -> None:
    """Delete store paths no root holds (profiles, pins, running processes, builds in flight).

    Safe to run from cron while builds and activations run.

    \b
    Examples:
      llmgw-store gc --dry-run
      llmgw-store gc --delete-older-than 30d
      llmgw-store --json gc --min-free 100G
    """
    from llmgw_store.core.units import human_size, parse_duration, parse_size
    from llmgw_store.roots import gc as gcmod

    if print_roots:
        held = gcmod.print_roots(root=obj.root, lock_timeout=lock_timeout)
        obj.emit(held.to_json(), "\n".join(f"{desc}: {', '.join(names)}" for desc, names in sorted(held.roots.items())))
        return
    r = gcmod.collect(
        root=obj.root, dry_run=dry_run, keep=keep, lock_timeout=lock_timeout,
        delete_older_than=parse_duration(delete_older_than) if delete_older_than else None,
        max_freed=parse_size(max_freed) if max_freed else None,
        min_free=parse_size(min_free) if min_free else None,
        max_cache=parse_size(max_cache) if max_cache else None,
        keep_dead_for=parse_duration(keep_dead_for) if keep_dead_for else None, prune_live=prune_live,
        keep_records=keep_records,
    )
    verb = "would free" if dry_run else "freed"
    freed = sum(v for k, v in r.freed.items() if k != "stale_files")
    extra = f"; {len(r.kept_by_grace)} dead path(s) kept by --keep-dead-for" if r.kept_by_grace else ""
    if r.cache_pruned:
        extra += (f"; {r.cache_pruned['entries']} cache entr(ies) pruned ({human_size(r.cache_pruned['bytes'])})"
                  + (f", {r.cache_pruned['kept_live']} kept for live paths" if r.cache_pruned["kept_live"] else ""))
    obj.emit(r.to_json(), f"{len(r.deleted)} store path(s) {'to delete' if dry_run else 'deleted'}, {verb} "
                          f"{human_size(freed)} on disk in {r.seconds:.1f}s{extra}")


@cli.command(name="systemd-units")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=".", show_default=True,
              help="Directory for llmgw-store-gc.service and llmgw-store-gc.timer (e.g. /etc/systemd/system).")
@click.option("--keep-dead-for", default="1h", show_default=True, help="The gc's grace period for dead paths.")
@click.option("--on-calendar", default="*-*-* 04:17:00", show_default=True, help="When the timer runs gc (systemd OnCalendar).")
@click.pass_obj
def systemd_units(obj: Context, out_dir: str, keep_dead_for: str, on_calendar: str) -> None:
    """Write the gc service and timer for this installation: ExecStart is the llmgw-store running
    now, with the current --root.

    \b
    Example:
      llmgw-store systemd-units --out /etc/systemd/system && systemctl enable --now llmgw-store-gc.timer
    """
    from llmgw_store.roots.systemd import write_units

    r = write_units(out_dir, root=obj.root, keep_dead_for=keep_dead_for, on_calendar=on_calendar)
    obj.emit(r.to_json(), f"wrote {r.service}\nwrote {r.timer}\nExecStart={r.exec_start}")


@cli.command()
@click.argument("paths", nargs=-1)
@click.option("--repair", is_flag=True, help="Rebuild each damaged path from its recorded inputs and swap it in if the result checks out.")
@click.option("--uv", "uv_path", type=click.Path(dir_okay=False), envvar="LLMGW_STORE_UV", help="uv for --repair (must be the version the path was built with).")
@click.option("--python-preference", envvar="LLMGW_STORE_PYTHON_PREFERENCE", default=defaults.PYTHON_PREFERENCE, show_default=True,
              type=click.Choice(defaults.PYTHON_PREFERENCES), help="For --repair: where the interpreter may come from.")
@lock_timeout_option(locks.BUILD_LOCK_TIMEOUT_S, "each lock --repair takes (the gc lock, the key's)")
@click.pass_obj
def verify(obj: Context, paths: tuple[str, ...], repair: bool, uv_path: str | None, python_preference: str,
           lock_timeout: float) -> None:
    """Recompute the content hash of PATHS (store paths, names, keys, PROFILE or PROFILE@N; default:
    every store path) and compare with the manifest
    and the index; name modified, missing, extra and writable files. Exit 1 if any path is damaged.

    \b
    Examples:
      llmgw-store verify
      llmgw-store verify vllm@7 --repair
    """
    from llmgw_store.integrity.verify import verify as do_verify

    r = do_verify(list(paths) or None, root=obj.root, repair=repair, uv=uv_path,
                  python_preference=python_preference, lock_timeout=lock_timeout)
    lines = []
    for p in r.paths:
        state = "ok" if p["ok"] else ("repaired" if p.get("ok_after_repair") else "DAMAGED")
        lines.append(f"{state:8s} {p['path']}")
        for kind in ("modified", "missing", "extra", "writable"):
            lines += [f"           {kind}: {_quoted(f)}" for f in p[kind]]
        lines += [f"           foreign: {_quoted(f['path'])} (owner uid {f['uid']}"
                  + (f", xattrs {', '.join(map(_quoted, f['xattrs']))}" if f["xattrs"] else "") + ")"
                  for f in p.get("foreign", [])]
        lines += [f"           {msg}" for msg in p["problems"]]
    obj.emit(r.to_json(), "\n".join(lines))
    if r.damaged:
        obj.exit(1)


@cli.command()
@click.option("--rebuild-index", is_flag=True, help="Recreate the index from the manifests, profile links and pins (the old one is kept as a backup).")
@lock_timeout_option(locks.LOCK_TIMEOUT_S, "the gc lock (--rebuild-index)")
@click.pass_obj
def doctor(obj: Context, rebuild_index: bool, lock_timeout: float) -> None:
    """Check the index against the disk; exit 1 if they disagree. --rebuild-index recreates it.

    \b
    Examples:
      llmgw-store doctor
      llmgw-store doctor --rebuild-index
    """
    from llmgw_store.integrity.doctor import doctor as do_doctor

    r = do_doctor(root=obj.root, rebuild_index=rebuild_index, lock_timeout=lock_timeout)
    if rebuild_index:
        obj.emit(r.to_json(), f"index rebuilt: {len(r.registered)} path(s), {r.generations} generation(s), "
                              f"{r.pins} pin(s); {len(r.skipped)} directory(ies) left unregistered; "
                              + (f"old index kept in {r.backup}" if r.backup else "there was no old index"))
        return
    lines = [f"{kind.replace('_', ' ')}: {item}" for kind, items in r.problems.items() for item in items]
    obj.emit(r.to_json(), "\n".join(lines) or "index and disk agree")
    if not r.ok:
        obj.exit(1)


@cli.command()
@click.option("--dry-run", is_flag=True, help="Count what would be linked and freed; change nothing.")
@lock_timeout_option(locks.LOCK_TIMEOUT_S, "a gc to let go of the gc lock")
@click.pass_obj
def optimise(obj: Context, dry_run: bool, lock_timeout: float) -> None:
    """Hardlink identical files across store paths (through ROOT/store/.links) and report the bytes saved."""
    from llmgw_store.core.units import human_size
    from llmgw_store.integrity.optimise import optimise as do_optimise

    r = do_optimise(root=obj.root, dry_run=dry_run, lock_timeout=lock_timeout)
    obj.emit(r.to_json(), f"{r.files_linked} of {r.files_examined} file(s) {'would be ' if dry_run else ''}linked, "
                          f"{human_size(r.bytes_saved)} {'would be ' if dry_run else ''}freed")


@cli.command()
@click.option("--prometheus", type=click.Path(dir_okay=False), help="Also write the figures as a Prometheus textfile (atomically).")
@click.pass_obj
def stats(obj: Context, prometheus: str | None) -> None:
    """Paths, bytes (apparent and on disk after dedup), profiles, generations, cache sizes.

    \b
    Example (node_exporter's textfile collector, after each cron gc):
      llmgw-store stats --prometheus /var/lib/node_exporter/textfile/llmgw_store.prom
    """
    from llmgw_store.core.units import human_size
    from llmgw_store.integrity.stats import stats as do_stats

    r = do_stats(root=obj.root, prometheus=prometheus)
    obj.emit(r.to_json(), "\n".join([
        f"paths:        {r.paths} ({human_size(r.bytes_apparent)} apparent, {human_size(r.bytes_on_disk)} on disk)",
        f"profiles:     {r.profiles} with {r.generations} generation(s); {r.pins} pin(s)",
        f"uv cache:     {human_size(r.uv_cache_bytes)} apparent ({human_size(r.uv_cache_bytes_unshared)} on disk, not shared with environments)",
        f"pyc cache:    {human_size(r.pyc_cache_bytes)} on disk (caches together: {human_size(r.cache_bytes_on_disk)}, what gc --max-cache counts)",
        f"downloads:    {human_size(r.downloads_bytes)} on disk",
        f"free:         {human_size(r.free_bytes)}",
    ]))


@cli.command()
@click.argument("name")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=".", show_default=True,
              help="Directory for NAME.secret (mode 600) and NAME.public.")
@click.pass_obj
def keygen(obj: Context, name: str, out_dir: str) -> None:
    """Make an ed25519 key pair for signing pushes (NAME.secret) and trusting them (NAME.public).

    \b
    Example:
      llmgw-store keygen builder-1 --out /etc/llmgw-store
    """
    from llmgw_store.cache.signing import keygen as do_keygen

    r = do_keygen(name, out_dir)
    obj.emit(r.to_json(), f"secret key: {r.secret}\npublic key: {r.public} ({r.public_key})")


@cli.command()
@click.argument("paths", nargs=-1, required=True)
@click.option("--to", "to", required=True, help="Cache URL: file:///dir or http(s)://host/prefix (PUT).")
@click.option("--secret-key", required=True, envvar="LLMGW_STORE_SECRET_KEY", help="Signing key file (from keygen).")
@click.option("--format", "format_", type=click.IntRange(1, 2), default=2, show_default=True,
              help="Object format: 2 = files as shared blobs (delta pulls), 1 = one archive (older nodes).")
@lock_timeout_option(locks.LOCK_TIMEOUT_S, "the store's locks and a running cache gc's marker")
@click.pass_obj
def push(obj: Context, paths: tuple[str, ...], to: str, secret_key: str, format_: int, lock_timeout: float) -> None:
    """Upload store PATHS and what they reference to a binary cache, signed.

    \b
    Example:
      llmgw-store push vllm --to file:///srv/llmgw-cache --secret-key /etc/llmgw-store/builder-1.secret
    """
    from llmgw_store.api import push as do_push

    r = do_push(list(paths), to, secret_key, root=obj.root, format=format_, lock_timeout=lock_timeout)
    obj.emit(r.to_json(), f"pushed {len(r.pushed)}, already there {len(r.already_there)}")


@cli.command()
@click.argument("target")
@click.option("--from", "from_", multiple=True, required=True, help="Cache URL; repeatable (asked in order).")
@click.option("--trusted-key", "trusted_keys", multiple=True, help="Public key accepted (name:base64 or a .public file).")
@lock_timeout_option(locks.BUILD_LOCK_TIMEOUT_S, "each lock (another process fetching the same key, a gc)")
@click.pass_obj
def pull(obj: Context, target: str, from_: tuple[str, ...], trusted_keys: tuple[str, ...], lock_timeout: float) -> None:
    """Fetch a store path (by key or store path name) and its references from a binary cache.

    \b
    Example:
      llmgw-store pull 5x...-vllm-0.33.0-cu130 --from https://cache.internal/llmgw --trusted-key builder-1.public
    """
    from llmgw_store.cache.pull import pull as do_pull

    r = do_pull(target, list(from_), list(trusted_keys), root=obj.root, lock_timeout=lock_timeout)
    obj.emit(r.to_json(), r.path)


def main() -> None:
    cli(prog_name=PROG)


@cli.command("push-roots")
@click.option("--to", "to", required=True, help="Cache URL: file:///dir, http(s)://host/prefix or s3://bucket/prefix.")
@click.option("--secret-key", required=True, envvar="LLMGW_STORE_NODE_SECRET_KEY",
              help="This node's signing key file (from keygen); the cache gc trusts its .public with --keep-from.")
@click.option("--node", help="The node's name in the cache: the secret key's name (the default); another is refused.")
@click.pass_obj
def push_roots(obj: Context, to: str, secret_key: str, node: str | None) -> None:
    """Publish the keys this node's roots hold (profiles, pins, paths in use) as a signed roots
    document, which `cache gc` keeps.

    \b
    Example:
      llmgw-store push-roots --to s3://llmgw-cache/prod --secret-key /etc/llmgw-store/node-7.secret
    """
    from llmgw_store.api import push_roots as do_push_roots

    r = do_push_roots(to, secret_key, node=node, root=obj.root)
    obj.emit(r.to_json(), f"{r.object}: {len(r.keys)} store path(s)")


@cli.group()
def cache() -> None:
    """Binary-cache maintenance."""


@cache.command("gc")
@click.argument("url")
@click.option("--keep-from", "keep_from", multiple=True, required=True,
              help="Public key (name:base64 or a .public file) of a node whose roots document is honoured; repeatable.")
@click.option("--grace", default="1d", show_default=True,
              help="Keep whatever was written more recently than this (pushes not yet in a roots document).")
@click.option("--dry-run", is_flag=True, help="List what would be deleted; delete nothing.")
@click.option("--allow-no-roots", is_flag=True,
              help="Go on when the cache holds no roots document (deletes every object older than the grace).")
@click.pass_obj
def cache_gc(obj: Context, url: str, keep_from: tuple[str, ...], grace: str, dry_run: bool,
             allow_no_roots: bool) -> None:
    """Delete the objects and blobs of the cache URL that no published roots document holds.

    \b
    Example:
      llmgw-store cache gc s3://llmgw-cache/prod --keep-from /etc/llmgw-store/nodes/ --grace 7d --dry-run
    """
    from llmgw_store.api import cache_gc as do_cache_gc

    r = do_cache_gc(url, list(keep_from), grace=grace, dry_run=dry_run, allow_no_roots=allow_no_roots)
    verb = "would delete" if r.dry_run else "deleted"
    summary = (f"{verb} {len(r.deleted_objects)} object file(s), {r.deleted_blobs} blob(s), "
               f"{r.freed_bytes / 1e6:.1f} MB; kept {r.kept_objects} object(s), {r.kept_blobs} blob(s) for "
               f"{len(r.roots)} node(s)")
    obj.emit(r.to_json(), "\n".join([*r.deleted_objects, summary]))
