"""`--json` on every command prints exactly one JSON document on stdout, and progress only on stderr
(issue 16). Every command of the click app is run; a command added without a case here fails
`test_every_command_has_a_case`, so a new one cannot skip the contract."""

from __future__ import annotations

import json
import re

import pytest

from llmgw_store.cli.main import cli
from tests.conftest import build_store, copy_store, run_cli

# `run` replaces itself with the command it runs: its stdout is that command's.
NO_DOCUMENT = {"run"}
MACHINE_KEY = re.compile(r"[a-z][a-z0-9_]{0,40}")


@pytest.fixture(scope="module")
def template(tmp_path_factory, wheels):
    t = build_store(tmp_path_factory.mktemp("json"), wheels, "2024-02-02", "2024-03-03")
    yield t
    t["index"].stop()


def cases(t, tmp) -> list[list[str]]:
    """Every command, in an order that works on one store (each leaves what the next needs)."""
    a, b = t["paths"]
    keys, cache = tmp / "keys", f"file://{tmp / 'cache'}"
    return [
        ["build", str(t["recipe"]), "--as-of", "2024-02-02", "--index-url", t["index"].url, "--uv", str(t["uv"])],
        ["list"],
        ["info", a],
        ["activate", "p", a],
        ["activate", "p", b],
        ["generations", "p"],
        ["generations", "p", "--delete", "1", "--dry-run"],
        ["list-profiles"],
        ["rollback", "p"],
        ["pin", "keep", "p@2"],
        ["unpin", "keep"],
        ["hold", "p"],
        ["unhold", "p"],
        ["diff", "p@1", "p@2"],
        ["packages", "p@1"],
        ["why", "p", "tinydep"],
        ["export", "p"],
        ["export", "p", "--format", "pylock"],
        ["env", "p"],
        ["verify", "p"],
        ["doctor"],
        ["optimise", "--dry-run"],
        ["optimise"],
        ["stats"],
        ["keygen", "k", "--out", str(keys)],
        ["key", "public", str(keys / "k.secret")],
        ["push", "p", "--to", cache, "--secret-key", str(keys / "k.secret")],
        ["pull", t["names"][0], "--from", cache, "--trusted-key", str(keys / "k.public")],
        ["push-roots", "--to", cache, "--secret-key", str(keys / "k.secret"), "--node", "k"],
        ["cache", "gc", cache, "--keep-from", str(keys / "k.public"), "--dry-run"],
        ["release", "set", "prod", "p", "--to", cache, "--secret-key", str(keys / "k.secret")],
        ["release", "promote", "prod", "canary", "--to", cache, "--secret-key", str(keys / "k.secret")],
        ["release", "show", "prod", "--from", cache, "--trusted-key", str(keys / "k.public")],
        ["activate", "q", "--release", "prod", "--substituter", cache, "--trusted-key", str(keys / "k.public")],
        ["fleet", "--from", cache, "--keep-from", str(keys / "k.public"), "--trusted-key", str(keys / "k.public")],
        ["systemd-units", "--out", str(tmp / "units")],
        ["gc", "--print-roots"],
        ["gc", "--dry-run"],
        ["gc"],
        ["config"],
    ]


def test_every_command_prints_one_json_document(template, tmp_path, uv_bin):
    t = {**template, "uv": uv_bin}
    root = copy_store(template["root"], tmp_path / "root")
    shapes: dict[str, dict] = {}
    for args in cases(t, tmp_path):
        proc = run_cli(root, "--json", "--progress=plain", *args)
        assert proc.returncode == 0, (args, proc.stderr)
        doc = json.loads(proc.stdout)  # the whole of stdout is one document: a second one would not parse
        # an object, its schema version, machine keys (docs/json.md)
        assert isinstance(doc, dict) and doc["schema_version"] == 1, args
        assert all(MACHINE_KEY.fullmatch(k) for k in doc), (args, sorted(doc))
        shapes[args[0]] = doc
    # one name per concept: no command says `uv` where another says `uv_version`
    assert "uv" not in shapes["build"] and shapes["build"]["uv_version"] == shapes["info"]["uv_version"]
    assert isinstance(shapes["list"]["paths"], list) and isinstance(shapes["list-profiles"]["profiles"], list)
    for root in shapes["gc"]["kept"]:
        assert root["kind"] in ("generation", "pin", "hold", "temp", "process", "uv") and all(MACHINE_KEY.fullmatch(k) for k in root)
        # progress went to stderr, as plain lines
        assert all(line.startswith("[") for line in proc.stderr.splitlines()), (args, proc.stderr)


def test_progress_json_and_json_output_do_not_mix(template, tmp_path, uv_bin):
    root = copy_store(template["root"], tmp_path / "root")
    proc = run_cli(root, "--json", "--progress=json", "verify")
    assert proc.returncode == 0, proc.stderr
    assert set(json.loads(proc.stdout)) >= {"paths", "damaged"}
    assert all("t" in json.loads(line) for line in proc.stderr.splitlines())


def test_a_failing_command_prints_an_error_document_and_one_error_line(template, tmp_path):
    root = copy_store(template["root"], tmp_path / "root")
    proc = run_cli(root, "--json", "--progress=none", "info", "nothing")
    assert proc.returncode == 2
    assert proc.stderr.startswith("llmgw-store: error: ") and proc.stderr.count("\n") == 1
    doc = json.loads(proc.stdout)
    assert doc == {"schema_version": 1, "exit_code": 2,
                   "error": {"kind": "not_found", "message": proc.stderr.strip().removeprefix("llmgw-store: error: ")}}


def test_every_command_has_a_case(template, tmp_path):
    covered = {args[0] for args in cases({**template, "uv": "uv"}, tmp_path)}
    assert set(cli.commands) - NO_DOCUMENT - covered == set()
