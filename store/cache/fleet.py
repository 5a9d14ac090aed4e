"""One view of a fleet from its binary cache: every node's signed roots document (what each
profile runs, when it last published) and every release pointer, each checked as its reader checks
it (cache_gc.read_roots, releases.parse). A document that fails its checks is shown as refused,
with why, and the rest is still shown: this is a view, nothing is deleted or switched by it.

A node's roots document also signs, per profile, the release it follows (`releases`, written by
push-roots from the node's config file); each such profile is `in_sync` when the key it runs is the
key its release points at, `out_of_date` when not, `unknown` when the release is missing or refused.
`prometheus_text` is the textfile of that (`fleet --prometheus FILE`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from llmgw_store.app.credentials import public_url
from llmgw_store.app.results import Result, fields_of
from llmgw_store.base.errors import IntegrityError, StoreError, UsageError
from llmgw_store.cache import pointer, releases
from llmgw_store.cache.backends import RetryPolicy, backend_for
from llmgw_store.cache.cache_gc import PROFILE_RE, read_roots
from llmgw_store.cache.signing import trusted_keys
from llmgw_store.system.files import write_outside

MAX_SHOWN = 10_000  # nodes or releases: a listing past it is cut short (and says so)


@dataclass(frozen=True)
class NodeState(Result):
    node: str  # the document's name (roots/<node>.json) until it is checked, then its signed node
    time: float | None = None  # when it last published (signed)
    seq: int | None = None
    profiles: dict[str, str] = field(default_factory=dict)  # profile -> key its current generation runs
    keys: int = 0  # store paths its roots hold
    refused: str | None = None  # why its document was refused (then nothing else is shown of it)
    releases: dict[str, str] = field(default_factory=dict)  # profile -> release it follows (signed)
    state: dict[str, str] = field(default_factory=dict)  # profile -> in_sync | out_of_date | held | unknown
    held: tuple[str, ...] = ()  # profiles the node holds where they are (`hold`, signed)

    def body(self) -> dict[str, Any]:
        return {**fields_of(self), "time": releases.iso(self.time)}


@dataclass(frozen=True)
class ReleaseState(Result):
    release: str
    key: str | None = None
    name: str | None = None
    seq: int | None = None
    time: float | None = None
    signer: str | None = None
    refused: str | None = None

    def body(self) -> dict[str, Any]:
        return {**fields_of(self), "time": releases.iso(self.time)}


@dataclass(frozen=True)
class FleetView(Result):
    cache: str
    nodes: tuple[NodeState, ...]
    releases: tuple[ReleaseState, ...]
    truncated: bool = False

    def body(self) -> dict[str, Any]:
        return {"cache": self.cache, "nodes": [n.body() for n in self.nodes],
                "releases": [r.body() for r in self.releases], "truncated": self.truncated}


def _keys(values: list[str] | tuple[str, ...]) -> list[str]:
    out: list[str] = []
    for v in values:  # a directory stands for the .public files in it (as cache gc takes them)
        out += sorted(str(p) for p in Path(v).glob("*.public")) if os.path.isdir(v) else [v]
    return out


def _why(exc: StoreError) -> str:
    text = str(exc)
    cut = text.find(" (gc stopped")
    return text[:cut] if cut >= 0 else text


class _Kept:
    """A backend that keeps the bytes of the last object read: the roots document read_roots
    checked (its signature covers them all), whose `releases` this module then reads."""

    def __init__(self, backend):
        self.backend, self.last = backend, None

    def get(self, name, **kw):
        self.last = self.backend.get(name, **kw)
        return self.last


def _followed(data: bytes | None) -> dict[str, str]:
    """profile -> release from a checked roots document's bytes; {} for none or a wrong shape."""
    try:
        value = json.loads(data or b"{}").get("releases", {})
    except (ValueError, AttributeError, RecursionError):
        return {}
    if not isinstance(value, dict) or len(value) > MAX_SHOWN:
        return {}
    out = {}
    for p, r in value.items():
        if isinstance(p, str) and PROFILE_RE.fullmatch(p) and pointer.release_name_ok(r):
            out[p] = r
    return out


def _held(data: bytes | None) -> tuple[str, ...]:
    """The profiles a checked roots document says are held; () for none or a wrong shape."""
    try:
        value = json.loads(data or b"{}").get("held", [])
    except (ValueError, AttributeError, RecursionError):
        return ()
    if not isinstance(value, list) or len(value) > MAX_SHOWN:
        return ()
    return tuple(p for p in value if isinstance(p, str) and PROFILE_RE.fullmatch(p))


def _states(node: NodeState, pointers: dict[str, ReleaseState]) -> dict[str, str]:
    out = {}
    for profile, release in sorted(node.releases.items()):
        rel = pointers.get(release)
        if profile in node.held:  # the operator's choice, not a lag: not out of date
            out[profile] = "held"
        elif rel is None or rel.key is None:
            out[profile] = "unknown"
        else:
            out[profile] = "in_sync" if node.profiles.get(profile) == rel.key else "out_of_date"
    return out


