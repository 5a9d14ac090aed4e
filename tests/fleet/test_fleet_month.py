"""A fleet's month (issue 31), end to end on loopback, with nothing but the documented
configuration: a builder root and two substitute-only nodes, each configured only by its own config
file as docs/operations.md shows it (read from the page, its paths and URLs replaced: the test
breaks when the page drifts), docs/fleet.md's nginx as the binary cache (each node writes only its
own roots document), and a private index on 127.0.0.1 that the builder alone uses.

Week 1: the builder builds (the index answering 503 for a while), activates, pushes and publishes
its roots; both nodes activate. Week 2: an upgrade, during a key rotation with a lagging node, one
node's pull outliving a restart of nginx; the end of the rotation. Week 3: a candidate the builder
pushes and withdraws. Then node gc, push-roots, cache gc past the grace (the candidate goes, the
nodes' way back stays), and a cold rollback on each node pulled back from the cache. Each failure
cause met on the way is its exit code: 77 (untrusted), 69 (the cache stopped), 66 (never pushed)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import start_index
from tests.support.barrier import Barrier
from tests.support.nginx import AUTH, NODES, needs_nginx, start_nginx  # noqa: F401  (fixture)
from tests.support.recipes import write_recipe
from tests.support.retrylog import waits_until

pytestmark = needs_nginx
MONTH_NODES = {n: NODES[n] for n in ("node-1", "node-2")}  # the month's two nodes, of the password file's
OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
EXE = Path(sys.executable).with_name("llmgw-store")
WEEK1 = 'version = "1.0"\nas_of = "2024-02-02T00:00:00Z"'    # tinyengine 1.0, tinydep 1.0
WEEK2 = 'version = "1.1"\nas_of = "2024-08-01T00:00:00Z"'    # tinyengine 1.1, tinydep 2.0
LATER = 'version = "1.0"\nas_of = "2024-08-01T00:00:00Z"'    # tinydep 2.0: not pushed until week 3


def _documented(words: str) -> str:
    """The ```toml block following `words` in docs/operations.md, as the page shows it."""
    text = OPERATIONS.read_text()
    start = text.index("```toml\n", text.index(words)) + len("```toml\n")
    return text[start:text.index("```", start)]


def _config(path: Path, words: str, replace: dict[str, str]) -> Path:
    text = _documented(words)
    for old, new in replace.items():
        assert old in text, f"docs/operations.md's file ({words}) no longer says {old!r}: update this test"
        text = text.replace(old, new)
    path.write_text(text)
    path.chmod(0o644)
    return path


def _cmd(*args: str) -> list[str]:
    return [str(EXE), *args]


def _env(conf: Path, extra: dict | None = None) -> dict:
    # The file alone: the suite's python_preference (only-system) is unset, as on a real host.
    return {**os.environ, "LLMGW_STORE_CONFIG": str(conf), "LLMGW_STORE_PYTHON_PREFERENCE": "", **(extra or {})}


def _cli(conf: Path, *args: str, env: dict | None = None, code: int = 0) -> subprocess.CompletedProcess:
    proc = subprocess.run(_cmd(*args), env=_env(conf, env), capture_output=True, text=True, timeout=300)
    assert proc.returncode == code, f"{args}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def _json(conf: Path, *args: str, env: dict | None = None, code: int = 0) -> dict:
    return json.loads(_cli(conf, "--json", *args, env=env, code=code).stdout)


def _answer(root: Path) -> str:
    return subprocess.run([str(root / "profiles" / "tiny" / "bin" / "tinyengine")], capture_output=True, text=True,
                          check=True, timeout=60).stdout.strip()


def _substituted(stderr: str, name: str, url: str, signer: str) -> str:
    """The line saying `name` came from the cache, signed by `signer`; it says what was reused."""
    lines = [ln for ln in stderr.splitlines() if f"substituted {name} from cache {url} (signed by {signer})" in ln]
    assert len(lines) == 1, stderr
    return lines[0]


def _signers(ngx, name: str) -> list[str]:
    return [s["key"] for s in json.loads((ngx.files / f"{name[:32]}.json").read_text())["signatures"]]


