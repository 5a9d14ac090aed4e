"""Settings: one declaration per setting, and the config file that can hold them.

Each `Setting` below says everything about one setting: its name (= its key in the config file),
its kind, its command-line flag, its environment variable, its built-in default, which commands
take it and what it means to a cache hit. The click options (cli/app.py), the fast path
(cli/fast.py) and `llmgw-store config` are all made from this table, so a setting added here is a
flag, a variable and a config key at once, everywhere:

    Setting("offline", "bool", "--offline", False, commands=("build", "activate", "rollback"),
            hit="ignored", help="..."),

Precedence, the same in every command and in the fast path: the flag, else the environment
variable (an empty one is unset, as click reads it), else the config file, else the default.

The config file is TOML: `--config FILE`, else `$LLMGW_STORE_CONFIG` (empty: no file), else
/etc/llmgw-store/config.toml when running as root, else $XDG_CONFIG_HOME/llmgw-store/config.toml
(~/.config/...). One named by --config or the variable must exist; the default one may not.

    root = "/var/lib/llmgw-store"
    substituters = ["https://cache.internal/llmgw"]
    trusted_keys = ["/etc/llmgw-store/builder-1.public"]
    [gc]
    min_free = "100G"

An unknown key, a value of the wrong type, a relative path: ConfigError (exit 2) naming the file
and the key, before anything is done. The file is trusted as the user's own word only if no one
else could have written it: it must be a regular file of at most MAX_CONFIG_BYTES, and it, every
directory above it (after links are resolved), and every file it names (`uv`, a `trusted_keys`
file) must be owned by root or the running user and writable by no one else (a root-owned sticky
directory such as /tmp is accepted: no one else can replace what is in it). A store runs as root
and runs `uv` from this file: a config another user could edit is refused, not read.

The fast path must not pay for tomllib (14 ms, more than the whole cache hit): the full command,
having parsed and checked a file, leaves its values in a private cache keyed by the file's path and
bytes (`remember`); the fast path reads the file's bytes and takes the values from there
(`cached`), or leaves the command to the full command. Imports: os, stat and _blake2.
"""

from __future__ import annotations

import os
import stat

from llmgw_store.base import defaults
from llmgw_store.base.errors import UsageError
from llmgw_store.core.dirs import private_dir, read_private, replace_private
from llmgw_store.system.files import FileRefused, open_trusted

CONFIG_ENV = "LLMGW_STORE_CONFIG"
ENV_PREFIX = "LLMGW_STORE_"
MAX_CONFIG_BYTES = 1 << 16
GLOBAL = "-"  # the group: a setting every command takes, before or after its name


class _NoDefault:
    """A command's default for a setting that has none there (None) where the setting's own
    default applies elsewhere (`rollback --index-url`: the recorded index, not PyPI)."""

    def __repr__(self) -> str:
        return "NO_DEFAULT"


NO_DEFAULT = _NoDefault()

# What a setting does to a cache hit (`build` answered from the build memo, cli/fast.py):
#   key      enters the memo key (build/memo.KEY_OPTIONS): another value, another answer
#   ignored  cannot change a hit (a hit takes no lock and asks no cache)
#   root     says where the store (and so the memo) is
#   render   how the answer is shown
HIT_ROLES = ("key", "ignored", "root", "render")
KINDS = ("path", "url", "choice", "list", "bool", "seconds", "size", "duration", "int")


class ConfigError(UsageError):
    """The config file is unreadable, not TOML, untrusted, or holds an unknown key or a wrong value;
    the message names the file and the key."""