def view(url: str, keep_from: list[str] | tuple[str, ...], release_keys: list[str] | tuple[str, ...] = (), *,
         policy: RetryPolicy | None = None, var: Path | None = None) -> FleetView:
    """The fleet as the cache `url` holds it: nodes' roots checked against `keep_from` (each node's
    key, named after it), release pointers against `release_keys` (the builders') and, with `var`
    (ROOT/var of the store asking: a builder's), against the newest of each this store has seen or
    written (cache/seen.py): a replayed pointer is shown refused, not as what the fleet should run."""
    nodes_trusted = trusted_keys(_keys(keep_from))
    if not nodes_trusted:
        raise UsageError("fleet needs the public keys of the nodes whose roots it shows: --keep-from KEY")
    backend = backend_for(url, policy)
    roots = backend.list("roots")
    pointers = backend.list("releases")
    truncated = len(roots) > MAX_SHOWN or len(pointers) > MAX_SHOWN
    nodes = []
    kept = _Kept(backend)
    for item in sorted(roots, key=lambda i: i.name)[:MAX_SHOWN]:
        node = item.name[len("roots/"):-len(".json")]
        try:
            doc = read_roots(kept, item, nodes_trusted)
        except (IntegrityError, StoreError) as exc:
            nodes.append(NodeState(node, refused=_why(exc)))
            continue
        nodes.append(NodeState(doc.node, doc.time, doc.seq, dict(doc.profiles), len(doc.keys),
                               releases=_followed(kept.last), held=_held(kept.last)))
    shown = []
    rel_trusted: dict[str, bytes] | None = None
    for item in sorted(pointers, key=lambda i: i.name)[:MAX_SHOWN]:
        name = item.name[len("releases/"):-len(".json")]
        try:
            if rel_trusted is None:
                rel_trusted = trusted_keys(_keys(release_keys))
            if not rel_trusted:
                raise UsageError("no trusted key to check it with (--trusted-key: the builder's public key)")
            if not item.regular:
                raise IntegrityError(f"{item.name}: is not a regular file (a link?); refusing it")
            r = releases.fetch(backend, name, rel_trusted)
            if r is None:
                raise IntegrityError(f"{item.name}: listed, but could not be read")
            if var is not None:
                from llmgw_store.cache import seen

                seen.check(var, seen.ANY_CACHE, releases.KIND, name, r.seq, r.digest, f"{public_url(url).rstrip('/')}/{item.name}")
        except StoreError as exc:
            shown.append(ReleaseState(name, refused=str(exc)))
            continue
        shown.append(ReleaseState(name, r.key, r.name, r.seq, r.time, r.signer))
    by_name = {r.release: r for r in shown}
    nodes = [replace(n, state=_states(n, by_name)) if n.releases else n for n in nodes]
    return FleetView(public_url(url), tuple(nodes), tuple(shown), truncated)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def prometheus_text(fleet: FleetView) -> str:
    """`llmgw_store_fleet_node_out_of_date{node,profile,release}`: 1 unless the profile runs the key its
    release points at or is held (0), for every profile a node follows a release with;
    `llmgw_store_fleet_node_held{...}` 1 for a held one; refused nodes are
    `llmgw_store_fleet_node_refused{node} 1`."""
    lines = ["# HELP llmgw_store_fleet_node_out_of_date 1 when a node's profile does not run the key its release "
             "points at (out of date, or the release missing or refused), 0 when in sync.",
             "# TYPE llmgw_store_fleet_node_out_of_date gauge"]
    for n in fleet.nodes:
        for profile, state in n.state.items():
            lines.append(f'llmgw_store_fleet_node_out_of_date{{node="{_label(n.node)}",profile="{_label(profile)}",'
                         f'release="{_label(n.releases[profile])}"}} {0 if state in ("in_sync", "held") else 1}')
    lines += ["# HELP llmgw_store_fleet_node_held 1 when a node holds the profile where it is (hold), whatever its "
              "release says.", "# TYPE llmgw_store_fleet_node_held gauge"]
    lines += [f'llmgw_store_fleet_node_held{{node="{_label(n.node)}",profile="{_label(p)}",'
              f'release="{_label(n.releases[p])}"}} {1 if s == "held" else 0}' for n in fleet.nodes for p, s in n.state.items()]
    lines += ["# HELP llmgw_store_fleet_node_refused 1 when a node's roots document failed its checks.",
              "# TYPE llmgw_store_fleet_node_refused gauge"]
    lines += [f'llmgw_store_fleet_node_refused{{node="{_label(n.node)}"}} {1 if n.refused else 0}'
              for n in fleet.nodes]
    return "\n".join(lines) + "\n"


def write_prometheus(path: str | Path, fleet: FleetView) -> None:
    # Outside any root, in the directory node_exporter reads: a checked directory, a new file
    # renamed over the old one, never written through a link (system/files.py).
    write_outside(path, prometheus_text(fleet).encode(), mode=0o644)
