"""`stats`: what the store holds and costs, for people (`--json`) and for node monitoring (a
Prometheus textfile, written atomically so the collector never reads half a file, and never
through a link: system/files.write_outside): besides the
gauges of paths, bytes and caches, when gc, verify, build and pull last succeeded and how often
they failed (core/oplog.py), and each profile's current generation and what it runs, so that an
alert sees a node that stopped collecting, found damage, or drifted from the fleet
(docs/operations.md#metrics-and-alerts)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmgw_store.app.results import Result
from llmgw_store.base.errors import NoStoreError, StoreError
from llmgw_store.base.report import say
from llmgw_store.core import oplog
from llmgw_store.core.layout import Layout
from llmgw_store.core.local_store import Store
from llmgw_store.core.locations import is_generation_link
from llmgw_store.core.names import check_profile
from llmgw_store.roots.generations import current_generation, generation_target
from llmgw_store.system.files import write_outside
from llmgw_store.system.trees import free_bytes, walk_files


@dataclass(frozen=True)
class Stats(Result):
    """Byte figures are on disk (st_blocks, each inode once) unless named apparent: `bytes_on_disk`
    counts every store file once however many paths link it; `uv_cache_bytes_unshared` and
    `pyc_cache_bytes` count only what no store path shares (what pruning could free);
    `cache_bytes_on_disk` is the figure `gc --max-cache` compares with its SIZE."""

    root: str
    paths: int
    bytes_apparent: int
    bytes_on_disk: int
    profiles: int
    generations: int
    pins: int
    uv_cache_bytes: int
    uv_cache_bytes_unshared: int
    downloads_bytes: int
    free_bytes: int
    pyc_cache_bytes: int = 0
    cache_bytes_on_disk: int = 0
    operations: dict[str, dict[str, Any]] = field(default_factory=dict)
    current_generations: tuple[dict[str, Any], ...] = ()


def _disk_usage(tree: Path, seen: set[tuple[int, int]]) -> tuple[int, int]:
    """(apparent bytes, bytes on disk) of regular files, each inode counted once across calls."""
    apparent = disk = 0
    for _, st in walk_files(tree):
        apparent += st.st_size
        ident = (st.st_dev, st.st_ino)
        if ident not in seen:
            seen.add(ident)
            disk += st.st_blocks * 512
    return apparent, disk


def stats(*, root: str | Path | None = None, prometheus: str | Path | None = None) -> Stats:
    try:
        store = Store.open(root, readonly=True)
    except NoStoreError as exc:
        say(exc.nothing_to("count"))
        result = _empty(Layout.at(root))
    else:
        with store:
            result = _count(store)
    if prometheus is not None:
        write_prometheus(Path(prometheus), result)
    return result


def _empty(layout: Layout) -> Stats:
    """The figures of a root that holds no store yet: nothing, and the free space where it would be."""
    where = layout.root
    while not where.exists() and where != where.parent:
        where = where.parent
    return Stats(root=str(layout.root), paths=0, bytes_apparent=0, bytes_on_disk=0, profiles=0, generations=0, pins=0,
                 uv_cache_bytes=0, uv_cache_bytes_unshared=0, downloads_bytes=0, free_bytes=free_bytes(where))


def _count(store: Store) -> Stats:
    layout, index = store.layout, store.index
    rows = index.paths()
    seen: set[tuple[int, int]] = set()
    _, store_disk = _disk_usage(layout.store, seen)
    uv_apparent, uv_disk = _disk_usage(layout.uv_cache, seen)  # only what environments do not share
    _, pyc_disk = _disk_usage(layout.pyc_cache, seen)
    _, dl_disk = _disk_usage(layout.downloads, seen)
    profiles = [e.name for e in os.scandir(layout.profiles)
                if e.is_symlink() and not is_generation_link(e.name) and not e.name.startswith(".")]
    generations = sum(1 for e in os.scandir(layout.profiles) if is_generation_link(e.name))
    result = Stats(
        root=str(layout.root), paths=len(rows), bytes_apparent=sum(r.size for r in rows),
        bytes_on_disk=store_disk, profiles=len(profiles), generations=generations, pins=len(index.pins()),
        uv_cache_bytes=uv_apparent, uv_cache_bytes_unshared=uv_disk, downloads_bytes=dl_disk,
        free_bytes=free_bytes(layout.store), pyc_cache_bytes=pyc_disk, cache_bytes_on_disk=uv_disk + pyc_disk,
        operations=oplog.read_all(layout), current_generations=tuple(_current(store, profiles)),
    )
    return result


def _current(store: Store, profiles: list[str]) -> list[dict[str, Any]]:
    """Each profile's current generation and what its store path is (engine, version, variant)."""
    out = []
    for profile in sorted(profiles):
        try:
            check_profile(profile)
            number = current_generation(store.layout, profile)
            name = Path(generation_target(store.layout, profile, number)).name
        except (StoreError, OSError):
            continue  # not a profile (a stray link), or one mid-switch: the next stats shows it
        row = store.index.path_by_name(name)
        out.append({"profile": profile, "generation": number, "name": name, "engine": row and row.engine,
                    "version": row and row.version, "variant": row and row.variant})
    return out