class Setting:
    """One setting (see the module docstring). `name` is its config key (`gc.min_free` is `min_free`
    in the `[gc]` table); `param` the name click and the library call it; `commands` the commands
    that take it (GLOBAL: the group, so every command)."""

    __slots__ = ("choices", "commands", "default", "env", "flag", "help", "hit", "kind", "metavar", "name", "param")

    def __init__(self, name: str, kind: str, flag: str, default: object, *, commands: tuple[str, ...], hit: str,
                 help: str, param: str | None = None, choices: tuple[str, ...] = (), metavar: str | None = None):
        assert kind in KINDS and hit in HIT_ROLES, (name, kind, hit)
        self.name, self.kind, self.flag, self.default = name, kind, flag, default
        self.param = param or name.rsplit(".", 1)[-1]
        self.env = ENV_PREFIX + name.upper().replace(".", "_")
        self.commands, self.hit, self.choices, self.help, self.metavar = commands, hit, choices, help, metavar

    def applies_to(self, command: str) -> bool:
        return GLOBAL in self.commands or command in self.commands or "*" in self.commands

    def __repr__(self) -> str:
        return f"Setting({self.name!r})"


_REALISING = ("build", "activate", "rollback")
# How a command talks to binary caches (cache/backends/retry.py; docs/fleet.md "Networks that fail").
# build, activate and rollback take them for their --substituter caches (cli/spec.py, api.py).
_CACHE_TALKING = ("push", "pull", "push-roots", "cache gc", *_REALISING)
_CACHE_NETWORK = (
    ("attempts", "int", "N", "At most N attempts per cache request (connect errors, resets, stalls, HTTP "
                             "408/429/5xx); default 0: no count, --cache-retry-for decides."),
    ("retry_for", "seconds", "SECONDS", "Seconds a failing request is retried after its last progress (a cache "
                                        "restart shorter than this is waited out); default 30."),
    ("stall", "seconds", "SECONDS", "Seconds a transfer may go without 64 KiB before it is abandoned and retried; "
                                    "default 30."),
    ("metadata_timeout", "seconds", "SECONDS", "Seconds one attempt at an object's metadata may take before the "
                                               "cache is passed over; default 5."),
    ("deadline", "seconds", "SECONDS", "Seconds after which a request starts no new attempt; default 300."),
    ("redirects_to", "list", "ORIGIN", "An origin (https://host[:port], or *) an HTTP cache may redirect reads to "
                                       "besides its own; repeatable (the variable: space-separated)."),
)

