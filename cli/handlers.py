"""What `build`, `activate` and `rollback` do once their arguments are parsed, free of click: the
click commands (cli/commands/) and the fast path (cli/fast.py) call these same functions with the
same parameters (cli/spec.py), so both run the same library call and print the same lines.

Each takes the command's Context (cli/output.py) and its parameters by their declared names, and
imports the library only when it runs (a switch must not load the builder, a hit not even SQLite).
"""

from __future__ import annotations

import os
import time


def options_from(kw: dict):
    """The BuildOptions a build's parameters give (their names are BuildOptions' fields)."""
    from llmgw_store.build.plan import BuildOptions

    return BuildOptions(version=kw["version"], variant=kw["variant"], as_of=kw["as_of"], index_url=kw["index_url"],
                        uv=kw["uv"], python_preference=kw["python_preference"], lock_timeout=kw["lock_timeout"],
                        substitute_only=kw["substitute_only"], offline=kw["offline"], python=kw.get("python"))


def caches_from(kw: dict) -> dict:
    """The binary caches a build asks, whose keys it trusts, and how it talks to them."""
    return {"substituters": tuple(kw["substituters"]), "trusted_keys": tuple(kw["trusted_keys"]),
            "cache_network": cache_network(kw)}


def cache_network(kw: dict) -> dict:
    """The `cache.*` settings given (flag, variable or config file) as RetryPolicy's fields; the
    policy is made only when a cache is asked (api._substituter)."""
    from llmgw_store.cli.spec import CACHE_NETWORK

    out = {n: kw.get(f"cache_{n}") for n in CACHE_NETWORK}
    out["redirects_to"] = " ".join(out["redirects_to"] or ()) or None
    return {k: v for k, v in out.items() if v is not None}


def quoted(name: str) -> str:
    """A file name on one line of human output: as it is when printable, else repr (a newline in a
    name cannot start a line of its own, such as a forged `identical:`)."""
    return name if name.isprintable() else repr(name)


# -- build ------------------------------------------------------------------------------------------


def build(ctx, kw: dict) -> None:
    if kw["check"]:
        return _build_check(ctx, kw)
    from llmgw_store.api import build as do_build

    result = do_build(kw["recipe"], options_from(kw), **caches_from(kw), root=ctx.root)
    doc = result.to_json()
    if ctx.verbose:
        doc["inputs"] = result.inputs  # -v --json: what a builder and a node compare when their keys differ
    ctx.emit(doc, str(result.path))