def test_a_fleets_month(tmp_path, wheels, start_nginx):
    keys, ngx = tmp_path / "keys", start_nginx()
    index = start_index(wheels)
    try:
        _month(tmp_path, keys, ngx, index)
    finally:
        index.stop()


def _month(tmp_path: Path, keys: Path, ngx, index) -> None:
    builder = tmp_path / "builder"
    bconf = _config(tmp_path / "builder.toml", "The builder, which resolves, builds and pushes",
                    {'"/var/lib/llmgw-store"': f'"{builder}"', "https://pypi.internal/simple": index.url})
    week1, week2, later = (write_recipe(tmp_path, text, name=f"{n}.toml")
                           for n, text in (("week1", WEEK1), ("week2", WEEK2), ("later", LATER)))
    for who in ("builder-1", *MONTH_NODES):
        _cli(bconf, "keygen", who, "--out", str(keys))
    sign1, sign2 = ("--secret-key", str(keys / "builder-1.secret")), ("--secret-key", str(keys / "builder-2.secret"))

    def node_conf(node: str, trusts: str) -> Path:
        """docs/operations.md's node file, for `node`, trusting the builder key `trusts`."""
        return _config(tmp_path / f"{node}.toml", "A fleet node, which only fetches what the builder pushed", {
            '"/var/lib/llmgw-store"': f'"{tmp_path / node}"', "https://pypi.internal/simple": index.url,
            "https://cache.internal/llmgw": ngx.url, "/etc/llmgw-store/builder-1.public": str(keys / f"{trusts}.public"),
            "/etc/llmgw-store/node-7.secret": str(keys / f"{node}.secret"),
            "/var/lib/prometheus/node-exporter/llmgw_store.prom": str(tmp_path / f"{node}.prom")})

    def builder_ships(recipe: Path, sign: tuple[str, str]) -> str:
        """The documented builder policy: activate into a profile, push it, publish its roots. The
        index answers its first two requests with 503 (restarting), and once the build is done it
        answers nothing but 503: down for the nodes, which must not need it."""
        index.unavailable(2, r"^/")
        served = index.unavailable_served
        name = Path(_json(bconf, "activate", "tiny", str(recipe))["path"]).name
        assert index.unavailable_served == served + 2
        index.unavailable(None, r"^/")
        _cli(bconf, "push", "tiny", "--to", ngx.url, *sign, env=AUTH)
        _cli(bconf, "push-roots", "--to", ngx.url, *sign1, env=AUTH)  # the builder's roots: its first key's
        return name

    nodes = {n: node_conf(n, "builder-1") for n in MONTH_NODES}
    creds = {n: {"LLMGW_STORE_CACHE_AUTH": f"{n}:{pw}"} for n, pw in MONTH_NODES.items()}

    # --- week 1: the builder builds through a flaky private index; the nodes never ask it --------
    a = builder_ships(week1, sign1)
    asked = len(index.requests)
    for n, conf in nodes.items():
        got = _cli(conf, "activate", "tiny", str(week1))
        assert got.stdout.strip() == f"tiny: generation 1 -> {tmp_path / n / 'store' / a}", got.stdout
        assert _answer(tmp_path / n) == "tinyengine 1.0 tinydep 1.0"
    miss = _json(nodes["node-1"], "activate", "tiny", str(later), code=66)["error"]  # never pushed
    assert miss["kind"] == "cache_miss" and not (tmp_path / "node-1" / "store" / miss["name"]).exists()
    assert len(index.requests) == asked  # the nodes asked the index nothing

    # --- week 2: an upgrade, in the middle of a key rotation --------------------------------------
    b = builder_ships(week2, sign1)
    asked = len(index.requests)
    _cli(bconf, "keygen", "builder-2", "--out", str(keys))
    added = _json(bconf, "push", "tiny", "--to", ngx.url, *sign2, env=AUTH)
    assert added["repaired"] == [b] and added["blobs_uploaded"] == 0 and _signers(ngx, b) == ["builder-1", "builder-2"]
    nodes["node-1"] = node_conf("node-1", "builder-2")  # node-1 moved on; node-2 lags: builder-1 only
    # week 1's object is still signed by builder-1 alone: a new node trusting builder-2 gets nothing
    untrusted = _json(nodes["node-1"], "--root", str(tmp_path / "new-node"), "activate", "tiny", str(week1),
                      code=77)["error"]
    assert untrusted["kind"] == "cache_untrusted"
    delta = _substituted(_cli(nodes["node-1"], "activate", "tiny", str(week2)).stderr, b, ngx.url, "builder-2")
    assert re.search(r"reused [1-9]", delta), delta  # a delta pull: week 1's files taken from its store
    assert _answer(tmp_path / "node-1") == "tinyengine 1.1 tinydep 2.0"

    # node-2 (builder-1's signature) pulls week 2 while nginx restarts, with the defaults
    gate = Barrier(tmp_path)
    pull = subprocess.Popen(_cmd("activate", "tiny", str(week2)), env=_env(nodes["node-2"], gate.env("PULL_PAUSE")),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        gate.reached("PULL_PAUSE", pull)
        ngx.stop()
        down = _json(nodes["node-2"], "--root", str(tmp_path / "new-node"), "activate", "tiny", str(week2),
                     env={"LLMGW_STORE_CACHE_RETRY_FOR": "1"}, code=69)["error"]
        assert down["kind"] == "cache_unreachable"
        gate.go("PULL_PAUSE")
        seen = waits_until(pull, 1.0, ngx.url)
        ngx.restart()
        out, err = pull.communicate(timeout=300)
    finally:
        pull.kill()
    assert pull.returncode == 0, "".join(seen) + err
    _substituted(err, b, ngx.url, "builder-1")  # the lagging node: the old key's signature
    assert any("Connection refused" in ln for ln in seen), seen
    assert _answer(tmp_path / "node-2") == "tinyengine 1.1 tinydep 2.0"
    assert len(index.requests) == asked

    # --- the rotation ends: every node trusts builder-2; builder-1's signature dropped ------------
    nodes["node-2"] = node_conf("node-2", "builder-2")
    for name in (a, b):
        _cli(bconf, "push", name, "--to", ngx.url, *sign2, "--drop-signature", "builder-1", env=AUTH)
        assert _signers(ngx, name) == ["builder-2"]

    # --- week 3: a candidate pushed, then withdrawn (rolled back, forgotten) by the builder --------
    c = builder_ships(later, sign2)
    asked = len(index.requests)
    _cli(bconf, "rollback", "tiny")
    _cli(bconf, "generations", "tiny", "--forget", "3")

    # --- gc everywhere: the nodes let week 1 go (cold, records kept); the builder forgets it ------
    _cli(bconf, "generations", "tiny", "--forget", "1")
    _cli(bconf, "push-roots", "--to", ngx.url, *sign1, env=AUTH)
    for n, conf in nodes.items():
        _cli(conf, "generations", "tiny", "--delete", "1")
        gc = _json(conf, "gc", "--keep-dead-for", "0s")  # the file's hour has passed
        assert a in [d["name"] for d in gc["deleted"]] and not (tmp_path / n / "store" / a).exists()
        roots = _json(conf, "push-roots", env=creds[n])  # [node] roots_to and secret_key: the file's
        assert roots["node"] == n and roots["cold"] == [a[:32]]
    keep = [arg for k in ("builder-1", *MONTH_NODES) for arg in ("--keep-from", str(keys / f"{k}.public"))]
    swept = _json(bconf, "cache", "gc", ngx.url, *keep, "--grace", "0s", env=AUTH)
    assert swept["why_kept"][f"{a[:32]}.json"] == "held by the roots of node-1, node-2"
    assert "held by the roots of builder-1, node-1, node-2" == swept["why_kept"][f"{b[:32]}.json"]
    assert swept["deleted_objects"] == [f"{c[:32]}.json"] and swept["deleted_blobs"], swept  # held by no one

    # --- the way back, a month on: each node's week 1 comes back from the cache -------------------
    for n, conf in nodes.items():
        back = _json(conf, "rollback", "tiny", "--to", "1")
        assert (back["generation"], back["rebuilt"]) == (1, "substituted"), back
        assert (tmp_path / n / "store" / a).is_dir()
        assert _answer(tmp_path / n) == "tinyengine 1.0 tinydep 1.0"
    assert len(index.requests) == asked
