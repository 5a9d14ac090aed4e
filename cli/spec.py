"""The command line of the group and of the commands the fast path runs, declared once as data.

click's options (cli/app.py) and the fast path's parser (`parse` and `resolve` below, used by
cli/fast.py) are both made from these declarations, and the settings among them come from
cli/config.py (flag, environment variable, config key and default in one place). So the fast path
cannot know an option the click command lacks, or read a variable click does not:
tests/cli/test_cli_spec.py walks every click parameter and `envvar` of the group and of each command
here (`build`, `activate`, `rollback`, the reads `list`, `info`, `env`, `generations`, `config`, and
`verify`) and fails on one not declared here, and runs both parsers on the same argv,
environment and config file and compares what each gives the command.

`parse` takes what click would take, as click takes it: global options before or after the
command (`--root R`, `--root=R`, `-v`, `-vq`, ...), `--opt value` and `--opt=value`, `--` ending
the options. Anything it is not sure of — an unknown or repeated option, a value click would
refuse, `--help`, another command — is None, and the click app runs the command instead, with
argv untouched: click then says what is wrong. Imports only cli/config and base/defaults.
"""

from __future__ import annotations

from llmgw_store.base import defaults
from llmgw_store.cli import config

TYPE_CHECKING = False  # typing's, without importing typing (the fast path loads this module)
if TYPE_CHECKING:
    from collections.abc import Callable

FAST_COMMANDS = ("build", "activate", "rollback", "list", "info", "env", "generations", "config", "verify")
# What a parameter of `build` does to a memo answer (cli/config.HIT_ROLES), or `miss`: set, the
# build is never answered from the memo (`--check` rebuilds).
MISS = "miss"
MAX_CHECK_TIMEOUT_S = 86400.0


class Param:
    """One option or argument. `kind`: text, path, choice, list (an argument: nargs=-1), ints (a
    repeatable int), flag, count, seconds, int, positive (an int of at least 1), timeout (seconds,
    more than 0, at most a day), or a setting's kind; `setting`: the cli/config Setting it is (its
    env variable and config key with it)."""

    __slots__ = (
        "argument",
        "choices",
        "default",
        "env",
        "flags",
        "help",
        "hit",
        "kind",
        "metavar",
        "name",
        "no_default",
        "setting",
        "show_default",
    )

    def __init__(self, name: str, flags: tuple[str, ...], kind: str, default: object = None, help: str = "", *,
                 hit: str = "ignored", env: str | None = None, metavar: str | None = None,
                 choices: tuple[str, ...] = (), argument: bool = False, setting: config.Setting | None = None,
                 show_default: bool = False, no_default: bool = False):
        self.name, self.flags, self.kind, self.default, self.help = name, flags, kind, default, help
        self.hit, self.env, self.metavar, self.choices, self.argument = hit, env, metavar, choices, argument
        self.setting, self.show_default, self.no_default = setting, show_default, no_default

    @property
    def takes_value(self) -> bool:
        return not self.argument and self.kind not in ("flag", "count", "bool")

    def __repr__(self) -> str:
        return f"Param({self.name!r})"


def setting(name: str, default: object = None, help: str | None = None) -> Param:
    """The option of a cli/config setting (`default`: the command's own, where it differs;
    config.NO_DEFAULT where the command has none)."""
    s = config.BY_NAME[name]
    value = None if default is config.NO_DEFAULT else s.default if default is None else default
    return Param(s.param, (s.flag,), s.kind, value, help or s.help, hit=s.hit, env=s.env, metavar=s.metavar,
                 choices=s.choices, setting=s, show_default=value not in (None, (), False),
                 no_default=default is config.NO_DEFAULT)


def argument(name: str, metavar: str | None = None, kind: str = "text", default: object = None) -> Param:
    """A positional argument; one with a `default` may be left out."""
    return Param(name, (), kind, default, argument=True, metavar=metavar)


GROUP: tuple[Param, ...] = (
    setting("root"),
    # Its variable is read where the file is found (config.locate: set but empty means no file).
    Param("config_file", ("--config",), "path", None, "Config file (TOML) with the settings below and more "
          f"(`llmgw-store config` shows them). Env: {config.CONFIG_ENV} (empty: none). Default: "
          "/etc/llmgw-store/config.toml as root, else $XDG_CONFIG_HOME/llmgw-store/config.toml.", metavar="FILE"),
    Param("as_json", ("--json",), "flag", False, "Print one JSON document on stdout (an error too); human text goes "
          "to stderr.", hit="render"),
    Param("verbose", ("-v", "--verbose"), "count", 0, "Show the commands run, and a failed command's output.",
          hit="render"),
    Param("quiet", ("-q", "--quiet"), "flag", False, "No progress lines (errors and results still print).",
          hit="render"),
    setting("progress"),
    setting("containment"),
)

