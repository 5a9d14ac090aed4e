"""The console script's first step: answer a cache-hit `build` before click and the library load,
and run `activate` of a store path and `rollback` without click.

`llmgw-store [--root R] [--json] [-v] build RECIPE [build options]` whose build memo entry
(core/buildmemo.py) is still true prints the store path (or, with --json, the document the full
command prints) and records the use (a stamp, core/uses.py). Anything else — another command, an
option this parser does not know, a malformed or repeated option, no entry, an entry no longer
true, any error at all — falls through to the click app with argv untouched, which then does
everything a build does. So this module only ever answers what the full command would answer.

Options are read as click reads them (group options before the command; `--opt value` or
`--opt=value`; the environment variables LLMGW_STORE_ROOT, LLMGW_STORE_UV and
LLMGW_STORE_PYTHON_PREFERENCE); --lock-timeout, --substituter and --trusted-key do not change a hit
(a hit asks no cache and takes no lock) and are only checked for shape.
Imports: os, sys, stat, _blake2 (and json with --json): nothing else is loaded on a hit.

`activate PROFILE STORE-PATH` and `rollback PROFILE [--to N]` (with --lock-timeout, --root, --json,
-v, and nothing else) call the same library function the click commands call and print the same
lines and exit codes (click's load is a third of their time); anything else goes to click.
"""

from __future__ import annotations

import os
import sys

PROG = "llmgw-store"
# Copies of core/defaults.py, which imports nothing but is a module more to load; tests check they agree.
PYPI_SIMPLE = "https://pypi.org/simple"
PYTHON_PREFERENCES = ("only-managed", "managed", "system", "only-system")
PYTHON_PREFERENCE = "managed"

VALUE_OPTIONS = {"--version": "version", "--variant": "variant", "--as-of": "as_of", "--index-url": "index_url",
                 "--uv": "uv", "--python-preference": "python_preference", "--lock-timeout": "lock_timeout"}
MULTI_OPTIONS = ("--substituter", "--trusted-key")


def group_options(argv: list[str]) -> tuple[dict, int] | None:
    """The group's options this path knows (--root, --json, -v) and where the command starts, or
    None when there is another (click's, then)."""
    opts: dict = {"root": None, "json": False, "verbose": 0}
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        a = argv[i]
        if a == "--json" and not opts["json"]:
            opts["json"] = True
        elif a in ("-v", "--verbose"):
            opts["verbose"] += 1
        elif a == "--root" and i + 1 < len(argv) and opts["root"] is None:
            i += 1
            opts["root"] = argv[i]
        elif a.startswith("--root=") and opts["root"] is None:
            opts["root"] = a[len("--root="):]
        else:
            return None
        i += 1
    return opts, i


def parse(argv: list[str]) -> dict | None:
    """The build's options from argv, or None when argv is not a plain `build` this path handles."""
    found = group_options(argv)
    if found is None:
        return None
    opts, i = found
    if i >= len(argv) or argv[i] != "build":
        return None
    i += 1
    recipe = None
    while i < len(argv):
        a = argv[i]
        if a == "--":
            return None
        if not a.startswith("-") or a == "-":
            if recipe is not None:
                return None
            recipe = a
            i += 1
            continue
        name, eq, value = a.partition("=")
        if name in VALUE_OPTIONS or name in MULTI_OPTIONS:
            if not eq:
                if i + 1 >= len(argv):
                    return None
                i += 1
                value = argv[i]
            key = VALUE_OPTIONS.get(name)
            if key is not None:
                if key in opts:
                    return None  # repeated: left to click
                opts[key] = value
        else:
            return None  # --help and anything unknown: click says what it is
        i += 1
    if not recipe:
        return None
    opts["recipe"] = recipe
    if "lock_timeout" in opts:
        try:
            if not float(opts["lock_timeout"]) >= 0:
                return None
        except ValueError:
            return None
    env = os.environ
    if env.get("LLMGW_STORE_PYTHON"):
        return None  # --python's variable: such a build is never memoised (builder.build)
    if opts["root"] is None:
        opts["root"] = env.get("LLMGW_STORE_ROOT") or None
    if "uv" not in opts:
        opts["uv"] = env.get("LLMGW_STORE_UV") or None
    if "python_preference" not in opts:
        opts["python_preference"] = env.get("LLMGW_STORE_PYTHON_PREFERENCE") or PYTHON_PREFERENCE
    if opts["python_preference"] not in PYTHON_PREFERENCES:
        return None
    opts.setdefault("index_url", PYPI_SIMPLE)
    for k in ("version", "variant", "as_of"):
        opts.setdefault(k, None)
    return opts