SETTINGS: tuple[Setting, ...] = (
    Setting("root", "path", "--root", None, commands=(GLOBAL,), hit="root", metavar="DIR",
            help="Store root. Default: /var/lib/llmgw-store as root, else $XDG_DATA_HOME/llmgw-store."),
    Setting("progress", "choice", "--progress", "auto", commands=(GLOBAL,), hit="render",
            choices=defaults.PROGRESS_MODES,
            help="Progress on stderr: auto (a live line on a terminal, else plain), tty, plain (timestamped lines), "
                 "json (one JSON object per line: t, step, done, total, unit), none."),
    # The group's, so one config line covers every command; the CLI hands it to supervise/cgroups.py
    # through its variable, read when the first child starts (cli/output.Context).
    Setting("containment", "choice", "--containment", "auto", commands=(GLOBAL,), hit="ignored",
            choices=defaults.CONTAINMENTS,
            help="How each child (uv, the compiler, a health check) is contained so that it dies with the store "
                 "process: auto (the first that works), systemd-scope, cgroup (a cgroup v2 per child, killed "
                 "with cgroup.kill), subreaper (a process group, the fallback)."),
    Setting("index_url", "url", "--index-url", defaults.PYPI_SIMPLE, commands=(*_REALISING, "verify"), hit="key",
            metavar="URL", help="Package index (simple API, PEP 691 JSON; credentials in it reach the index only)."),
    Setting("uv", "path", "--uv", None, commands=(*_REALISING, "verify"), hit="key", metavar="PATH",
            help="Use this uv binary instead of the store's pinned one (its --version enters the key)."),
    Setting("python_preference", "choice", "--python-preference", defaults.PYTHON_PREFERENCE,
            commands=(*_REALISING, "verify"), hit="key", choices=defaults.PYTHON_PREFERENCES,
            help="Where the interpreter may come from: managed uses a store-managed one, else the host's, and "
                 "downloads one only if neither exists; only-managed always wants a managed one (the host's if the "
                 "download fails); only-system never downloads."),
    Setting("substituters", "list", "--substituter", (), commands=(*_REALISING, "generations"), hit="ignored", metavar="URL",
            help="Binary cache to ask before building (file:///dir, http(s)://...); repeatable "
                 "(the variable: space-separated)."),
    Setting("trusted_keys", "list", "--trusted-key", (), commands=(*_REALISING, "pull"), hit="ignored", metavar="KEY",
            help="Public key (name:base64, or a .public file by its absolute path) whose signatures are accepted; "
                 "repeatable."),
    Setting("substitute_only", "bool", "--substitute-only", False, commands=(*_REALISING, "generations"),
            hit="ignored",
            help="Pull from the --substituter caches and never build: a miss is exit 1 naming the key and the caches "
                 "asked, with nothing built. For a node; the recipe's version and as_of pinned (or a recorded "
                 "generation), its key needs no index."),
    Setting("offline", "bool", "--offline", False, commands=_REALISING, hit="ignored",
            help="No network but file:// caches: uv reads only its cache, http(s)/s3 caches are passed over, and "
                 "what would need the index says so (exit 1)."),
    # A table in the config file (releases = {vllm = "vllm-prod"}), PROFILE=RELEASE words elsewhere.
    Setting("releases", "list", "--follow", (), commands=("activate", "push-roots"), hit="ignored", metavar="PROFILE=RELEASE",
            help="The release a profile follows: `activate PROFILE` without TARGET activates what the release points "
                 "at, as --release does; repeatable (the variable: space-separated; the config file: a table, "
                 "releases = {vllm = \"vllm-prod\"})."),
    Setting("lock_timeout", "seconds", "--lock-timeout", None, commands=("*",), hit="ignored", metavar="SECONDS",
            help="Seconds to wait for a lock; then exit 75 naming the holder."),
    *(Setting(f"cache.{name}", kind, f"--cache-{name.replace('_', '-')}", () if kind == "list" else None,
              commands=_CACHE_TALKING,
              hit="ignored", param=f"cache_{name}", metavar=metavar, help=text)
      for name, kind, metavar, text in _CACHE_NETWORK),
    Setting("gc.min_free", "size", "--min-free", None, commands=("gc", "systemd-units"), hit="ignored", metavar="SIZE",
            help="Collect only until the filesystem has this much free; nothing if it has."),
    Setting("gc.max_cache", "size", "--max-cache", None, commands=("gc", "systemd-units"), hit="ignored",
            metavar="SIZE", help="Prune the uv and bytecode caches down to SIZE on disk: entries no live path uses "
                                 "first, least recently used first."),
    Setting("gc.keep_dead_for", "duration", "--keep-dead-for", None, commands=("gc", "systemd-units"), hit="ignored",
            metavar="DURATION", help="Keep a dead path that was rooted or used within DURATION (1h): a rollback "
                                     "right after a switch finds it."),
    Setting("gc.delete_older_than", "duration", "--delete-older-than", None, commands=("gc", "systemd-units"),
            hit="ignored", metavar="DURATION",
            help="First delete generations older than this (30d, 12h), never the current one."),
    Setting("gc.keep", "int", "--keep", None, commands=("gc", "systemd-units"), hit="ignored", metavar="N",
            help="First delete all but the newest N generations of each profile (never the current one)."),
    # What a node's timer runs after gc (roots/systemd.py): `push-roots` and `stats --prometheus`,
    # each when its keys are set. `node.secret_key` keeps the variable push-roots always had.
    Setting("node.roots_to", "url", "--to", None, commands=("push-roots",), hit="ignored", param="to", metavar="URL",
            help="Cache URL the roots document goes to: file:///dir, http(s)://host/prefix or s3://bucket/prefix."),
    Setting("node.secret_key", "path", "--secret-key", None, commands=("push-roots",), hit="ignored",
            param="secret_key", metavar="FILE",
            help="This node's signing key file (from keygen); the cache gc trusts its .public with --keep-from."),
    Setting("stats.prometheus", "path", "--prometheus", None, commands=("stats",), hit="ignored", metavar="FILE",
            help="Also write the figures as a Prometheus textfile (atomically)."),
)