# How the --substituter caches are talked to (cli/config.py `cache.*`; docs/fleet.md, "Networks
# that fail"): handed to api.py as `cache_network`, a RetryPolicy's fields.
CACHE_NETWORK = ("attempts", "retry_for", "stall", "metadata_timeout", "deadline", "redirects_to")


def _cache() -> tuple[Param, ...]:
    return tuple(setting(f"cache.{name}") for name in CACHE_NETWORK)


def _build() -> tuple[Param, ...]:
    return (
        Param("version", ("--version",), "text", None, "Engine version to build (default: the recipe's, else the latest "
              "release).", hit="key"),
        Param("variant", ("--variant",), "text", None, "Which [[build]] of the recipe (default: the first).", hit="key"),
        Param("as_of", ("--as-of",), "text", None, "Resolve as the index stood at this ISO 8601 time (default: the "
              "recipe's as_of, else publication + 24 h).", hit="key"),
        setting("index_url"),
        setting("uv"),
        Param("python", ("--python",), "text", None, "Use this interpreter (an absolute path) or version request (3.12) "
              "instead of the recipe's build.python; it enters the key as the recipe's field would (such a build is "
              "never answered from the build memo).", hit=MISS, env="LLMGW_STORE_PYTHON", metavar="PATH|VERSION"),
        setting("python_preference"),
        setting("lock_timeout", defaults.BUILD_LOCK_TIMEOUT_S, "Seconds to wait for each lock (another process building "
                "the same key, a gc, the profile); then exit 75 naming the holder."),
        setting("substituters"),
        setting("trusted_keys"),
        setting("substitute_only"),
        setting("offline"),
        *_cache(),
    )


_DECLARE: dict[str, Callable[[], tuple[Param, ...]]] = {
    "build": lambda: (
        argument("recipe", kind="path"),
        *_build(),
        Param("check", ("--check",), "flag", False, "Rebuild RECIPE's store path (it must exist) into a temporary tree "
              "from its recorded lock and compare file by file; exit 1 naming the files that differ. The store path "
              "is never changed.", hit=MISS),
    ),
    "activate": lambda: (
        argument("profile"),
        argument("target", default=""),  # "": none, --release names what to activate
        *_build(),
        Param("release", ("--release",), "text", None, "Activate what the release NAME in the binary caches "
              "(--substituter) points at, signed by a trusted key: pulled as it is, nothing computed or built "
              "(instead of TARGET).", metavar="NAME"),
        setting("releases"),
        Param("check", ("--check",), "text", None, "Run this command in TARGET's environment first; switch only if it "
              "exits 0 (default: the recipe's `health` command, if it has one).", metavar="'CMD ...'"),
        Param("check_timeout", ("--check-timeout",), "timeout", 120.0, "Seconds the check may run (more than 0, at "
              "most 86400); then it is killed with its children and counts as failed.", show_default=True),
        Param("then_check", ("--then-check",), "flag", False, "Switch first, then run the check; switch back by itself "
              "if it fails or times out."),
        Param("no_check", ("--no-check",), "flag", False, "Do not run the recipe's `health` command."),
        Param("keep_records", ("--keep-records",), "positive", 100, "Records of generations kept for this profile (the "
              "oldest cold ones are dropped beyond it).", show_default=True),
    ),
    "rollback": lambda: (
        argument("profile"),
        Param("to", ("--to",), "int", None, "Generation number to switch to (default: the previous one). A cold "
              "generation is rebuilt from its record (or pulled) first."),
        setting("substituters", help="Binary cache to pull a cold generation's store path from; repeatable."),
        setting("trusted_keys"),
        setting("uv", help="A uv binary of the version the cold generation was built with (default: the store's)."),
        setting("python_preference", help="Where the interpreter of a rebuild may come from."),
        setting("lock_timeout", defaults.LOCK_TIMEOUT_S, "Seconds to wait for the profile's lock (and a rebuild's "
                "locks); then exit 75 naming the holder."),
        setting("substitute_only"),
        setting("offline"),
        setting("index_url", config.NO_DEFAULT, "The configured index URL: its credentials (if any) are sent to the "
                "index a cold generation records, when it is that index."),
        *_cache(),
    ),
    # The reads the fast path answers (integrity/reads.py): only the group's options.
    "list": lambda: (),
    "info": lambda: (argument("path"),),
    "env": lambda: (argument("target", metavar="PROFILE|PATH"),),
    # A listing of generations is answered by integrity/reads.py; deleting some (any of the options
    # from --delete to --keep-records) is the click command's alone.
    "generations": lambda: (
        argument("profile"),
        Param("delete", ("--delete",), "ints", (), "Delete generation N (repeatable). Never the current one. "
              "Its record stays: the generation becomes cold."),
        Param("older_than", ("--older-than",), "text", None, "Delete generations older than this (30d, 12h, ...), "
              "except the current one."),
        Param("keep", ("--keep",), "int", None, "Keep the newest N generations (and the current one), delete the "
              "rest."),
        Param("forget", ("--forget",), "ints", (), "Delete generation N and its record too: it can no longer be "
              "rolled back to (repeatable)."),
        Param("keep_records", ("--keep-records",), "positive", None, "Drop the oldest records of cold generations "
              "beyond N."),
        Param("history", ("--history",), "flag", False, "Also print the profile's recent events (switches, checks, "
              "rollbacks)."),
        Param("dry_run", ("--dry-run",), "flag", False, "Say what would be deleted, delete nothing."),
        setting("substituters", help="Binary cache a rollback would pull a cold generation from (the listing says "
                "where each comes from); repeatable."),
        setting("substitute_only"),
        setting("lock_timeout", defaults.LOCK_TIMEOUT_S, "Seconds to wait for the profile's lock; then exit 75 naming the "
                "holder."),
    ),
    "config": lambda: (),
    # A check that only looks is the library's verify without click; --repair is the click command's.
    "verify": lambda: (
        argument("paths", kind="list"),  # nargs=-1: none, one or many
        Param("repair", ("--repair",), "flag", False, "Rebuild each damaged path from its recorded inputs and swap it "
              "in if the result checks out."),
        setting("uv", help="uv for --repair (must be the version the path was built with)."),
        setting("python_preference", help="For --repair: where the interpreter may come from."),
        setting("lock_timeout", defaults.BUILD_LOCK_TIMEOUT_S, "Seconds to wait for each lock --repair takes (the gc "
                "lock, the key's); then exit 75 naming the holder."),
        setting("index_url", config.NO_DEFAULT, "For --repair: the configured index URL, whose credentials (if any) "
                "are sent to the index a path records, when it is that index."),
    ),
}


