"""Every location under ROOT, in one table: where it is, who may enter it, what it holds.

The names below are paths relative to ROOT, as plain strings; `at(root, rel)` joins one to a root,
`leaf(rel)` is its last component (for a call relative to its parent's descriptor). Nothing is
imported: the fast paths (build/memo.py, roots/switch.py, integrity/reads.py) use this module
before the library loads, and `Layout` (core/layout.py) is the Path view of the same table. A new
location is a line here (and, for a directory, its mode in DIRS, so that `Layout.ensure` checks
it); README.md's "On disk" lists exactly the table's locations (tests/core/test_locations.py).

Every directory under ROOT is on one file system, so a rename between them is atomic.
"""

from __future__ import annotations

PUBLIC = 0o755  # readable by every user: environments run from here
PRIVATE = 0o700  # the store's owner alone: locks, the index, secrets, caches

ROOT = ""
STORE = "store"
LINKS_POOL = "store/.links"
WHEEL_HOME = "store/.wheels"
VAR = "var"
DB = "var/db.sqlite"
LOCKS = "var/locks"
LOG = "var/log"
TMP = "var/tmp"
TRASH = "var/trash"
TEMPROOTS = "var/temproots"
WHEEL_SEALS = "var/wheels"
MEMO = "var/memo"
USED = "var/used"
OPS = "var/ops"
LOCKPROOFS = "var/lockproofs"
GC_RESERVE = "var/gc-reserve"
SEEN = "var/seen.json"
ROOTS_SEQ = "var/roots-seq"
RECORDS_KEY = "var/records.key"
PYC_KEY = "var/pyc-cache.key"
PROFILES = "profiles"
GCROOTS = "gcroots"
HOLDS = "holds"
PYTHON = "python"
CACHE = "cache"
UV_CACHE = "cache/uv"
PYC_CACHE = "cache/pyc"
DOWNLOADS = "cache/downloads"

# The directories `Layout.ensure` makes or checks, parents before children, with their modes. The
# pool and the wheel home are made on demand (Layout.ensure_pool); holds/ by the first hold
# (Layout.ensure_holds), and checked as the others on every open once it exists;
# var/memo, var/used, var/ops and var/lockproofs by their first writer (private_dir, 0700).
DIRS = (
    (ROOT, PUBLIC), (STORE, PUBLIC), (LINKS_POOL, PUBLIC), (WHEEL_HOME, PUBLIC), (PROFILES, PUBLIC),
    (GCROOTS, PUBLIC), (HOLDS, PUBLIC), (PYTHON, PUBLIC),
    (VAR, PRIVATE), (LOCKS, PRIVATE), (TEMPROOTS, PRIVATE), (TMP, PRIVATE), (TRASH, PRIVATE), (LOG, PRIVATE),
    (WHEEL_SEALS, PRIVATE),
    # uv takes its cache lock in cache/uv: only the owner may open it.
    (CACHE, PRIVATE), (UV_CACHE, PRIVATE), (PYC_CACHE, PRIVATE), (DOWNLOADS, PRIVATE),
)