def default_root() -> str:
    """layout.default_root, without pathlib."""
    if os.geteuid() == 0:
        return "/var/lib/llmgw-store"
    data = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(data, "llmgw-store")


def absolute(path: str) -> str | None:
    """What Path(path).absolute() gives (layout.Layout.at), so the path printed is the full command's:
    empty and `.` components dropped, `..` kept. None for a `//` start (pathlib keeps it)."""
    if not path.startswith("/"):
        path = os.getcwd() + "/" + path
    elif path.startswith("//") and not path.startswith("///"):
        return None
    return "/" + "/".join(c for c in path.split("/") if c not in ("", "."))


def try_hit(argv: list[str], started: float) -> bool:
    """Answer `argv` from the build memo if it is a cache hit; False (nothing printed) otherwise."""
    import time

    opts = parse(argv)
    if opts is None:
        return False
    from llmgw_store.core import buildmemo, uses

    try:
        fd = os.open(opts["recipe"], os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        data = os.read(fd, (1 << 20) + 1)
    finally:
        os.close(fd)
    if len(data) > 1 << 20:
        return False
    root = absolute(opts["root"] or default_root())
    if root is None:
        return False
    digest = buildmemo.memo_key(opts["recipe"], data, opts["version"], opts["variant"], opts["as_of"],
                                opts["index_url"], opts["uv"], opts["python_preference"])
    entry = buildmemo.read(root, digest)
    if entry is None:
        return False
    uses.touch_root(root, entry["name"])
    path = os.path.join(root, "store", entry["name"])
    if opts["json"]:
        import json

        doc = {f: entry[f] for f in buildmemo.FIELDS}
        doc["uv_version"] = doc.pop("uv")  # as BuildResult.to_json: the same document as the full command's
        doc.update(schema_version=1, path=path, how="hit", cache_hit=True, steps={},
                   seconds=round(time.monotonic() - started, 3))
        out = json.dumps(doc, indent=2, sort_keys=True)
    else:
        out = path
    if opts["verbose"]:
        sys.stderr.write(f"[{time.monotonic() - started:6.1f}s] {entry['name']} is in the store (build memo)\n")
    sys.stdout.write(out + "\n")
    sys.stdout.flush()
    return True


# What click reads as a true or false boolean flag from its environment variable.
ENV_TRUE = ("1", "true", "t", "yes", "y", "on")
ENV_FALSE = ("", "0", "false", "f", "no", "n", "off")


def parse_switch(argv: list[str]) -> dict | None:
    """`activate PROFILE STORE-PATH` or `rollback PROFILE [--to N]`, each with [--lock-timeout S]:
    the options, or None (left to click). A recipe target, any build option, --help: click's."""
    found = group_options(argv)
    if found is None:
        return None
    opts, i = found
    if i >= len(argv) or argv[i] not in ("activate", "rollback"):
        return None
    opts["command"] = argv[i]
    allowed = ("--lock-timeout",) if argv[i] == "activate" else ("--lock-timeout", "--to")
    args: list[str] = []
    i += 1
    while i < len(argv):
        a = argv[i]
        if a.startswith("-") and a != "-":
            name, eq, value = a.partition("=")
            if name not in allowed or name in opts:
                return None
            if not eq:
                if i + 1 >= len(argv):
                    return None
                i += 1
                value = argv[i]
            opts[name] = value
        else:
            args.append(a)
        i += 1
    if len(args) != (2 if opts["command"] == "activate" else 1):
        return None
    if opts["command"] == "activate" and args[1].endswith(".toml"):
        return None
    if os.environ.get("LLMGW_STORE_PYTHON_PREFERENCE", PYTHON_PREFERENCE) not in PYTHON_PREFERENCES:
        return None  # click says what is wrong with it
    for flag in ("LLMGW_STORE_SUBSTITUTE_ONLY", "LLMGW_STORE_OFFLINE"):
        if os.environ.get(flag, "").strip().lower() not in ENV_TRUE + ENV_FALSE:
            return None  # click says what is wrong with it
    try:
        if "--lock-timeout" in opts and not float(opts["--lock-timeout"]) >= 0:
            return None
        if "--to" in opts:
            opts["--to"] = int(opts["--to"])
    except ValueError:
        return None
    opts["args"] = args
    if opts["root"] is None:
        opts["root"] = os.environ.get("LLMGW_STORE_ROOT") or None
    return opts


def switch(argv: list[str], started: float) -> int | None:
    """Run `activate` of a store path or `rollback` as the click commands do, without click: the same
    library call, output, progress lines, error line and exit code. None when argv is not one."""
    import time

    opts = parse_switch(argv)
    if opts is None:
        return None
    from llmgw_store.core import locks
    from llmgw_store.core.errors import CommandError, StoreError, translated
    from llmgw_store.core.report import reporting_to

    def progress(message: str) -> None:
        if message.startswith("$ ") and opts["verbose"] < 1:
            return
        sys.stderr.write(f"[{time.monotonic() - started:6.1f}s] {message}\n")

    profile = opts["args"][0]
    try:
        with reporting_to(progress), translated():  # a full or read-only disk: one line, exit 1
            if opts["command"] == "activate":
                from llmgw_store.api import activate

                timeout = float(opts.get("--lock-timeout", locks.BUILD_LOCK_TIMEOUT_S))
                r = activate(profile, opts["args"][1], None, root=opts["root"], lock_timeout=timeout)
                text = (f"{profile}: generation {r.generation} -> {r.path}" if r.changed
                        else f"{profile}: already at generation {r.generation} -> {r.path}")
            else:
                from llmgw_store.api import rollback  # a cold generation comes back from its record

                timeout = float(opts.get("--lock-timeout", locks.LOCK_TIMEOUT_S))
                env = os.environ  # what click's rollback reads from the environment, for a cold generation
                r = rollback(profile, to=opts.get("--to"), root=opts["root"], lock_timeout=timeout,
                             substituters=tuple(env.get("LLMGW_STORE_SUBSTITUTERS", "").split()),
                             uv=env.get("LLMGW_STORE_UV") or None,
                             python_preference=env.get("LLMGW_STORE_PYTHON_PREFERENCE") or None,
                             substitute_only=env.get("LLMGW_STORE_SUBSTITUTE_ONLY", "").strip().lower() in ENV_TRUE,
                             offline=env.get("LLMGW_STORE_OFFLINE", "").strip().lower() in ENV_TRUE,
                             index_url=env.get("LLMGW_STORE_INDEX_URL") or None)
                back = f" (cold: {r.rebuilt})" if r.rebuilt else ""
                text = f"{profile}: generation {r.previous} -> {r.generation} ({r.path}){back}"
    except StoreError as err:
        sys.stderr.write(f"{PROG}: error: {err}\n")
        if isinstance(err, CommandError) and err.output_tail and opts["verbose"]:
            sys.stderr.write(err.output_tail + "\n")
        return err.exit_code
    except KeyboardInterrupt:
        sys.stderr.write(f"{PROG}: interrupted\n")
        return 130
    except Exception as exc:  # noqa: BLE001 - a bug: one line, as the click app says it
        if opts["verbose"]:
            import traceback

            traceback.print_exc()
        sys.stderr.write(f"{PROG}: internal error: {type(exc).__name__}: {exc} (run with -v for the traceback)\n")
        return 1
    if opts["json"]:
        import json

        sys.stdout.write(json.dumps(r.to_json(), indent=2, sort_keys=True, default=str) + "\n")
    else:
        sys.stdout.write(text + "\n")
    sys.stdout.flush()
    return 0


def main() -> None:
    """The console script: the fast paths, else the click app."""
    import time

    started = time.monotonic()
    argv = sys.argv[1:]
    try:
        if try_hit(argv, started):
            return
    except BrokenPipeError:
        raise
    except Exception:  # noqa: BLE001, S110 - anything unexpected: the full command does it properly
        pass
    code = switch(argv, started)
    if code is not None:
        sys.exit(code)
    from llmgw_store.cli.main import main as full

    full()