class _Declared(dict):
    """command -> its parameters, each command's made when it is first asked for (a run parses one
    command: the others' declarations cost it nothing); otherwise a dict of every command."""

    def __missing__(self, name: str) -> tuple[Param, ...]:
        params = self[name] = _DECLARE[name]()
        return params

    def __contains__(self, name: object) -> bool:
        return name in _DECLARE

    def __iter__(self):
        return iter(_DECLARE)

    def __len__(self) -> int:
        return len(_DECLARE)

    def keys(self):
        return _DECLARE.keys()

    def values(self):
        return [self[n] for n in _DECLARE]

    def items(self):
        return [(n, self[n]) for n in _DECLARE]

    def get(self, name: str, default: object = None):
        return self[name] if name in _DECLARE else default


COMMANDS: dict[str, tuple[Param, ...]] = _Declared()
# What `generations` deletes with: given any of them, the click command runs it.
GENERATIONS_CHANGES = ("delete", "older_than", "keep", "forget", "keep_records")


# -- values -----------------------------------------------------------------------------------------


def check_timeout(value: float) -> float:
    """--check-timeout: finite, more than 0, at most a day. ValueError otherwise (click: a usage error)."""
    if not 0 < value <= MAX_CHECK_TIMEOUT_S:  # nan fails both comparisons, inf the second
        raise ValueError(f"{value!r} is not a number of seconds more than 0 and at most {MAX_CHECK_TIMEOUT_S:.0f}")
    return value


def convert(p: Param, value: str) -> object:
    """`value` (text from argv) as the value click gives the command; ValueError where click would
    refuse it, or where this parser is not sure to agree (click decides then)."""
    if p.setting is not None:
        return config.convert(p.setting, value)
    if p.kind in ("int", "ints"):
        return int(value)
    if p.kind == "positive":
        n = int(value)
        if n < 1:
            raise ValueError(value)
        return n
    if p.kind == "timeout":
        return check_timeout(float(value))
    if p.kind == "path":
        return config.path_value(value)  # click.Path(dir_okay=False)
    return value


# -- the fast path's parser -------------------------------------------------------------------------


