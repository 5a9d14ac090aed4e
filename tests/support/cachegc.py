"""Cache gc's fleet and its steps, shared by the cache gc tests (tests/cache/test_cache_gc*.py) and the
fleet's way back (tests/fleet/test_fleet_rollback.py): the `fleet` fixture (format-2 `world` of
tests/support/delta.py with a node key), a node publishing its roots, `cache gc` run with that node's
key, and the names a cache holds."""

from __future__ import annotations

import json

import pytest

from llmgw_store.cache.backends import backend_for
from tests.conftest import run_cli


def names_in(url: str) -> set[str]:
    b = backend_for(url)
    return {i.name for folder in ("", "blobs", "roots") for i in b.list(folder)}


@pytest.fixture
def fleet(world):
    """The builder has pushed nothing yet; node-1 has a key of its own."""
    run_cli(world["root"], "keygen", "node-1", "--out", str(world["keys"]), check=True)
    return world


def publish_roots(w, url, *targets, signer="node-1", keys=None):
    """node-1 holds `targets` in a profile and publishes its roots (signed by the key `signer`)."""
    for t in targets:
        run_cli(w["root"], "activate", "app", t, check=True)
    return json.loads(run_cli(w["root"], "--json", "push-roots", "--to", url, "--secret-key",
                              str((keys or w["keys"]) / f"{signer}.secret"), check=True).stdout)


def cache_gc(w, url, *extra, check=True):
    proc = run_cli(w["root"], "--json", "cache", "gc", url, "--keep-from", str(w["keys"] / "node-1.public"), *extra,
                   check=check)
    return json.loads(proc.stdout) if check else proc
