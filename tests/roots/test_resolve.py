"""Every command that takes a path argument resolves PROFILE, PROFILE@N, a store name, a key, a store
path or a link to one, through roots/resolve.reference (issue 16: `verify vllm@7` and `push vllm`,
the docs' own examples, failed). One store, two paths, a profile `tiny` whose generation 1 is the
first and generation 2 (current) the second."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import build_store, copy_store, run_cli


@pytest.fixture(scope="module")
def store(tmp_path_factory, wheels):
    t = build_store(tmp_path_factory.mktemp("resolve"), wheels, "2024-02-02", "2024-03-03")
    t["index"].stop()
    root = t["root"]
    for path in t["paths"]:
        run_cli(root, "activate", "tiny", path, check=True)
    return t


def forms(t) -> dict[str, str]:
    """Each way to name the first path (generation 1), and what it must resolve to."""
    root, name = t["root"], t["names"][0]
    return {
        "PROFILE@N": "tiny@1",
        "name": name,
        "key": name[:32],
        "path": str(root / "store" / name),
        "path/": str(root / "store" / name) + "/",
        "generation link": str(root / "profiles" / "tiny-1-link"),
    }


def doc(root, *args) -> dict:
    proc = run_cli(root, "--json", *args)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize("form", ["PROFILE@N", "name", "key", "path", "path/", "generation link"])
def test_info_verify_env_diff_take_every_form(store, form):
    root, first, second = store["root"], store["names"][0], store["names"][1]
    text = forms(store)[form]
    assert doc(root, "info", text)["name"] == first
    verified = doc(root, "verify", text)
    assert [p["name"] for p in verified["paths"]] == [first] and not verified["damaged"]
    assert doc(root, "env", text)["variables"]["VIRTUAL_ENV"] == str(root / "store" / first)
    d = doc(root, "diff", text, "tiny")  # the profile: its current generation, the second path
    assert (d["a"]["name"], d["b"]["name"]) == (first, second)


def test_a_profile_is_its_current_generation_and_env_follows_its_link(store):
    root = store["root"]
    assert doc(root, "info", "tiny")["name"] == store["names"][1]
    assert doc(root, "info", str(root / "profiles" / "tiny"))["name"] == store["names"][1]
    assert [p["name"] for p in doc(root, "verify", "tiny")["paths"]] == [store["names"][1]]
    # env PROFILE points at the profile's link, so a shell follows later switches
    assert doc(root, "env", "tiny")["variables"]["VIRTUAL_ENV"] == str(root / "profiles" / "tiny")


@pytest.mark.parametrize("form", ["PROFILE", "PROFILE@N", "key"])
def test_run_takes_a_profile_a_generation_or_a_key(store, form):
    root = store["root"]
    text = {"PROFILE": "tiny", "PROFILE@N": "tiny@1", "key": store["names"][0][:32]}[form]
    want = store["names"][1] if form == "PROFILE" else store["names"][0]
    proc = run_cli(root, "run", text, "--", "sh", "-c", 'echo "$VIRTUAL_ENV"; command -v tinyengine')
    assert proc.returncode == 0, proc.stderr
    venv, binary = proc.stdout.split()
    assert venv == str(root / "store" / want) and binary == f"{venv}/bin/tinyengine"


def test_pin_and_push_take_a_profile_and_a_generation(store, tmp_path):
    root = copy_store(store["root"], tmp_path / "root")
    assert Path(doc(root, "pin", "old", "tiny@1")["path"]).name == store["names"][0]
    assert os.readlink(root / "gcroots" / "old") == f"../store/{store['names'][0]}"
    run_cli(root, "keygen", "k", "--out", str(tmp_path / "keys"), check=True)
    pushed = doc(root, "push", "tiny", "tiny@1", "--to", f"file://{tmp_path / 'cache'}",
                 "--secret-key", str(tmp_path / "keys" / "k.secret"))
    assert set(pushed["pushed"]) == set(store["names"])


@pytest.mark.parametrize("text, message", [
    ("nothing", "nothing is neither a profile nor a registered store path"),
    ("tiny@9", "profile 'tiny' has no generation 9 (it has: 1, 2)"),
    ("ghost@1", "no profile 'ghost'"),
    ("tiny@x", "a generation is PROFILE@N with N a number"),
    ("tiny@99999999999", "a generation is PROFILE@N with N a number"),
    ("a" * 5000, "is not a store path, its name or key, PROFILE or PROFILE@N"),
    ("/etc/passwd", "/etc/passwd is not a registered store path"),
    ("../../../etc", "is not a registered store path"),
    ("00000000000000000000000000000000", "is not a registered store path"),
])
@pytest.mark.parametrize("command", ["info", "verify", "env", "diff", "run"])
def test_what_names_nothing_is_one_line_and_exit_2(store, command, text, message):
    args = {"diff": ["diff", text, "tiny"], "run": ["run", text, "--", "true"]}.get(command, [command, text])
    proc = run_cli(store["root"], *args)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("llmgw-store: error: ") and message in lines[0], proc.stderr
    assert len(lines[0]) < 400  # a 5000-character argument is cut short in the message
