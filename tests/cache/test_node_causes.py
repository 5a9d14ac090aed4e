"""Why a substitute-only node got nothing (issue 31): each cause its own error, exit code, JSON
`kind` and last line — a miss, caches unreachable after their retries, an object signed by a key
the node does not trust, an object refused as damaged — with the positive case beside each, on
real caches (file:// and the HTTP fault server). The builder and the cache come from test_node's
`fleet` fixture (tinyengine pushed from a builder root, the index stopped)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import run_cli
from tests.support.fault_server import FaultyCache
from tests.support.fleet import _one_error, _store, fleet  # noqa: F401  (fixture)

FAST = {"LLMGW_STORE_CACHE_STALL": "2", "LLMGW_STORE_CACHE_METADATA_TIMEOUT": "2", "LLMGW_STORE_CACHE_ATTEMPTS": "2"}


def _cache_dir(fleet) -> Path:
    return Path(fleet["cache"][len("file://"):])


def _error_doc(proc) -> dict:
    doc = json.loads(proc.stdout)
    assert doc["exit_code"] == proc.returncode
    return doc["error"]


def _ok(proc, cache: str) -> None:
    assert proc.returncode == 0, proc.stderr
    served = [ln for ln in proc.stderr.splitlines() if "] substituted " in ln or ln.startswith("substituted ")]
    assert served and f" from cache {cache} (signed by builder-1)" in served[-1], proc.stderr


def test_a_miss_is_exit_66_and_names_what_the_cache_holds_and_which_input_differs(fleet):
    node, env = fleet["node"], fleet["env"]
    a, _, c = fleet["recipes"]
    # Never pushed, nothing alike in the cache: a plain miss.
    proc = run_cli(node, "--json", "build", str(c), env=env)
    assert proc.returncode == 66, proc.stderr
    err = _error_doc(proc)
    assert err["kind"] == "cache_miss" and err["cause"] == "miss" and err["candidates"] == []
    assert err["caches"] == [{"url": fleet["cache"], "outcome": "miss"}]
    assert err["inputs"]["version"] == "1.1" and err["inputs"]["python"]["version"]
    assert "push it from a builder" in _one_error(proc)

    # The node names another index than the builder did: another key. The cache holds the
    # builder's path of the same engine, version and variant; the line says the index differs.
    other = {**env, "LLMGW_STORE_INDEX_URL": "http://127.0.0.1:9/simple"}
    proc = run_cli(node, "--json", "activate", "svc", str(a), env=other)
    assert proc.returncode == 66, proc.stderr
    err = _error_doc(proc)
    # Both pushed paths are tinyengine 1.0 cpu: b.toml's also differs in its as-of.
    found = {x["name"]: x for x in err["candidates"]}
    assert err["kind"] == "cache_miss" and set(found) == set(fleet["names"].values())
    index_differs = {"input": "index_url", "cache": fleet["index"].url.rstrip("/"), "here": "http://127.0.0.1:9/simple"}
    assert found[fleet["names"]["a.toml"]]["differs"] == [index_differs]
    assert [d["input"] for d in found[fleet["names"]["b.toml"]]["differs"]] == ["as_of", "build.as_of", "index_url"]
    assert found[fleet["names"]["a.toml"]]["cache"] == fleet["cache"]
    assert err["inputs"]["index_url"] == "http://127.0.0.1:9/simple"
    line = _one_error(proc)
    assert fleet["names"]["a.toml"] in line and "index (index_url " in line and "builder's settings" in line
    assert _store(node) == []

    # The builder's index: the same key, pulled; the line names the cache that served it.
    _ok(run_cli(node, "activate", "svc", str(a), env=env), fleet["cache"])


def test_caches_that_stay_down_are_exit_69_not_a_miss(fleet, tmp_path):
    node, (a, _, _) = fleet["node"], fleet["recipes"]
    env = {k: v for k, v in fleet["env"].items() if k != "LLMGW_STORE_OFFLINE"}
    srv = FaultyCache(_cache_dir(fleet), rules=[(r"\.json$", "503")])
    try:
        proc = run_cli(node, "--json", "activate", "svc", str(a), env={**env, **FAST,
                                                                      "LLMGW_STORE_SUBSTITUTERS": srv.url})
        assert proc.returncode == 69, proc.stderr
        err = _error_doc(proc)
        assert err["kind"] == "cache_unreachable" and err["cause"] == "unreachable"
        assert err["caches"][0]["outcome"] == "unreachable" and "503" in err["caches"][0]["problem"]
        line = _one_error(proc)
        assert "could not be asked of " + srv.url in line and "bring the cache back" in line
        assert "no binary cache has" not in line and "push it" not in line
        assert srv.counts["503"] == 2  # its retries were spent first
    finally:
        srv.stop()
    # The same cache, answering: pulled over HTTP, and the line names it.
    srv = FaultyCache(_cache_dir(fleet))
    try:
        _ok(run_cli(node, "activate", "svc", str(a), env={**env, **FAST, "LLMGW_STORE_SUBSTITUTERS": srv.url}),
            srv.url)
    finally:
        srv.stop()
    assert _store(node) == [fleet["names"]["a.toml"]]


def test_an_object_signed_by_a_key_the_node_does_not_trust_is_exit_77(fleet, tmp_path):
    node, env, (a, _, _) = fleet["node"], fleet["env"], fleet["recipes"]
    run_cli(tmp_path / "other", "keygen", "builder-2", "--out", str(tmp_path / "k2"), check=True)
    untrusting = {**env, "LLMGW_STORE_TRUSTED_KEYS": str(tmp_path / "k2" / "builder-2.public")}
    proc = run_cli(node, "--json", "activate", "svc", str(a), env=untrusting)
    assert proc.returncode == 77, proc.stderr
    err = _error_doc(proc)
    assert err["kind"] == "cache_untrusted" and err["caches"][0]["outcome"] == "untrusted"
    line = _one_error(proc)
    assert "signed only by keys this node does not trust" in line and "signed by: builder-1" in line
    assert "add the builder's public key to trusted_keys" in line
    assert _store(node) == []
    _ok(run_cli(node, "activate", "svc", str(a), env=env), fleet["cache"])


def test_an_object_refused_as_damaged_is_exit_65(fleet):
    node, env, (a, _, _) = fleet["node"], fleet["env"], fleet["recipes"]
    key = fleet["names"]["a.toml"][:32]
    meta_file = _cache_dir(fleet) / f"{key}.json"
    good = meta_file.read_bytes()
    # A signed field changed after signing: the builder's signature no longer verifies.
    doc = json.loads(good)
    doc["size"] += 1
    meta_file.write_text(json.dumps(doc))
    proc = run_cli(node, "--json", "activate", "svc", str(a), env=env)
    assert proc.returncode == 65, proc.stderr
    err = _error_doc(proc)
    assert err["kind"] == "cache_damaged" and err["caches"][0]["outcome"] == "damaged"
    line = _one_error(proc)
    assert "serves " + fleet["names"]["a.toml"] + " damaged" in line and "push it again from the builder" in line
    meta_file.write_bytes(good)

    # A blob whose bytes differ from their signed digest (the object's metadata is intact).
    blobs = sorted((_cache_dir(fleet) / "blobs").iterdir(), key=lambda p: -p.stat().st_size)
    saved = blobs[0].read_bytes()
    blobs[0].write_bytes(saved[:-8] + b"\0" * 8)
    proc = run_cli(node, "--json", "activate", "svc", str(a), env=env)
    assert proc.returncode == 65, proc.stderr
    assert _error_doc(proc)["kind"] == "cache_damaged"
    assert _store(node) == []
    blobs[0].write_bytes(saved)
    _ok(run_cli(node, "activate", "svc", str(a), env=env), fleet["cache"])


def test_a_substitute_only_node_never_probes_for_an_interpreter_download(fleet):
    """`only-managed` with no managed Python in the node's root: a node may build nothing, so it
    neither probes the download host nor downloads; it says so and uses what it has. The download
    host is a listener on 127.0.0.1 (named by https_proxy, as uv's downloads would reach it) that
    counts the connections it is offered."""
    import socket
    import threading

    node, env, (a, _, _) = fleet["node"], fleet["env"], fleet["recipes"]
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    offered = []

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            offered.append(1)
            conn.close()

    threading.Thread(target=accept, daemon=True).start()
    try:
        proxy = f"http://127.0.0.1:{listener.getsockname()[1]}"
        node_env = {**env, "LLMGW_STORE_PYTHON_PREFERENCE": "only-managed", "LLMGW_STORE_OFFLINE": "",
                    "https_proxy": proxy, "HTTPS_PROXY": proxy, "ALL_PROXY": "", "all_proxy": ""}
        proc = run_cli(node, "activate", "svc", str(a), env=node_env)
        assert proc.returncode == 0, proc.stderr
        assert "no managed Python" in proc.stderr and "--substitute-only" in proc.stderr
        assert offered == [], proc.stderr
        # Without --substitute-only the same settings do probe it (the positive case of the listener).
        built = run_cli(fleet["node"].parent / "other", "build", str(a), env={**node_env,
                                                                                "LLMGW_STORE_SUBSTITUTE_ONLY": ""})
        assert offered, built.stderr
    finally:
        listener.close()


def test_an_explicit_config_file_that_sets_nothing_or_no_trusted_key_is_refused(fleet, tmp_path):
    """A node given an empty file (or one of comments only), or caches with no key to check them
    by: one line, exit 2, no store made — not a build from public PyPI into the default root. The
    default file may be empty; a file that sets something is read (the positive cases)."""
    node, (a, _, _) = fleet["node"], fleet["recipes"]
    clean = {k: "" for k in fleet["env"]}  # only the file speaks
    for text in ("", "# the node's settings\n\n[gc]\n"):
        conf = tmp_path / "node.toml"
        conf.write_text(text)
        conf.chmod(0o644)
        for how in (["--config", str(conf)], []):
            proc = run_cli(node, *how, "build", str(a), env={**clean, "LLMGW_STORE_CONFIG": "" if how else str(conf)})
            assert proc.returncode == 2, proc.stderr
            assert "sets nothing" in _one_error(proc) and str(conf) in _one_error(proc)
            assert not node.exists()
    # The default file (none named): empty is allowed, and a plain local command runs.
    xdg = tmp_path / "xdg"
    (xdg / "llmgw-store").mkdir(parents=True)
    (xdg / "llmgw-store" / "config.toml").write_text("")
    proc = run_cli(node, "list", env={**clean, "LLMGW_STORE_CONFIG": "", "XDG_CONFIG_HOME": str(xdg)})
    assert proc.returncode == 0, proc.stderr

    conf = tmp_path / "nokey.toml"
    conf.write_text(f'substitute_only = true\nsubstituters = ["{fleet["cache"]}"]\n'
                    f'index_url = "{fleet["env"]["LLMGW_STORE_INDEX_URL"]}"\n')
    conf.chmod(0o644)
    proc = run_cli(node, "--config", str(conf), "build", str(a), env=clean)
    assert proc.returncode == 2 and "but no trusted key" in _one_error(proc), proc.stderr
    assert _store(node) == []
    conf.write_text(conf.read_text() + f'trusted_keys = ["{fleet["env"]["LLMGW_STORE_TRUSTED_KEYS"]}"]\n')
    _ok(run_cli(node, "--config", str(conf), "build", str(a), env=clean), fleet["cache"])


def test_a_pulled_paths_last_use_is_its_pull_on_this_node(fleet):
    """`list` on a node: the path's last use is when this node pulled it, not when the builder built it."""
    import datetime

    node, env, (a, _, _) = fleet["node"], fleet["env"], fleet["recipes"]
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    run_cli(node, "activate", "svc", str(a), env=env, check=True)
    (row,) = json.loads(run_cli(node, "--json", "list", check=True).stdout)["paths"]
    assert row["name"] == fleet["names"]["a.toml"]
    assert row["created"] < started <= row["last_used"], row  # created: the builder's build, as signed


def test_verbose_json_of_build_and_activate_carries_the_key_inputs(fleet):
    """What a builder and a node compare when their keys differ: `-v --json` of build and activate
    has the key's inputs (as `info` records them); plain --json keeps its document."""
    node, env, (a, _, _) = fleet["node"], fleet["env"], fleet["recipes"]
    doc = json.loads(run_cli(node, "-v", "--json", "activate", "svc", str(a), env=env, check=True).stdout)
    info = json.loads(run_cli(node, "--json", "info", "svc", check=True).stdout)
    assert doc["inputs"] == info["inputs"] and doc["inputs"]["index_url"] == fleet["index"].url.rstrip("/")
    for args in (["-v", "--json"], ["--json"]):  # the second is answered from the build memo
        built = json.loads(run_cli(node, *args, "build", str(a), env=env, check=True).stdout)
        assert built["key"] == info["key"] and (built.get("inputs") == info["inputs"] if "-v" in args
                                                 else "inputs" not in built)
    assert "inputs" not in json.loads(run_cli(node, "--json", "activate", "svc", str(a), env=env, check=True).stdout)
