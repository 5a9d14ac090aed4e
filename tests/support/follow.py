"""Nodes that follow releases by their config file alone, and the follow units run as systemd runs
them: helpers of tests/fleet/test_release_follow.py and tests/fleet/test_release_fleet.py."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.conftest import run_cli

DEAD_INDEX = "http://127.0.0.1:9/simple"


def exec_argvs(service: Path) -> list[list[str]]:
    """Every ExecStart, in order, as systemd splits it (every value double-quoted, none holds a quote)."""
    return [json.loads("[" + ", ".join(ln.removeprefix("ExecStart=").split(" ")) + "]")
            for ln in service.read_text().splitlines() if ln.startswith("ExecStart=")]


def node_config(path: Path, keys: Path, cache: str, releases: str = 'svc = "prod"', node: str | None = "node-1") -> Path:
    """A node's only configuration: the cache, the builder's key, no index, what it follows, and
    (with `node`) where it publishes its roots with which key."""
    text = (f'substituters = ["{cache}"]\ntrusted_keys = ["{keys / "builder-1.public"}"]\n'
            f'substitute_only = true\nindex_url = "{DEAD_INDEX}"\nreleases = {{ {releases} }}\n')
    if node:
        text += f'\n[node]\nroots_to = "{cache}"\nsecret_key = "{keys / f"{node}.secret"}"\n'
    path.write_text(text)
    path.chmod(0o644)
    return path


def clean_env(extra: dict | None = None) -> dict:
    """The environment of a unit: none of the test's LLMGW_STORE_ settings but the interpreter rule."""
    return {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_STORE_")} | {
        "LLMGW_STORE_PYTHON_PREFERENCE": "only-system", **(extra or {})}


def run_unit(service: Path, env: dict | None = None) -> list[subprocess.CompletedProcess]:
    """Run the service's ExecStart lines as systemd runs a oneshot: in order, each must succeed."""
    done = []
    for argv in exec_argvs(service):
        proc = subprocess.run(argv, capture_output=True, text=True, check=False, env=clean_env(env), timeout=300)
        done.append(proc)
        assert proc.returncode == 0, (argv, proc.stderr)
    return done


def follow_units(root: Path, conf: Path, out: Path) -> Path:
    """`systemd-units --follow` for the node `root` with its config file: the follow service."""
    run_cli(root, "--config", str(conf), "systemd-units", "--out", str(out), "--follow", env=clean_env(), check=True)
    return out / "llmgw-store-follow.service"


def fleet_states(builder: Path, keys: Path, cache: str, nodes: list[str], prom: Path | None = None,
                 env: dict | None = None) -> dict[tuple[str, str], str]:
    """(node, profile) -> in_sync | out_of_date | unknown, as `fleet` shows it; its text and (when
    asked) its Prometheus textfile are checked to agree."""
    args = ["fleet", "--from", cache, *(a for n in nodes for a in ("--keep-from", str(keys / f"{n}.public"))),
            "--trusted-key", str(keys / "builder-1.public"), *(["--prometheus", str(prom)] if prom else [])]
    doc = json.loads(run_cli(builder, "--json", *args, env=clean_env(env), check=True).stdout)
    assert not [n for n in doc["nodes"] if n["refused"]], doc
    states = {(n["node"], p): s for n in doc["nodes"] for p, s in n["state"].items()}
    follows = {(n["node"], p): r for n in doc["nodes"] for p, r in n["releases"].items()}
    if prom is not None:
        samples = {ln for ln in prom.read_text().splitlines() if ln.startswith("llmgw_store_fleet_node_out_of_date{")}
        assert samples == {f'llmgw_store_fleet_node_out_of_date{{node="{n}",profile="{p}",release="{follows[n, p]}"}} '
                           f'{0 if s in ("in_sync", "held") else 1}' for (n, p), s in states.items()}, samples
    text = run_cli(builder, *args, env=clean_env(env), check=True).stdout.splitlines()
    for (n, p), s in states.items():
        block = text[text.index(next(ln for ln in text if ln.startswith(f"node {n}:"))):]
        line = next(ln for ln in block if ln.startswith(f"  {p} -> "))
        assert f"follows {follows[n, p]}: {s}" in line, text
    return states
