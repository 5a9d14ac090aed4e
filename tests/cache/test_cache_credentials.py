"""Cache URLs in messages: never their credentials, a malformed one is a usage error (exit 2), and
--offline says why it passed the given caches over."""

from __future__ import annotations

from tests.conftest import run_cli
from tests.support.delta import delta_wheels, template, world  # noqa: F401  (fixtures)


def test_a_bad_cache_url_is_shown_without_its_password(world):
    w = world
    key = str(w["keys"] / "builder-1.public")
    proc = run_cli(w["node"], "pull", "x" * 32, "--from", "htp://u:CACHEPASS@h/x", "--trusted-key", key)
    assert proc.returncode == 2 and "CACHEPASS" not in proc.stderr
    assert "'htp://h/x': a cache URL is" in proc.stderr  # positive: the URL, without its userinfo
    proc = run_cli(w["node"], "pull", "x" * 32, "--from", "http://u:pw@[::1", "--trusted-key", key)
    assert proc.returncode == 2 and "internal error" not in proc.stderr and "pw@" not in proc.stderr
    assert proc.stderr.strip().splitlines() == ["llmgw-store: error: 'http://[::1': not a cache URL (Invalid IPv6 URL)"]


def test_a_bad_substituter_from_the_environment_is_passed_over_without_its_password(world, template):
    w = world
    proc = run_cli(w["node"], "build", str(template["recipe"]), "--as-of", "2024-02-02", "--index-url",
                   template["index"].url, "--substitute-only", "--trusted-key", str(w["keys"] / "builder-1.public"),
                   env={"LLMGW_STORE_SUBSTITUTERS": "htp://u:CACHEPASS@h/x"})
    # A URL no backend reads is bad input (exit 2), the node's own, not a cache's miss.
    assert proc.returncode == 2 and "CACHEPASS" not in proc.stderr
    assert "cache htp://h/x: 'htp://h/x': a cache URL is" in proc.stderr and "passing it over" in proc.stderr


def test_offline_says_it_passed_the_given_caches_over(world, template):
    w = world
    proc = run_cli(w["node"], "build", str(template["recipe"]), "--as-of", "2024-02-02", "--offline",
                   "--substitute-only", "--substituter", "http://u:CACHEPASS@127.0.0.1:9/llmgw",
                   "--trusted-key", str(w["keys"] / "builder-1.public"))
    assert proc.returncode == 2 and "CACHEPASS" not in proc.stderr
    assert "were passed over because of --offline" in proc.stderr and "pass --substituter URL" not in proc.stderr
    # positive: with no cache given at all, the usual advice
    proc = run_cli(w["node"], "build", str(template["recipe"]), "--as-of", "2024-02-02", "--offline",
                   "--substitute-only", "--trusted-key", str(w["keys"] / "builder-1.public"))
    assert proc.returncode == 2 and "pass --substituter URL" in proc.stderr