BY_NAME = {s.name: s for s in SETTINGS}
TABLES = {s.name.split(".", 1)[0] for s in SETTINGS if "." in s.name}


def for_command(command: str) -> list[Setting]:
    """The settings `command` takes as its own options (GLOBAL: those of the group)."""
    if command == GLOBAL:
        return [s for s in SETTINGS if GLOBAL in s.commands]
    return [s for s in SETTINGS if GLOBAL not in s.commands and s.applies_to(command)]


# -- values ---------------------------------------------------------------------------------------


def from_env(s: Setting, raw: str) -> object:
    """A setting's value from its environment variable's text, as click converts it (a list is
    split on whitespace, a flag reads 1/0, true/false, yes/no, on/off). ValueError when click would
    refuse it (the full command then says why)."""
    if s.kind == "list":
        return tuple(raw.split())
    if s.kind == "bool":
        low = raw.strip().lower()
        if low in ("1", "true", "t", "yes", "y", "on"):
            return True
        if low in ("0", "false", "f", "no", "n", "off"):
            return False
        raise ValueError(raw)
    return convert(s, raw)


def convert(s: Setting, value: str) -> object:
    """A flag's (or a variable's, or the file's) text as the value click gives the command;
    ValueError where click would refuse it (the fast path then leaves the command to click)."""
    if s.kind == "choice" and value not in s.choices:
        raise ValueError(value)
    if s.kind == "seconds":
        number = float(value)
        if not number >= 0:  # click's FloatRange(min=0) takes nan; the fast path leaves it to click
            raise ValueError(value)
        return number
    if s.kind == "int":
        return int(value)
    if s.kind == "path":
        return path_value(value, dir_ok=s.name == "root")
    return value


def path_value(value: str, dir_ok: bool = False) -> str:
    """`value` as click.Path(dir_okay=dir_ok) takes it: an existing path must be readable, and a
    directory only where one is allowed; ValueError otherwise. A missing path is taken as it is."""
    if not value:
        return value
    try:
        st = os.stat(value)
    except OSError:
        return value
    if (stat.S_ISDIR(st.st_mode) and not dir_ok) or not os.access(value, os.R_OK):
        raise ValueError(value)
    return value


def check_value(s: Setting, value: object, where: str) -> object:
    """A value from the config file, checked for `s`'s kind; ConfigError naming `where` (file: key)."""
    def bad(want: str) -> ConfigError:
        return ConfigError(f"{where}: must be {want}, not {_shown(value)}")

    kind = s.kind
    if kind in ("path", "url", "choice", "size", "duration"):
        if not isinstance(value, str) or not value or "\0" in value:
            raise bad("a non-empty string")
        if kind == "path" and not value.startswith("/"):
            raise bad("an absolute path")
        if kind == "choice" and value not in s.choices:
            raise bad("one of " + ", ".join(s.choices))
        if kind in ("size", "duration"):
            from llmgw_store.app.units import parse_duration, parse_size

            try:
                (parse_size if kind == "size" else parse_duration)(value)
            except UsageError as exc:
                raise ConfigError(f"{where}: {exc}") from None
        return value
    if s.name == "releases":  # a table in the file; PROFILE=RELEASE words on the command line and in the variable
        if not isinstance(value, dict) or not all(
                isinstance(k, str) and isinstance(v, str) and k and v and "=" not in k
                and not any(c.isspace() or c == "\0" for c in k + v) for k, v in value.items()):
            raise bad("a table of profile = \"release\"")
        return tuple(f"{k}={v}" for k, v in value.items())
    if kind == "list":
        if not isinstance(value, list) or not all(isinstance(v, str) and v and "\0" not in v for v in value):
            raise bad("a list of non-empty strings")
        return tuple(value)
    if kind == "bool":
        if not isinstance(value, bool):
            raise bad("true or false")
        return value
    if kind == "seconds":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 \
                or value == float("inf"):
            raise bad("a number of seconds (0 or more)")
        return float(value)
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise bad("a whole number (0 or more)")
        return value
    raise AssertionError(kind)


