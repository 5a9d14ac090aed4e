"""The store's own requests to a package index (a release's date, the latest version, the uv wheel,
sources and release assets) run under the same retry policy as a binary cache's
(store/app/retry.py; docs/fleet.md, "Networks that fail"): a private index answering 503 for a
while does not fail a build, and one that keeps answering 503 fails it after the retries, naming
the index. The index is tests/support/index_server.py on 127.0.0.1."""

from __future__ import annotations

import json
import re

from tests.conftest import run_cli


def build(root, recipe, idx, uv_bin, env=None):
    return run_cli(root, "--json", "build", str(recipe), "--index-url", idx.url, "--uv", str(uv_bin), env=env)


def test_an_index_that_answers_503_a_few_times_does_not_fail_the_build(root, recipe, index, uv_bin):
    """The recipe pins a version and no date: the store asks the index for the release's date
    first, and its first three answers are 503."""
    index.unavailable(3)
    proc = build(root, recipe, index, uv_bin)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["how"] == "built"
    assert index.unavailable_served == 3
    # One line per wait; a wait that lasts past the reporter's 2 s repeats its line with the time
    # so far ("…: 2s…"), which is the same wait.
    tries = {re.sub(r": [0-9]+s…$", "", ln.split("] ", 1)[1]) for ln in proc.stderr.splitlines()
             if "HTTP 503; trying again" in ln}
    assert len(tries) == 3 and all(f"the index {index.url}" in ln for ln in tries), proc.stderr


def test_an_index_that_keeps_answering_503_fails_the_build_naming_it(root, recipe, index, uv_bin):
    index.unavailable(None)
    proc = build(root, recipe, index, uv_bin, env={"LLMGW_STORE_CACHE_RETRY_FOR": "2"})
    assert proc.returncode == 1, proc.stderr
    last = proc.stderr.splitlines()[-1]
    assert f"the index {index.url}" in last and "HTTP 503" in last and "gave up after" in last, proc.stderr
    assert index.unavailable_served >= 2
    assert not (root / "store").exists() or not any((root / "store").iterdir())


def test_the_config_files_cache_settings_are_the_index_clients_too(root, recipe, index, uv_bin, tmp_path):
    """`[cache] attempts = 1` in the config file: the index's first 503 is final."""
    conf = tmp_path / "config.toml"
    conf.write_text("[cache]\nattempts = 1\n")
    conf.chmod(0o644)
    index.unavailable(1)
    proc = build(root, recipe, index, uv_bin, env={"LLMGW_STORE_CONFIG": str(conf)})
    assert proc.returncode == 1 and "HTTP 503 (gave up after 1 attempts)" in proc.stderr.splitlines()[-1], proc.stderr
    assert build(root, recipe, index, uv_bin).returncode == 0