def _label(value: object) -> str:
    """A Prometheus label value: backslash, quote and newline escaped."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def prometheus_text(stats: Stats) -> str:
    """The textfile: every figure of `stats` as Prometheus samples, labelled with the store's root."""
    s = stats.to_json()
    lab = f'root="{_label(s["root"])}"'
    lines = [
        "# HELP llmgw_store_paths Store paths registered in the index.",
        "# TYPE llmgw_store_paths gauge",
        f"llmgw_store_paths{{{lab}}} {s['paths']}",
        "# HELP llmgw_store_bytes Bytes of store paths: apparent (sum of file sizes) and on disk (after hardlink dedup).",
        "# TYPE llmgw_store_bytes gauge",
        f'llmgw_store_bytes{{{lab},kind="apparent"}} {s["bytes_apparent"]}',
        f'llmgw_store_bytes{{{lab},kind="disk"}} {s["bytes_on_disk"]}',
        "# HELP llmgw_store_profiles Profiles.",
        "# TYPE llmgw_store_profiles gauge",
        f"llmgw_store_profiles{{{lab}}} {s['profiles']}",
        "# HELP llmgw_store_generations Generations of all profiles.",
        "# TYPE llmgw_store_generations gauge",
        f"llmgw_store_generations{{{lab}}} {s['generations']}",
        "# HELP llmgw_store_cache_bytes Bytes on disk in caches (only what no environment shares).",
        "# TYPE llmgw_store_cache_bytes gauge",
        f'llmgw_store_cache_bytes{{{lab},cache="uv"}} {s["uv_cache_bytes_unshared"]}',
        f'llmgw_store_cache_bytes{{{lab},cache="pyc"}} {s["pyc_cache_bytes"]}',
        f'llmgw_store_cache_bytes{{{lab},cache="downloads"}} {s["downloads_bytes"]}',
        "# HELP llmgw_store_free_bytes Free bytes on the store's filesystem.",
        "# TYPE llmgw_store_free_bytes gauge",
        f"llmgw_store_free_bytes{{{lab}}} {s['free_bytes']}",
    ]
    ops = s["operations"]
    for metric, kind, field_, help_ in (
        ("last_success_timestamp_seconds", "gauge", "last_success",
         "When the operation last succeeded (seconds since the epoch; 0: never)."),
        ("last_failure_timestamp_seconds", "gauge", "last_failure",
         "When the operation last failed (seconds since the epoch; 0: never)."),
        ("successes_total", "counter", "successes", "Runs of the operation that succeeded."),
        ("failures_total", "counter", "failures",
         "Runs of the operation that failed (verify: found a damaged path)."),
    ):
        lines += [f"# HELP llmgw_store_{metric} {help_}", f"# TYPE llmgw_store_{metric} {kind}"]
        lines += [f'llmgw_store_{metric}{{{lab},op="{op}"}} {_number(ops[op][field_])}' for op in sorted(ops)]
    lines += ["# HELP llmgw_store_failures_by_cause_total Failed runs of the operation, by cause (pull: miss, "
              "unreachable, untrusted, damaged).", "# TYPE llmgw_store_failures_by_cause_total counter"]
    lines += [f'llmgw_store_failures_by_cause_total{{{lab},op="{op}",cause="{_label(cause)}"}} {_number(n)}'
              for op in sorted(ops) for cause, n in sorted(ops[op].get("causes", {}).items())]
    if "pull" in ops:
        lines += ["# HELP llmgw_store_cache_last_contact_timestamp_seconds When a binary cache last answered this "
                  "node, serving or lacking what it asked (seconds since the epoch; 0: never).",
                  "# TYPE llmgw_store_cache_last_contact_timestamp_seconds gauge",
                  f"llmgw_store_cache_last_contact_timestamp_seconds{{{lab}}} "
                  f"{_number(ops['pull']['last_cache_contact'])}",
                  "# HELP llmgw_store_cache_fetched_bytes_total Bytes fetched from binary caches (pulls and "
                  "substitutions).",
                  "# TYPE llmgw_store_cache_fetched_bytes_total counter",
                  f"llmgw_store_cache_fetched_bytes_total{{{lab}}} {_number(ops['pull']['bytes_fetched'])}"]
    if "verify" in ops:
        lines += ["# HELP llmgw_store_verify_damaged_paths Damaged store paths the last verify found.",
                  "# TYPE llmgw_store_verify_damaged_paths gauge",
                  f"llmgw_store_verify_damaged_paths{{{lab}}} {_number(ops['verify']['damaged'])}"]
    current = s["current_generations"]
    lines += ["# HELP llmgw_store_profile_generation The current generation of each profile.",
              "# TYPE llmgw_store_profile_generation gauge"]
    lines += [f'llmgw_store_profile_generation{{{lab},profile="{_label(c["profile"])}"}} {c["generation"]}'
              for c in current]
    lines += ["# HELP llmgw_store_profile_info What each profile's current generation runs (always 1).",
              "# TYPE llmgw_store_profile_info gauge"]
    lines += [f'llmgw_store_profile_info{{{lab},profile="{_label(c["profile"])}",engine="{_label(c["engine"] or "")}",'
              f'version="{_label(c["version"] or "")}",variant="{_label(c["variant"] or "")}",'
              f'path="{_label(c["name"])}"}} 1' for c in current]
    return "\n".join(lines) + "\n"


def _number(value: object) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(int(value))  # type: ignore[call-overload]


def write_prometheus(path: Path, stats: Stats) -> None:
    # Outside the root, in a directory a collector reads: a random name created O_EXCL|O_NOFOLLOW
    # in the checked directory, renamed over (system/files.py); node_exporter reads the old file or
    # the new one, and nothing is ever written through a link planted there.
    write_outside(path, prometheus_text(stats).encode(), mode=0o644)