def _shown(value: object) -> str:
    s = repr(value)
    return s if len(s) <= 60 else s[:40] + "...'"


# -- the file -------------------------------------------------------------------------------------


def default_path() -> str:
    if os.geteuid() == 0:
        return "/etc/llmgw-store/config.toml"
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "llmgw-store", "config.toml")


def locate(flag: str | None, environ: os._Environ | dict = os.environ) -> tuple[str | None, bool]:
    """(the config file to read, whether it was named explicitly): --config, else $LLMGW_STORE_CONFIG
    (set but empty: no file at all), else the default place (which may be absent)."""
    if flag is not None:
        return (flag or None), True
    if CONFIG_ENV in environ:
        return (environ[CONFIG_ENV] or None), True
    return default_path(), False


def _open_trusted(path: str, what: str, where: str, *, open_it: bool = True) -> tuple[int, os.stat_result]:
    """(fd, fstat) of `path` (as given, not its real path) opened for reading, if it and every
    directory walked through on the way are root's or this user's and writable by no one else, and
    every link on the way lies in such a directory (system/files.open_trusted, the rule writes
    outside the root follow too); ConfigError otherwise. The caller closes the fd. Without
    `open_it` (a program the file names: it may be execute-only), (-1, its lstat)."""
    def refused(reason: str) -> ConfigError:
        return ConfigError(f"{where}: refusing {what} {path}: it {reason}; only root or you may be able to write "
                           "it, the directories above it and the links on the way")

    try:
        return open_trusted(path, open_it=open_it)
    except FileRefused as exc:
        raise refused(exc.reason) from None


class ConfigUnreachable(ConfigError):
    """The default config file (never one named by --config or the variable) lies below a directory
    of another user's that keeps this user out or that the trust rule refuses: a service user run by
    `runuser`/`setpriv`, which keep root's HOME. A reader command (`run`, `env`...) takes it as no
    file, and says `note` under -v; any other command says this error."""

    def __init__(self, message: str, note: str):
        super().__init__(message)
        self.note = note


def _foreign_dir(path: str) -> str | None:
    """The directory on the way to `path` that is another user's (root's included) and that this
    user may not pass (no search permission), or that belongs to another user who is not root
    (the trust rule refuses it); None when every directory on the way is passable and root's or
    this user's, so a refusal is about the file or a directory of this user's own."""
    me = os.geteuid()
    here = "/"
    for part in os.path.dirname(os.path.abspath(path)).split("/"):
        if not part:
            continue
        nxt = os.path.join(here, part)
        try:
            st = os.stat(nxt)
        except OSError:
            return None
        if st.st_uid not in (0, me) or (st.st_uid != me and not os.access(nxt, os.X_OK)):
            return nxt
        here = nxt
    return None


