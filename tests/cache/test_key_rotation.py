"""Key rotation with overlap (issue 31): a push with a new key adds its signature to those the
cache's object carries, so a node that still trusts only the old key keeps pulling; `push
--drop-signature OLD` ends the rotation. Every step with real pushes and pulls into fresh nodes."""

from __future__ import annotations

import base64
import json

import pytest

from tests.conftest import run_cli
from tests.support.delta import delta_wheels, template, world  # noqa: F401  (fixtures)


def _push(w, name, url, key, *extra, check=True):
    proc = run_cli(w["root"], "--json", "push", name, "--to", url, "--secret-key", str(w["keys"] / f"{key}.secret"),
                   *extra, check=check)
    return json.loads(proc.stdout) if check else proc


def _signers(url: str, name: str) -> list[str]:
    meta = json.loads(open(f"{url[len('file://'):]}/{name[:32]}.json").read())
    return [s["key"] for s in meta["signatures"]]


class Nodes:
    """Fresh nodes pulling `name`, each trusting the keys given (a new node per pull: nothing local)."""

    def __init__(self, w, url):
        self.w, self.url, self.count = w, url, 0

    def pull(self, name, *trusted):
        self.count += 1
        trust = [a for k in trusted for a in ("--trusted-key", str(self.w["keys"] / f"{k}.public"))]
        return run_cli(self.w["tmp"] / f"node-{self.count}", "--json", "pull", name, "--from", self.url, *trust)


@pytest.mark.parametrize("fmt", ["2", "1"])
def test_a_rotation_keeps_every_node_pulling_at_every_step(world, tmp_path, fmt):
    w, name = world, world["names"][0]
    run_cli(w["root"], "keygen", "builder-2", "--out", str(w["keys"]), check=True)
    url = f"file://{tmp_path / 'cache'}"
    nodes = Nodes(w, url)
    # step 0: pushed with the old key; every node trusts it
    _push(w, name, url, "builder-1", "--format", fmt)
    assert nodes.pull(name, "builder-1").returncode == 0
    # step 1: the builder re-pushes with the new key: both signatures, no blob uploaded again
    again = _push(w, name, url, "builder-2", "--format", fmt)
    assert again["repaired"] == [name] and _signers(url, name) == ["builder-1", "builder-2"]
    if fmt == "2":
        assert again["blobs_uploaded"] == 0
    lagging = nodes.pull(name, "builder-1")  # a node whose trusted keys lag still pulls
    assert lagging.returncode == 0, lagging.stderr
    assert nodes.pull(name, "builder-2").returncode == 0  # an updated node too
    # pushing again with the new key renews, and changes nothing of the signatures
    assert _push(w, name, url, "builder-2", "--format", fmt)["already_there"] == [name]
    assert _signers(url, name) == ["builder-1", "builder-2"]
    # step 3: every node trusts builder-2; the rotation ends
    done = _push(w, name, url, "builder-2", "--drop-signature", "builder-1", "--format", fmt)
    assert done["repaired"] == [name] and _signers(url, name) == ["builder-2"]
    assert nodes.pull(name, "builder-2").returncode == 0
    late = nodes.pull(name, "builder-1")
    assert late.returncode != 0 and "not signed by a trusted key (signed by: builder-2)" in late.stderr, late.stderr


def test_the_signature_list_is_bounded_and_says_so(world, tmp_path):
    w, name = world, world["names"][0]
    run_cli(w["root"], "keygen", "builder-2", "--out", str(w["keys"]), check=True)
    url = f"file://{tmp_path / 'cache'}"
    _push(w, name, url, "builder-1")
    path = tmp_path / "cache" / f"{name[:32]}.json"
    meta = json.loads(path.read_text())
    fake = base64.b64encode(bytes(64)).decode()
    meta["signatures"] += [{"key": f"retired-{i}", "sig": fake} for i in range(15)]  # 16: the most a node reads
    path.write_text(json.dumps(meta))
    before = path.read_bytes()
    proc = _push(w, name, url, "builder-2", check=False)
    assert proc.returncode == 2 and "already signed by 16 keys" in proc.stderr and "--drop-signature" in proc.stderr
    assert path.read_bytes() == before
    # the way out: drop one, and the new key's signature fits
    _push(w, name, url, "builder-2", "--drop-signature", "retired-0")
    assert _signers(url, name) == ["builder-1", *(f"retired-{i}" for i in range(1, 15)), "builder-2"]


def test_dropping_the_signing_keys_own_signature_is_refused(world, tmp_path):
    w, name = world, world["names"][0]
    url = f"file://{tmp_path / 'cache'}"
    proc = _push(w, name, url, "builder-1", "--drop-signature", "builder-1", check=False)
    assert proc.returncode == 2 and "the key this push signs with" in proc.stderr
    assert not (tmp_path / "cache" / f"{name[:32]}.json").exists()
