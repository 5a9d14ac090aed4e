"""One view of a fleet from its binary cache: every node's signed roots document (what each
profile runs, when it last published) and every release pointer, each checked as its reader checks
it (cache_gc.read_roots, releases.parse). A document that fails its checks is shown as refused,
with why, and the rest is still shown: this is a view, nothing is deleted or switched by it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmgw_store.cache import releases
from llmgw_store.cache.backends import RetryPolicy, backend_for
from llmgw_store.cache.cache_gc import read_roots
from llmgw_store.cache.signing import trusted_keys
from llmgw_store.core.credentials import public_url
from llmgw_store.core.errors import IntegrityError, StoreError, UsageError
from llmgw_store.core.results import Result, fields_of

MAX_SHOWN = 10_000  # nodes or releases: a listing past it is cut short (and says so)


@dataclass(frozen=True)
class NodeState(Result):
    node: str  # the document's name (roots/<node>.json) until it is checked, then its signed node
    time: float | None = None  # when it last published (signed)
    seq: int | None = None
    profiles: dict[str, str] = field(default_factory=dict)  # profile -> key its current generation runs
    keys: int = 0  # store paths its roots hold
    refused: str | None = None  # why its document was refused (then nothing else is shown of it)

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


def view(url: str, keep_from: list[str] | tuple[str, ...], release_keys: list[str] | tuple[str, ...] = (), *,
         policy: RetryPolicy | None = None) -> FleetView:
    """The fleet as the cache `url` holds it: nodes' roots checked against `keep_from` (each node's
    key, named after it), release pointers against `release_keys` (the builders')."""
    nodes_trusted = trusted_keys(_keys(keep_from))
    if not nodes_trusted:
        raise UsageError("fleet needs the public keys of the nodes whose roots it shows: --keep-from KEY")
    backend = backend_for(url, policy)
    roots = backend.list("roots")
    pointers = backend.list("releases")
    truncated = len(roots) > MAX_SHOWN or len(pointers) > MAX_SHOWN
    nodes = []
    for item in sorted(roots, key=lambda i: i.name)[:MAX_SHOWN]:
        node = item.name[len("roots/"):-len(".json")]
        try:
            doc = read_roots(backend, item, nodes_trusted)
        except (IntegrityError, StoreError) as exc:
            nodes.append(NodeState(node, refused=_why(exc)))
            continue
        nodes.append(NodeState(doc.node, doc.time, doc.seq, dict(doc.profiles), len(doc.keys)))
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
        except StoreError as exc:
            shown.append(ReleaseState(name, refused=str(exc)))
            continue
        shown.append(ReleaseState(name, r.key, r.name, r.seq, r.time, r.signer))
    return FleetView(public_url(url), tuple(nodes), tuple(shown), truncated)