def read(path: str, explicit: bool) -> bytes | None:
    """The config file's bytes, after the trust checks; None when the default file is absent.
    ConfigUnreachable when the default file lies below another user's directory (`_foreign_dir`)."""
    try:
        fd, st = _open_trusted(path, "the config file", path)
    except (OSError, ConfigError) as exc:
        if not explicit and isinstance(exc, FileNotFoundError):
            return None
        message = str(exc) if isinstance(exc, ConfigError) else \
            f"{path}: cannot read the config file: {exc.strerror or exc}"
        if not explicit and (foreign := _foreign_dir(path)) is not None:
            raise ConfigUnreachable(message, f"no config file: {path} lies below {foreign}, another user's directory "
                                    f"(runuser and setpriv keep HOME); name one with --config or "
                                    f"{CONFIG_ENV}") from None
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(message) from None
    try:
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{path}: the config file is not a regular file")
        data = os.read(fd, MAX_CONFIG_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: the config file is larger than {MAX_CONFIG_BYTES // 1024} KiB")
    return data


MAX_CONFIG_DEPTH = 8  # a setting is at most [table] key = [list]: 3 levels; anything deeper is refused


def parse(path: str, data: bytes) -> dict[str, object]:
    """The settings the file holds, by setting name, each checked; ConfigError naming the key.
    Bounded as a recipe is (system/boundedtoml, the one loader of both): at most MAX_CONFIG_BYTES,
    nested at most MAX_CONFIG_DEPTH levels, keys of at most MAX_CONFIG_DEPTH dotted parts — a file
    nested deeper than the parser's recursion reaches is a ConfigError too, never a traceback — and
    so parsed in time linear in its size."""
    from llmgw_store.system.boundedtoml import Limits, TomlRefused, loads

    try:
        doc = loads(data, Limits(MAX_CONFIG_BYTES, MAX_CONFIG_DEPTH, MAX_CONFIG_DEPTH, "the config file"))
    except TomlRefused as exc:
        raise ConfigError(f"{path}: not a valid TOML file: {exc.syntax}" if exc.syntax else f"{path}: {exc}") from None
    values: dict[str, object] = {}
    for key, value in doc.items():
        if key in TABLES:
            if not isinstance(value, dict):
                raise ConfigError(f"{path}: {key}: must be a table ([{key}])")
            for sub, v in value.items():
                s = BY_NAME.get(f"{key}.{sub}")
                if s is None:
                    raise ConfigError(f"{path}: unknown key {key}.{sub} in [{key}] (known: "
                                      + ", ".join(n.split(".", 1)[1] for n in BY_NAME if n.startswith(key + ".")) + ")")
                values[s.name] = check_value(s, v, f"{path}: {s.name}")
            continue
        s = BY_NAME.get(key)
        if s is None or "." in key:
            raise ConfigError(f"{path}: unknown key {key!r} (known: " + ", ".join(
                sorted({n.split(".", 1)[0] for n in BY_NAME})) + ")")
        values[key] = check_value(s, value, f"{path}: {key}")
    if "trusted_keys" in values:
        values["trusted_keys"] = _anchored_keys(path, values["trusted_keys"])  # type: ignore[arg-type]
    for name, value in values.items():  # the files it names are trusted like the config itself
        files = named_files(name, value)
        for f in files:
            if os.path.lexists(f):
                try:
                    _open_trusted(f, f"the file {name} names,", f"{path}: {name}", open_it=False)
                except OSError as exc:
                    raise ConfigError(f"{path}: {name}: cannot read {f}: {exc.strerror or exc}") from None
    return values


def _anchored_keys(path: str, keys: tuple[str, ...]) -> tuple[str, ...]:
    """`trusted_keys` with each key file named by its absolute path: one given relative is the
    config file's directory's (resolved here, once: never the directory a command runs in). A key
    written inline (core/names.inline_key) stays a key, whatever files exist."""
    from llmgw_store.core.names import inline_key

    base = os.path.dirname(os.path.abspath(path))
    return tuple(k if inline_key(k) is not None or k.startswith("/") else os.path.normpath(os.path.join(base, k))
                 for k in keys)


def named_files(name: str, value: object) -> list[str]:
    """The files the value of the setting `name` names, which are trusted like the config file:
    `uv`, and the key files among `trusted_keys` (anchored: absolute; the rest are inline keys)."""
    s = BY_NAME[name]
    if s.kind == "path" and name != "root":
        return [value]  # type: ignore[list-item]
    if name == "trusted_keys":
        return [v for v in value if v.startswith("/")]  # type: ignore[attr-defined]
    return []


class ConfigFile:
    """A config file that was read: its path, its bytes and its checked values by setting name."""

    __slots__ = ("data", "path", "values")

    def __init__(self, path: str, data: bytes, values: dict[str, object]):
        self.path, self.data, self.values = path, data, values


def load(flag: str | None = None, environ: os._Environ | dict = os.environ) -> ConfigFile | None:
    """The config file the command reads (see `locate`), parsed and checked; None when there is none.
    The parsed values are left for the fast path (`remember`)."""
    path, explicit = locate(flag, environ)
    if path is None:
        return None
    data = read(path, explicit)
    if data is None:
        return None
    values = parse(path, data)
    if explicit and not values:
        # A file named on purpose that sets nothing is a mistake (the wrong file, a provisioning
        # step that wrote nothing): read as "no settings", a node would build from public PyPI
        # into the default root. The default file may be empty.
        raise ConfigError(f"{path}: the config file given (--config or LLMGW_STORE_CONFIG) sets nothing: name the "
                          "file that holds the settings, or set LLMGW_STORE_CONFIG= (empty) for no file")
    remember(path, data, values)
    return ConfigFile(path, data, values)


# -- the fast path's cache of parsed files --------------------------------------------------------

CACHE_FORMAT = "llmgw-store config cache 1"
MAX_CACHE_BYTES = 1 << 17


def cache_dir() -> str:
    """Private to the running user: $XDG_CACHE_HOME/llmgw-store, else /var/cache/llmgw-store for
    root, else ~/.cache/llmgw-store."""
    base = os.environ.get("XDG_CACHE_HOME")
    if not base:
        if os.geteuid() == 0:
            return "/var/cache/llmgw-store"
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "llmgw-store")


def _cache_name(path: str, data: bytes) -> str:
    try:
        from _blake2 import blake2b
    except ImportError:  # pragma: no cover - an interpreter built without it
        from hashlib import blake2b
    h = blake2b(CACHE_FORMAT.encode(), digest_size=20)
    for part in (os.path.abspath(path).encode("utf-8", "surrogateescape"), data):
        h.update(len(part).to_bytes(8, "big") + part)
    return "config-" + h.hexdigest()


def _open_cache_dir(create: bool) -> int | None:
    """The cache directory as a descriptor, if it is this user's and closed to others (never a link)."""
    d = cache_dir()
    if create:
        try:
            os.makedirs(os.path.dirname(d), mode=0o700, exist_ok=True)
        except OSError:
            return None
    return private_dir(d, None, create)


def _encode(value: object) -> str:
    def text(v: str) -> str:
        return v.encode("unicode_escape").decode("ascii")

    if isinstance(value, bool):
        return "b" + ("1" if value else "0")
    if isinstance(value, float):
        return "f" + repr(value)
    if isinstance(value, int):
        return "i" + str(value)
    if isinstance(value, tuple):
        return "l" + " ".join(text(v).replace(" ", "\\x20") for v in value)
    return "s" + text(str(value))


def _decode(s: Setting, raw: str) -> object:
    def text(v: str) -> str:
        return v.encode("ascii").decode("unicode_escape")

    tag, body = raw[:1], raw[1:]
    if tag == "b" and body in ("0", "1"):
        value: object = body == "1"
    elif tag == "f":
        value = float(body)
    elif tag == "i":
        value = int(body)
    elif tag == "l":
        value = tuple(text(v) for v in body.split(" ")) if body else ()
    elif tag == "s":
        value = text(body)
    else:
        raise ValueError(raw)
    want = {"bool": bool, "seconds": float, "int": int, "list": tuple}.get(s.kind, str)
    if type(value) is not want:
        raise ValueError(raw)
    return value


def remember(path: str, data: bytes, values: dict[str, object]) -> None:
    """Leave the parsed `values` of the file `path` (whose bytes are `data`) for `cached`. Best
    effort: a new 0600 file renamed over the entry (a reader sees the old entry or the new one).
    A file whose index URL or a substituter carries credentials is never copied (a token or a
    password stays where it was put): the fast path finds no entry and defers to the full command,
    which reads them from the file."""
    from llmgw_store.app.credentials import auth_of

    urls = [values.get("index_url"), *(values.get("substituters") or ())]  # type: ignore[misc]
    if any(isinstance(u, str) and auth_of(u) is not None for u in urls):
        return
    lines = [CACHE_FORMAT] + [f"{name}={_encode(v)}" for name, v in sorted(values.items())]
    body = ("\n".join(lines) + "\n").encode("ascii")
    fd_dir = _open_cache_dir(create=True)
    if fd_dir is None:
        return
    try:
        replace_private(fd_dir, _cache_name(path, data), body)
    finally:
        os.close(fd_dir)


def cached(path: str, data: bytes) -> dict[str, object] | None:
    """The values `remember` left for the file `path` with exactly these bytes, or None (then the
    full command parses the file). The entry must be a regular 0600 file of this user's in the
    private cache directory, reached without a link, and well-formed in every line."""
    fd_dir = _open_cache_dir(create=False)
    if fd_dir is None:
        return None
    try:
        raw = read_private(fd_dir, _cache_name(path, data), MAX_CACHE_BYTES)
    finally:
        os.close(fd_dir)
    if raw is None:
        return None
    try:
        lines = raw.decode("ascii").split("\n")
        if lines[0] != CACHE_FORMAT or lines[-1] != "":
            return None
        values: dict[str, object] = {}
        for line in lines[1:-1]:
            name, _, encoded = line.partition("=")
            s = BY_NAME.get(name)
            if s is None or name in values:
                return None
            values[name] = _decode(s, encoded)
        return values
    except (UnicodeDecodeError, ValueError):
        return None


def read_cached(flag: str | None, environ: os._Environ | dict = os.environ) -> tuple[bool, dict[str, object]]:
    """For the fast path: (whether the config is known, its values). (True, {}) when there is no
    config file; (False, {}) when there is one whose parsed values are not in the cache, or anything
    about it is not as it should be (the full command then reads it, and says what is wrong)."""
    try:
        path, explicit = locate(flag, environ)
        if path is None:
            return True, {}
        data = read(path, explicit)
    except (ConfigError, OSError):
        return False, {}
    if data is None:
        return True, {}
    values = cached(path, data)
    if values is None or not files_trusted(values):
        return False, {}
    return True, values


def files_trusted(values: dict[str, object]) -> bool:
    """Whether every file the config's `values` name (`named_files`: uv, key files) still passes
    the walk `parse` held it to (system/files.open_trusted): cached values were checked when they
    were parsed, and a directory can open up since. A missing file is left to the command that
    uses it, as `parse` leaves it."""
    for name, value in values.items():
        for f in named_files(name, value):
            try:
                open_trusted(f, open_it=False)
            except FileNotFoundError:
                continue
            except OSError:  # FileRefused among them
                return False
    return True


# -- effective values -----------------------------------------------------------------------------


def effective(s: Setting, flag: object, environ: os._Environ | dict, file: dict[str, object],
              default: object = None) -> tuple[object, str]:
    """(value, source) of `s`: the flag (None: not given), else the environment variable, else the
    config file, else `default` (the command's own, where it has one) or the built-in default.
    A variable click would refuse raises ValueError."""
    if flag is not None:
        return flag, "flag"
    raw = environ.get(s.env)
    if raw:
        return from_env(s, raw), "env"
    if s.name in file:
        return file[s.name], "file"
    if default is NO_DEFAULT:
        return None, "default"
    return (s.default if default is None else default), "default"