class Parsed:
    """A command line as parsed: the command, and every parameter's given value (`given`: name →
    value from argv) and effective value with its source (`params`, after `resolve`)."""

    __slots__ = ("command", "file", "given", "params", "sources")

    def __init__(self, command: str, given: dict[str, object]):
        self.command, self.given = command, given
        self.params: dict[str, object] = {}
        self.sources: dict[str, str] = {}
        self.file: dict[str, object] = {}  # the config file's values (`resolve`)


def _by_flag(params: tuple[Param, ...]) -> dict[str, Param]:
    return {f: p for p in params for f in p.flags}


_GROUP_FLAGS = _by_flag(GROUP)


def parse(argv: list[str]) -> Parsed | None:
    """`argv` (without the program name) as click would take it, for a command the fast path runs;
    None for anything else, or anything this parser is not sure click would take the same way."""
    given: dict[str, object] = {}
    command: str | None = None
    positionals: list[str] = []
    flags = _GROUP_FLAGS
    i, only_args = 0, False
    while i < len(argv):
        a = argv[i]
        i += 1
        if only_args or not a.startswith("-") or a == "-":
            if command is None:
                if a not in COMMANDS:
                    return None
                command = a
                flags = {**_GROUP_FLAGS, **_by_flag(COMMANDS[a])}  # a command's own option wins
            else:
                positionals.append(a)
            continue
        if a == "--":
            if command is None:
                return None
            only_args = True
            continue
        if a.startswith("--"):
            name, eq, value = a.partition("=")
            p = flags.get(name)
            if p is None:
                return None  # --help, --version of the group, an unknown option: click's
            if p.takes_value:
                if not eq:
                    if i >= len(argv):
                        return None
                    value, i = argv[i], i + 1
                if not _give(given, p, value):
                    return None
            elif eq or not _give(given, p, None):
                return None
            continue
        for c in a[1:]:  # -v, -q, -vvq: short flags only
            p = flags.get("-" + c)
            if p is None or p.takes_value or not _give(given, p, None):
                return None
    if command is None:
        return None
    args = [p for p in COMMANDS[command] if p.argument]
    if args and args[-1].kind == "list":  # nargs=-1 (the last one): what the others leave
        variadic = args.pop()
        if len(positionals) < len(args):
            return None
        given[variadic.name] = tuple(positionals[len(args):])
        positionals = positionals[:len(args)]
    required = [p for p in args if p.default is None]  # click's: an argument with a default may be left out
    if not len(required) <= len(positionals) <= len(args) or args[:len(required)] != required:
        return None
    for p, value in zip(args, positionals, strict=False):
        try:
            given[p.name] = convert(p, value)
        except ValueError:
            return None
    for p in args[len(positionals):]:
        given[p.name] = p.default
    return Parsed(command, given)


def _give(given: dict[str, object], p: Param, value: str | None) -> bool:
    """Record one occurrence of option `p`; False where click's answer is not this parser's to give
    (a repeated single-valued option, a value click refuses)."""
    if p.kind == "count":
        given[p.name] = int(given.get(p.name, 0)) + 1  # type: ignore[call-overload]
        return True
    if p.kind in ("flag", "bool"):
        if p.name in given:
            return True
        given[p.name] = True
        return True
    if p.kind == "list":
        given[p.name] = (*given.get(p.name, ()), value)  # type: ignore[misc]
        return True
    if p.kind == "ints":
        try:
            given[p.name] = (*given.get(p.name, ()), int(value))  # type: ignore[misc, arg-type]
        except ValueError:
            return False
        return True
    if p.name in given:
        return False
    try:
        given[p.name] = convert(p, value)  # type: ignore[arg-type]
    except ValueError:
        return False
    return True


def resolve(parsed: Parsed, environ, file: dict[str, object]) -> bool:
    """Fill `parsed.params` with every parameter's value as click would give it: from argv, else
    the environment variable, else the config file's `file` values, else the default. False when a
    value is one click would refuse (click then says so)."""
    parsed.file = file
    for p in (*GROUP, *COMMANDS[parsed.command]):
        if p.argument:
            parsed.params[p.name] = parsed.given[p.name]
            continue
        flag = parsed.given.get(p.name)
        try:
            if p.setting is not None:
                value, source = config.effective(p.setting, flag, environ, file,
                                                 config.NO_DEFAULT if p.no_default else p.default)
                if source == "file" and isinstance(value, str):
                    value = config.convert(p.setting, value)
            elif flag is not None:
                value, source = flag, "flag"
            elif p.env and environ.get(p.env):
                value, source = convert(p, environ[p.env]), "env"
            else:
                value, source = p.default, "default"
        except ValueError:
            return False
        parsed.params[p.name] = value
        parsed.sources[p.name] = source
    return True