# The table: each location as the docs write it under ROOT/ (a directory ends in `/`, `<...>` is one
# name of many), and what it holds. README.md's "On disk" shows these, and no other.
TABLE = (
    (STORE + "/", "store paths and the shared pools (0755: every user runs environments from here)"),
    (STORE + "/<key>-<name>/", "a read-only environment (.llmgw/manifest.json says what it is, .llmgw/contents "
                               "lists every entry with its hash); the store's own uv is one, <key>-uv-<version>-bin"),
    (STORE + "/<key>-<name>.partial/", "a build in progress: only the holder of the key's lock touches it"),
    (LINKS_POOL + "/", "optimise's pool: one link per distinct file content"),
    (WHEEL_HOME + "/<id>/", "the wheel home: unpacked wheels every environment hard-links from "
                            "(uv's archive bucket, cache/uv/archive-v0, links here)"),
    (VAR + "/", "0700: only the store's owner enters"),
    (DB, "the index (WAL; 0600, as are -wal and -shm)"),
    (DB + ".bak-<time>/", "an index `doctor --rebuild-index` moved aside, kept as it was"),
    (LOCKS + "/", "one lock per key and per profile, gc.lock, seen.lock (0600 each); <name>.owner says "
                  "who holds it, <key>.pgids what a build runs"),
    (LOG + "/", "full output of failed commands"),
    (TMP + "/", "scratch trees on the store's file system (check-<pid>-…, pull-<pid>-…)"),
    (TRASH + "/", "what gc and failed pulls took out of the way, emptied by gc"),
    (TEMPROOTS + "/<pid>-<token>", "store paths a live process is building or linking (gc keeps them)"),
    (WHEEL_SEALS + "/<id>", "what each sealed wheel home entry holds (its checked listing)"),
    (MEMO + "/<digest>", "the build memo: recipe and options -> store path, for a cache hit without the index"),
    (USED + "/<name>", "last-use stamps a hit leaves instead of writing the index"),
    (OPS + "/<op>.json", "when gc, verify, build and pull last succeeded or failed"),
    (LOCKPROOFS + "/<name>", "a path's lock, proved once, kept for switches"),
    (GC_RESERVE, "space gc gives back first on a full disk"),
    (SEEN, "the newest signed documents accepted (nodes' roots documents, release pointers), per cache "
           "URL, kind and name: older ones are refused as replays"),
    (ROOTS_SEQ, "the last sequence number this node published its roots document with"),
    (RECORDS_KEY, "the secret that seals generation records, summaries and lock proofs"),
    (PYC_KEY, "the secret that tags bytecode cache entries"),
    (PROFILES + "/<p>", "a profile: a link to its current generation, <p>-<N>-link"),
    (PROFILES + "/<p>-<N>-link", "generation N: a link to ../store/<key>-<name>"),
    (PROFILES + "/.<p>-<N>.record", "what generation N was (its lock included)"),
    (PROFILES + "/.<p>.history", "who switched the profile, and when"),
    (PROFILES + "/.<p>.summary", "one keyed file `generations` reads instead of every record"),
    (GCROOTS + "/<pin>", "a pin: a link to ../store/<key>-<name>"),
    (HOLDS + "/<p>", "a held profile (`hold`): its release is not followed"),
    (PYTHON + "/", "interpreters uv manages for the store"),
    (CACHE + "/", "caches gc may prune (0700)"),
    (UV_CACHE + "/", "uv's cache"),
    (PYC_CACHE + "/", "bytecode a build compiled, keyed; entries a build used are links to its frozen pycs"),
    (DOWNLOADS + "/", "sources and release assets fetched for builds"),
)


def at(root: str, rel: str) -> str:
    """ROOT/rel, as a string (`root` itself for ROOT)."""
    return root + "/" + rel if rel else root


def leaf(rel: str) -> str:
    """The last component of `rel`: its name in its parent directory."""
    return rel.rpartition("/")[2]


# -- names inside profiles/ --------------------------------------------------------------------

LINK_SUFFIX = "-link"


def generation_link(profile: str, number: int) -> str:
    """`<p>-<N>-link`: generation N of profile p, in profiles/."""
    return f"{profile}-{number}{LINK_SUFFIX}"


def is_generation_link(name: str) -> bool:
    """Whether `name` in profiles/ has the shape of a generation link (a profile's is any other)."""
    return name.endswith(LINK_SUFFIX)


def split_generation_link(name: str) -> tuple[str, int] | None:
    """(profile, N) of a name of the shape `<p>-<N>-link` (p any non-empty text without a newline,
    N decimal digits: what gc counts as a generation, so as wide as what the store ever made), else
    None. A caller that wants exactly what `generation_link` writes compares the two."""
    if not name.endswith(LINK_SUFFIX):
        return None
    profile, sep, digits = name[: -len(LINK_SUFFIX)].rpartition("-")
    if not sep or not profile or "\n" in profile or not digits.isdecimal():
        return None
    return profile, int(digits)


def generation_of(profile: str, name: str) -> int | None:
    """N when `name` is the link of generation N of `profile`, else None."""
    split = split_generation_link(name)
    return split[1] if split is not None and split[0] == profile else None


def record_file(profile: str, number: int) -> str:
    """`.<p>-<N>.record`: what generation N was, in profiles/."""
    return f".{profile}-{number}.record"


def history_file(profile: str) -> str:
    """`.<p>.history`: who switched the profile when, in profiles/."""
    return f".{profile}.history"


def summary_file(profile: str) -> str:
    """`.<p>.summary`: the profile's generations in one keyed file, in profiles/."""
    return f".{profile}.summary"


def profile_lock_name(profile: str) -> str:
    """The name of profile p's lock in var/locks (locks.hold adds `.lock`)."""
    return f"profile-{profile}"
