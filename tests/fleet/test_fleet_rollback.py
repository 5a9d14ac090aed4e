"""The way back does not expire silently (issue 31): a node's cold generations are in the roots it
publishes, so cache gc keeps them and `rollback --to N` on a substitute-only node pulls them; the
listing says where each cold generation would come from; a dry run names every node holding an
object; a builder that keeps what it pushed in a profile publishes it the same way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import copy_store, real_uv, run_cli
from tests.support.cachegc import fleet  # noqa: F401  (fixture)
from tests.support.delta import delta_wheels, push2, template, world  # noqa: F401  (fixtures)


@pytest.fixture
def three(fleet, template, tmp_path):
    """The builder holds a, b and c (tinyengine 1.1) and has pushed all three; the node is a copy
    of its store with profile p at generations 1 (a), 2 (b), 3 (c, current), generation 1
    deleted and its path collected: cold, its record kept."""
    w = fleet
    c = json.loads(run_cli(w["root"], "--json", "build", str(template["recipe"]), "--index-url", template["index"].url,
                           "--uv", str(real_uv()), "--as-of", "2024-08-02", "--version", "1.1", check=True).stdout)
    names = [*w["names"], Path(c["path"]).name]
    url = f"file://{tmp_path / 'cache'}"
    for n in names:
        push2(w, n, url)
    node = copy_store(w["root"], tmp_path / "node-root")
    for n in names:
        run_cli(node, "activate", "p", n, check=True)
    run_cli(node, "generations", "p", "--delete", "1", check=True)
    gc = json.loads(run_cli(node, "--json", "gc", check=True).stdout)
    assert names[0] in [d["name"] for d in gc["deleted"]] and not (node / "store" / names[0]).exists()
    return {**w, "url": url, "node_root": node, "abc": names}


def _gc(w, *extra, keys=("node-1",), check=True):
    keep = [arg for k in keys for arg in ("--keep-from", str(w["keys"] / f"{k}.public"))]
    proc = run_cli(w["root"], "--json", "cache", "gc", w["url"], *keep, *extra, check=check)
    return json.loads(proc.stdout) if check else proc


def _rollback(w, to: str):
    return run_cli(w["node_root"], "--json", "rollback", "p", "--to", to, "--substitute-only", "--substituter",
                   w["url"], "--trusted-key", str(w["keys"] / "builder-1.public"))


def test_cache_gc_keeps_a_nodes_cold_generation_and_rollback_pulls_it(three):
    w = three
    a, b, c = w["abc"]
    gens = json.loads(run_cli(w["node_root"], "--json", "generations", "p", check=True).stdout)["generations"]
    assert [(g["number"], g["state"]) for g in gens] == [(1, "cold"), (2, "hot"), (3, "hot")]
    roots = json.loads(run_cli(w["node_root"], "--json", "push-roots", "--to", w["url"], "--secret-key",
                               str(w["keys"] / "node-1.secret"), check=True).stdout)
    assert a[:32] in roots["keys"] and roots["cold"] == [a[:32]]
    dry = _gc(w, "--grace", "0s", "--dry-run")
    assert dry["why_kept"][f"{a[:32]}.json"] == "held by the roots of node-1"
    done = _gc(w, "--grace", "0s")  # past the grace: only what a roots document holds stays
    assert f"{a[:32]}.json" not in done["deleted_objects"]
    proc = _rollback(w, "1")
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert (r["generation"], r["previous"], r["rebuilt"]) == (1, 3, "substituted")
    assert (w["node_root"] / "store" / a).is_dir()


def test_forgotten_generations_are_not_published(three):
    """The positive control: with its record forgotten, generation 1 is no way back, and the gc
    deletes it; a substitute-only rollback to it then has nothing to pull."""
    w = three
    a = w["abc"][0]
    run_cli(w["node_root"], "generations", "p", "--forget", "1", check=True)
    roots = json.loads(run_cli(w["node_root"], "--json", "push-roots", "--to", w["url"], "--secret-key",
                               str(w["keys"] / "node-1.secret"), check=True).stdout)
    assert a[:32] not in roots["keys"] and roots["cold"] == []
    assert f"{a[:32]}.json" in _gc(w, "--grace", "0s")["deleted_objects"]


def test_generations_says_where_a_cold_generation_comes_from(three):
    w = three
    node = w["node_root"]

    def listing(*extra):
        gens = json.loads(run_cli(node, "--json", "generations", "p", *extra, check=True).stdout)["generations"]
        return [g["comes_from"] for g in gens]

    assert listing() == ["record", None, None]
    assert listing("--substituter", w["url"]) == ["caches, else record", None, None]
    assert listing("--substituter", w["url"], "--substitute-only") == ["caches", None, None]
    assert listing("--substitute-only") == ["nowhere", None, None]
    text = run_cli(node, "generations", "p", "--substituter", w["url"], check=True).stdout.splitlines()
    assert text[0].endswith("(way back: the configured caches, else rebuilt from its record)"), text
    assert "way back" not in text[1] and "way back" not in text[2]


def test_a_dry_run_names_every_node_that_holds_an_object(three):
    w = three
    a, b, c = w["abc"]
    run_cli(w["root"], "keygen", "node-2", "--out", str(w["keys"]), check=True)
    for node in ("node-1", "node-2"):
        run_cli(w["node_root"], "push-roots", "--to", w["url"], "--secret-key", str(w["keys"] / f"{node}.secret"),
                check=True)
    proc = run_cli(w["root"], "cache", "gc", w["url"], "--keep-from", str(w["keys"] / "node-1.public"),
                   "--keep-from", str(w["keys"] / "node-2.public"), "--grace", "0s", "--dry-run", check=True)
    assert f"keep {c[:32]}.json: held by the roots of node-1, node-2" in proc.stdout.splitlines()


def test_a_builder_keeps_what_it_pushed_through_its_own_roots(three):
    """docs/operations.md's builder: what it pushes is a profile's generation, and it publishes its
    roots with its own key; the cache gc trusts builder-1.public too. A path it only built (no
    profile) is neither kept by its local gc nor by the cache gc."""
    w = three
    a, b, c = w["abc"]
    run_cli(w["root"], "activate", "vllm", c, check=True)
    roots = json.loads(run_cli(w["root"], "--json", "push-roots", "--to", w["url"], "--secret-key",
                               str(w["keys"] / "builder-1.secret"), check=True).stdout)
    assert roots["node"] == "builder-1" and c[:32] in roots["keys"] and a[:32] not in roots["keys"]
    done = _gc(w, "--grace", "0s", keys=("builder-1",))
    assert f"{c[:32]}.json" not in done["deleted_objects"] and f"{a[:32]}.json" in done["deleted_objects"]
    assert done["why_kept"][f"{c[:32]}.json"] == "held by the roots of builder-1"