def memo_answer(ctx, kw: dict) -> bool:
    """Answer a `build` from the build memo (build/memo.py) if it is a cache hit: print what the
    full command would print for it, record the use, and return True; False (nothing printed, nothing
    changed) otherwise, and the full command builds."""
    from llmgw_store.build import memo as buildmemo
    from llmgw_store.core import uses

    if kw.get("python"):
        return False  # --python: never memoised (builder.build), the full command builds or finds it
    if ctx.verbose and ctx.as_json:
        return False  # -v --json carries the key's inputs, which the memo does not hold
    recipe = kw["recipe"]
    try:
        fd = os.open(recipe, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        data = os.read(fd, buildmemo.MAX_RECIPE_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > buildmemo.MAX_RECIPE_BYTES:
        return False
    root = absolute(ctx.root or default_root())
    if root is None:
        return False
    entry = buildmemo.read(root, buildmemo.memo_key(recipe, data, {k: kw[k] for k in buildmemo.KEY_OPTIONS}))
    if entry is None:
        return False
    uses.touch_root(root, entry["name"])
    path = os.path.join(root, "store", entry["name"])
    if ctx.verbose:
        ctx.progress(f"{entry['name']} is in the store (build memo)")
    doc: dict[str, object] = {f: entry[f] for f in buildmemo.FIELDS}
    doc["uv_version"] = doc.pop("uv")  # as BuildResult.to_json: the same document as the full command's
    doc.update(schema_version=1, path=path, how="hit", cache_hit=True, steps={}, seconds=round(time.monotonic() - ctx.started, 3))
    ctx.emit(doc, path)
    return True


def default_root() -> str:
    """layout.default_root, without pathlib (the root was neither given nor set in the environment
    nor in the config file)."""
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


def _build_check(ctx, kw: dict) -> None:
    from llmgw_store.build.check import check as do_check
    from llmgw_store.cli.output import PROG, write

    r = do_check(kw["recipe"], options_from(kw), root=ctx.root)
    if r.identical:
        ctx.emit(r.to_json(), f"identical: {r.path} ({r.files} entries, content hash {r.content_hash})")
        return
    n = len(r.differences) + len(r.problems)
    lines = [f"{r.path}: {n} entr{'y differs' if n == 1 else 'ies differ'}"]
    lines += [f"  {msg}" for msg in r.problems]
    for d in r.differences:
        store, rebuilt = d["store"], d["rebuilt"]
        lines.append(f"  {quoted(d['path'])}  store: {_side(store)}  rebuilt: {_side(rebuilt)}")
    ctx.emit(r.to_json(), "\n".join(lines))
    import sys

    write(sys.stderr, f"{PROG}: {r.name} differs from its rebuild in {n} entr{'y' if n == 1 else 'ies'} "
                      "(not reproducible, or changed since it was built: `verify` tells which)\n")
    ctx.exit(1)


def _side(s: dict | None) -> str:
    if s is None:
        return "absent"
    what = quoted(s["target"]) if "target" in s else (s["digest"][:12] if "digest" in s else "")
    extra = [f"uid {s['uid']}"] + ([f"xattrs {','.join(map(quoted, s['xattrs']))}"] if s.get("xattrs") else [])
    return " ".join(str(x) for x in (s["kind"], s.get("mode", ""), what, *extra) if x)


# -- profiles ---------------------------------------------------------------------------------------


def activate(ctx, kw: dict) -> None:
    from llmgw_store.api import activate as do_activate
    from llmgw_store.base.errors import UsageError

    if kw["no_check"] and kw["check"] is not None:
        raise UsageError("--no-check and --check exclude each other")
    check = None
    if kw["check"] is not None:
        from llmgw_store.roots.health import parse as parse_check

        check = parse_check(kw["check"])
    target, profile = kw["target"], kw["profile"]
    if kw.get("release") is not None or not target:
        return _activate_release(ctx, kw, check)
    # Build options are made (and the builder loaded) only for a recipe.
    options = options_from(kw) if target.endswith(".toml") else None
    r = do_activate(profile, target, options, **caches_from(kw), root=ctx.root, lock_timeout=kw["lock_timeout"],
                    check=check, no_check=kw["no_check"], check_timeout=kw["check_timeout"],
                    then_check=kw["then_check"], keep_records=kw["keep_records"])
    doc = r.to_json()
    if ctx.verbose and ctx.as_json:
        from llmgw_store.integrity.queries import path_info

        doc["inputs"] = path_info(r.path, root=ctx.root).row.inputs  # the key's, as for build -v --json
    ctx.emit(doc, _activated(profile, doc))


def followed(words) -> dict[str, str]:
    """profile -> release, from the `releases` setting's PROFILE=RELEASE words (cli/config.py)."""
    from llmgw_store.base.errors import UsageError

    out = {}
    for w in words:
        profile, eq, release = w.partition("=")
        if not eq or not profile or not release:
            raise UsageError(f"releases: {w[:80]!r} is not PROFILE=RELEASE")
        out[profile] = release
    return out


def _activate_release(ctx, kw: dict, check) -> None:
    """`activate PROFILE --release NAME`: what the signed pointer names (api.activate_release)."""
    from llmgw_store.api import activate_release
    from llmgw_store.base.errors import UsageError
    from llmgw_store.cache.releases import iso
    from llmgw_store.roots.holds import Held

    profile, release = kw["profile"], kw.get("release")
    if release is None and not kw["target"]:
        release = followed(kw.get("releases") or ()).get(profile)
    if release is None:
        raise UsageError("activate needs TARGET (a store path, PROFILE@N, a RECIPE.toml) or --release NAME (or the "
                         f"release {profile} follows: releases = {{{profile} = \"NAME\"}} in the config file)")
    if kw["target"]:
        raise UsageError("TARGET and --release exclude each other: the release names what to activate")
    try:
        r, pointer = activate_release(profile, release, substituters=tuple(kw["substituters"]),
                                      trusted_keys=tuple(kw["trusted_keys"]), root=ctx.root,
                                      lock_timeout=kw["lock_timeout"], cache_network=cache_network(kw),
                                      offline=kw["offline"], check=check, no_check=kw["no_check"],
                                      check_timeout=kw["check_timeout"], then_check=kw["then_check"],
                                      keep_records=kw["keep_records"])
    except Held as exc:  # the node's decision over the builder's: nothing switched (exit 0)
        hold = exc.hold
        doc = {**hold.to_json(), "held": True, "changed": False, "release": release}
        ctx.emit(doc, f"{profile}: held at {hold.name} since {hold.since} (release {release} not followed; "
                      f"`llmgw-store unhold {profile}`)")
        return
    doc = r.to_json()
    doc["release"] = {"release": pointer.release, "cache": pointer.cache, **pointer.entry(), "time": iso(pointer.time)}
    checked = f" (check {r.check['result']})" if r.check else ""
    via = f" (release {release}, sequence {pointer.seq})"
    text = (f"{profile}: generation {r.generation} -> {r.path}{checked}{via}" if r.changed
            else f"{profile}: already at generation {r.generation} -> {r.path}{via}")
    ctx.emit(doc, text)


def _activated(profile: str, doc: dict) -> str:
    """The line `activate` prints for its result document."""
    checked = f" (check {doc['check']['result']})" if doc["check"] else ""
    return (f"{profile}: generation {doc['generation']} -> {doc['path']}{checked}" if doc["changed"]
            else f"{profile}: already at generation {doc['generation']} -> {doc['path']}")


def _rolled_back(profile: str, doc: dict) -> str:
    """The line `rollback` prints for its result document."""
    back = f" (cold: {doc['rebuilt']})" if doc["rebuilt"] else ""
    return f"{profile}: generation {doc['previous']} -> {doc['generation']} ({doc['path']}){back}"


def switch_answer(ctx, command: str, kw: dict) -> bool:
    """Answer `activate` or `rollback` from roots/switch.py when it is the common case (a
    registered store path or a hot generation, no check): print what the full command would print
    and return True; False (nothing printed, nothing changed) otherwise, and the full command runs."""
    from llmgw_store.roots import switch

    root = absolute(ctx.root or default_root())
    if root is None:
        return False
    profile = kw["profile"]
    if command == "activate":
        target = kw["target"]
        if kw["check"] is not None or kw["then_check"]:
            return False
        if kw.get("release") is not None or not target:
            return _follow_answer(ctx, root, kw)
        if target.endswith(".toml"):
            return False
        done = switch.activate(root, profile, target, lock_timeout=kw["lock_timeout"], no_check=kw["no_check"],
                               keep_records=kw["keep_records"])
        if done is None:
            return False
        ctx.emit(done[0], _activated(profile, done[0]))
        return True
    doc = switch.rollback(root, profile, kw["to"])
    if doc is None:
        return False
    ctx.emit(doc, _rolled_back(profile, doc))
    return True


def _follow_answer(ctx, root: str, kw: dict) -> bool:
    """Answer a follow of a release that has not moved from roots/follow.py (one read of the
    pointer, checked, against this node's mark and the profile's generation): print what
    _activate_release prints for it and return True; False (nothing printed, nothing changed)
    otherwise, and the full command follows."""
    profile, release = kw["profile"], kw.get("release")
    if kw["target"]:
        return False  # with --release: the full command's usage error
    if release is None:
        try:
            release = followed(kw.get("releases") or ()).get(profile)
        except Exception:  # a malformed word: the full command's usage error
            return False
        if release is None:
            return False
    from llmgw_store.roots import follow

    done = follow.noop(root, profile, release, substituters=tuple(kw["substituters"]),
                       trusted=tuple(kw["trusted_keys"]), environ=os.environ, offline=kw["offline"],
                       no_check=kw["no_check"], cache_network=cache_network(kw))
    if done is None:
        return False
    doc, pointer = done
    from llmgw_store.cache.pointer import iso

    entry = {f: pointer[f] for f in ("seq", "time", "key", "name", "signer")}
    doc["release"] = {"release": release, "cache": pointer["cache"], **entry, "time": iso(pointer["time"])}
    ctx.emit(doc, f"{profile}: already at generation {doc['generation']} -> {doc['path']} (release {release}, "
                  f"sequence {pointer['seq']})")
    return True


def rollback(ctx, kw: dict) -> None:
    from llmgw_store.api import rollback as do_rollback

    profile = kw["profile"]
    r = do_rollback(profile, to=kw["to"], substituters=tuple(kw["substituters"]),
                    trusted_keys=tuple(kw["trusted_keys"]), uv=kw["uv"], python_preference=kw["python_preference"],
                    root=ctx.root, lock_timeout=kw["lock_timeout"], substitute_only=kw["substitute_only"],
                    offline=kw["offline"], index_url=kw["index_url"], cache_network=cache_network(kw))
    ctx.emit(r.to_json(), _rolled_back(profile, r.to_json()))


# -- reads ------------------------------------------------------------------------------------------


def listed(doc: dict) -> str:
    """The lines `list` prints for its result document."""
    from llmgw_store.base.text import human_size

    return "\n".join(f"{p['path']}  {human_size(p['size']):>10}  {p['files']:6d} entries  last used "
                     f"{p['last_used'][:19]}Z" for p in doc["paths"])


def described(doc: dict) -> str:
    """The lines `info` prints for its result document."""
    from llmgw_store.base.text import human_size

    manifest = doc["manifest"] or {}
    return "\n".join([
        f"path:         {doc['path']}",
        f"engine:       {doc['engine']} {doc['version']} ({doc['variant']})",
        f"key:          {doc['key']}",
        f"as of:        {doc['as_of']}",
        f"uv:           {doc['uv_version']}",
        f"python:       {doc['python']}",
        f"size:         {human_size(doc['size'])} in {doc['files']} entries",
        f"content hash: {doc['content_hash']}",
        f"built:        {doc['created']} in {doc['build_seconds']:.1f}s",
        f"last used:    {doc['last_used']}",
        f"requirements: {', '.join(manifest.get('requirements', []))}",
    ])


def read_answer(ctx, command: str, kw: dict) -> bool:
    """Answer `list`, `info`, `env` or a `generations` listing from integrity/reads.py when it is the common case: print what the
    full command would print and return True; False (nothing printed) otherwise, and the full
    command runs."""
    from llmgw_store.integrity import reads

    root = absolute(ctx.root or default_root())
    if root is None:
        return False
    if command == "list":
        doc = reads.list_paths(root)
        if doc is None:
            return False
        ctx.emit(doc, listed(doc))
        return True
    if command == "env":
        doc = reads.env_lines(root, kw["target"], os.environ.get("PATH", ""))
        if doc is None:
            return False
        ctx.emit(doc, "\n".join(f"export {k}={reads.shell_quoted(v)}" for k, v in doc["variables"].items()))
        return True
    if command == "generations":
        from llmgw_store.cli.spec import GENERATIONS_CHANGES

        if any(kw[n] not in (None, ()) for n in GENERATIONS_CHANGES):
            return False  # a deletion: the click command's
        doc = reads.generations(root, kw["profile"], tuple(kw["substituters"]), kw["substitute_only"])
        if doc is None:
            return False
        ctx.emit(doc, generations_text(kw["profile"], doc, kw["history"]))
        return True
    doc = reads.path_info(root, kw["path"])
    if doc is None:
        return False
    ctx.emit(doc, described(doc))
    return True


def generations_text(profile: str, doc: dict, history: bool) -> str:
    """The lines `generations PROFILE` prints for its result document (`history`: --history)."""
    from llmgw_store.base.text import printable
    from llmgw_store.integrity.reads import COMES_FROM

    def check_note(g: dict) -> str:
        if g["rolled_back_to"] is not None:
            return f"  (check failed: rolled back to {g['rolled_back_to']})"
        return f"  (check {g['check']['result']})" if g["check"] else ""

    lines = [
        f"{g['number']:5d}  {g['created'][:20]}  {g['state']:4s}  {g['engine'] or '?'} {g['version'] or '?'} "
        f"({g['variant'] or '?'})  {g['path']}{'  (current)' if g['current'] else ''}{check_note(g)}"
        + (f"  (way back: {COMES_FROM[g['comes_from']]})" if g["comes_from"] else "")
        for g in doc["generations"]
    ]
    held = doc["held"]
    if held:
        lines.append(f"held at {held['name']} since {held['since']}: its release is not followed "
                     f"(`llmgw-store unhold {profile}`)")
    if history:
        lines.append("history:")
        lines += [f"  {str(e.get('at', '?'))[:19]}Z  {e.get('event')}  {_event_text(e)}" for e in doc["history"]]
    # One line per generation or event, whatever a check's argv or a hand-edited history holds.
    return "\n".join(printable(line) for line in lines)


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


# -- config -----------------------------------------------------------------------------------------


def config_shown(loaded: str | None, values: dict, config_flag: str | None, flags: dict, environ) -> tuple[dict, str]:
    """`config`'s document and lines: every setting in effect and where it comes from. `loaded`:
    the config file read (None: none), `values` its values, `config_flag` --config as given,
    `flags` the group's settings given on the command line (param -> value)."""
    from llmgw_store.app.credentials import public_url
    from llmgw_store.cli import config

    def public(value: object) -> object:
        return public_url(value) if isinstance(value, str) else value

    path, explicit = config.locate(config_flag, environ)
    settings: dict[str, dict[str, object]] = {}  # name -> the --json document's entry
    for s in config.SETTINGS:
        try:
            value, source = config.effective(s, flags.get(s.param), environ, values)
        except ValueError:
            value, source = environ[s.env], "env (not a valid value: the commands that take it refuse it)"
        # Shown without credentials (an index token, a cache's password): both outputs are for eyes and logs.
        value = [public(v) for v in value] if isinstance(value, (tuple, list)) else public(value)
        settings[s.name] = {"value": value, "source": source,
                            "flag": s.flag, "env": s.env, "key": s.name,
                            "commands": ["(every command)"] if config.GLOBAL in s.commands or "*" in s.commands
                            else list(s.commands)}
    file_line = (loaded if loaded is not None else
                 f"none ({path} does not exist)" if path is not None and not explicit else "none")
    width = max(len(n) for n in settings)
    lines = [f"config file: {file_line}"]
    for name, d in settings.items():
        v = d["value"]
        shown = (" ".join(map(str, v)) or "(none)") if isinstance(v, list) else (
            _unset(name) if v is None else str(v))
        source = str(d["source"])
        where = {"flag": str(d["flag"]), "env": f"env {d['env']}", "file": "config file"}.get(source, source)
        lines.append(f"{name:<{width}}  {shown:<40}  {where}")
    return {"schema_version": 1, "config_file": loaded, "settings": settings}, "\n".join(lines)


def _unset(name: str) -> str:
    if name == "root":
        return default_root()
    if name == "uv":
        return "(the store's pinned uv)"
    if name == "lock_timeout":
        return "(each command's own: see its --help)"
    return "(none)"


def config_answer(ctx, kw: dict, sources: dict, file_values: dict, environ) -> bool:
    """`config` from the fast path: the config file's values as the fast path read them (cached
    values of a file the full command parsed), the group's settings given as flags by their source."""
    from llmgw_store.cli import config

    path, explicit = config.locate(kw["config_file"], environ)
    loaded = None
    if path is not None:
        try:
            if config.read(path, explicit) is not None:
                loaded = path
        except (config.ConfigError, OSError):
            return False
    flags = {s.param: kw[s.param] for s in config.SETTINGS
             if config.GLOBAL in s.commands and sources.get(s.param) == "flag"}
    ctx.emit(*config_shown(loaded, file_values, kw["config_file"], flags, environ))
    return True


# -- verify -----------------------------------------------------------------------------------------


def verify(ctx, kw: dict) -> None:
    from llmgw_store.integrity.verify import verify as do_verify

    r = do_verify(list(kw["paths"]) or None, root=ctx.root, repair=kw["repair"], uv=kw["uv"],
                  python_preference=kw["python_preference"], lock_timeout=kw["lock_timeout"],
                  index_url=kw["index_url"])
    lines = []
    for p in r.paths:
        state = "ok" if p["ok"] else ("repaired" if p.get("ok_after_repair") else "DAMAGED")
        lines.append(f"{state:8s} {p['path']}")
        for kind in ("modified", "missing", "extra", "writable"):
            lines += [f"           {kind}: {quoted(f)}" for f in p[kind]]
        lines += [f"           foreign: {quoted(f['path'])} (owner uid {f['uid']}"
                  + (f", xattrs {', '.join(map(quoted, f['xattrs']))}" if f["xattrs"] else "") + ")"
                  for f in p.get("foreign", [])]
        lines += [f"           mode: {quoted(f['path'])} is {f['mode']}, not the store's 0444/0555"
                  for f in p.get("modes", [])]
        lines += [f"           {msg}" for msg in p["problems"]]
    ctx.emit(r.to_json(), "\n".join(lines))
    if r.damaged:
        ctx.exit(1)


HANDLERS = {"build": build, "activate": activate, "rollback": rollback, "verify": verify}
READS = ("list", "info", "env", "generations", "config")
