"""Signing key files that cannot be confused (issue 22): NAME.secret is `name:base64(64 bytes)`
(seed + public key, as Nix and libsodium), NAME.public `name:base64(32 bytes)`. Every mistake with
a key file is exit 2 with one line naming the file — for `push` and `push-roots` even when every
object is in the cache already (nothing would be signed, and the mistake would go unseen until the
first new path) — and `keygen` writes both files exclusively, never through a planted link."""

from __future__ import annotations

import base64
import json
import os
import stat
from pathlib import Path

import pytest

from tests.conftest import build_store, copy_store, run_cli, run_in_env


@pytest.fixture(scope="module")
def template(tmp_path_factory, wheels):
    t = build_store(tmp_path_factory.mktemp("keys"), wheels, "2024-02-02")
    yield t
    t["index"].stop()


@pytest.fixture
def pushed(template, tmp_path):
    """A builder root whose path is already in a file:// cache, and its key pair."""
    root = copy_store(template["root"], tmp_path / "builder")
    keys = tmp_path / "keys"
    run_cli(root, "keygen", "builder-1", "--out", str(keys), check=True)
    name = template["names"][0]
    cache = f"file://{tmp_path / 'cache'}"
    first = json.loads(run_cli(root, "--json", "push", name, "--to", cache, "--secret-key",
                               str(keys / "builder-1.secret"), check=True).stdout)
    assert first["pushed"] == [name]
    return {"root": root, "keys": keys, "name": name, "cache": cache, "tmp": tmp_path}


def _decoded(path: Path) -> tuple[str, bytes]:
    name, _, b64 = path.read_text().strip().partition(":")
    return name, base64.b64decode(b64, validate=True)


def one_error(proc, code: int, *needles: str) -> None:
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("llmgw-store: error:")]
    assert proc.returncode == code and len(errors) == 1, proc.stderr
    for needle in needles:
        assert needle in errors[0], errors[0]


def test_keygen_writes_two_formats_that_differ(tmp_path):
    keys = tmp_path / "keys"
    out = json.loads(run_cli(tmp_path / "r", "--json", "keygen", "builder-1", "--out", str(keys), check=True).stdout)
    secret, public = keys / "builder-1.secret", keys / "builder-1.public"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600 and stat.S_IMODE(public.stat().st_mode) == 0o644
    (sname, sraw), (pname, praw) = _decoded(secret), _decoded(public)
    assert sname == pname == "builder-1" and len(sraw) == 64 and len(praw) == 32
    assert sraw[32:] == praw  # the secret's second half is its public key, as Nix writes it
    assert out["public_key"] == public.read_text().strip()
    shown = run_cli(tmp_path / "r", "key", "public", str(secret), check=True)
    assert shown.stdout.strip() == public.read_text().strip()
    doc = json.loads(run_cli(tmp_path / "r", "--json", "key", "public", str(secret), check=True).stdout)
    assert doc == {"schema_version": 1, "public_key": public.read_text().strip()}


def test_keygen_never_overwrites_nor_follows_a_planted_link(tmp_path):
    keys = tmp_path / "keys"
    keys.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (keys / "n.public").symlink_to(victim)  # planted where keygen writes the public key
    one_error(run_cli(tmp_path / "r", "keygen", "n", "--out", str(keys)), 2, "n.public exists")
    assert victim.read_text() == "precious\n" and not (keys / "n.secret").exists()  # nothing half-made
    (keys / "n.public").unlink()
    run_cli(tmp_path / "r", "keygen", "n", "--out", str(keys), check=True)
    one_error(run_cli(tmp_path / "r", "keygen", "n", "--out", str(keys)), 2, "n.secret exists")
    assert len(_decoded(keys / "n.secret")[1]) == 64  # the first pair is untouched


def _mistakes(pushed) -> dict[str, tuple[Path, str]]:
    """Every way to get --secret-key wrong, and what the one error line must say."""
    tmp, keys = pushed["tmp"], pushed["keys"]
    bad = tmp / "bad"
    bad.mkdir()
    name, raw = _decoded(keys / "builder-1.secret")
    (bad / "short.secret").write_text(f"builder-1:{base64.b64encode(os.urandom(48)).decode()}\n")
    spliced = raw[:32] + bytes(32)  # a seed with another key's public half
    (bad / "spliced.secret").write_text(f"builder-1:{base64.b64encode(spliced).decode()}\n")
    (bad / "garbage.secret").write_text("not a key at all\n")
    (bad / "copy-of-public.key").write_text((keys / "builder-1.public").read_text())
    return {
        "public": (keys / "builder-1.public", "is a public key"),
        "public-renamed": (bad / "copy-of-public.key", "is a public key"),
        "missing": (bad / "nope.secret", "no such file"),
        "directory": (bad, "is not a regular file"),
        "wrong-shape": (bad / "short.secret", "holds 48 bytes"),
        "spliced": (bad / "spliced.secret", "is damaged"),
        "garbage": (bad / "garbage.secret", "is not a key file"),
    }


def test_every_secret_key_mistake_is_exit_2_even_when_the_objects_exist(pushed):
    root, name, cache = pushed["root"], pushed["name"], pushed["cache"]
    before = sorted(p.name for p in Path(cache[len("file://"):]).rglob("*"))
    for what, (path, says) in _mistakes(pushed).items():
        proc = run_cli(root, "push", name, "--to", cache, "--secret-key", str(path))
        one_error(proc, 2, says, str(path) if what != "directory" else "bad")
        proc = run_cli(root, "push-roots", "--to", cache, "--secret-key", str(path))
        one_error(proc, 2, says)
    assert sorted(p.name for p in Path(cache[len("file://"):]).rglob("*")) == before  # nothing written
    # The right key still works, and says the object is there.
    again = json.loads(run_cli(root, "--json", "push", name, "--to", cache, "--secret-key",
                               str(pushed["keys"] / "builder-1.secret"), check=True).stdout)
    assert again["already_there"] == [name]


def test_a_secret_key_is_never_trusted_as_a_public_key(pushed):
    node = pushed["tmp"] / "node"
    secret = pushed["keys"] / "builder-1.secret"
    for trusted in (str(secret), secret.read_text().strip()):
        proc = run_cli(node, "pull", pushed["name"], "--from", pushed["cache"], "--trusted-key", trusted)
        one_error(proc, 2, "is a secret key")
    assert not (node / "store" / pushed["name"]).exists()
    one_error(run_cli(node, "key", "public", str(pushed["keys"] / "builder-1.public")), 2, "is a public key")


def test_a_secret_key_of_the_old_32_byte_format_still_signs(pushed, template, tmp_path):
    """keygen of 0.1.0 wrote the bare seed to NAME.secret: still read from a file so named, and
    its public key (`key public`) verifies what it signs."""
    from nacl.signing import SigningKey

    old = tmp_path / "old"
    old.mkdir()
    seed = os.urandom(32)
    (old / "legacy.secret").write_text(f"legacy:{base64.b64encode(seed).decode()}\n")
    expected = f"legacy:{base64.b64encode(bytes(SigningKey(seed).verify_key)).decode()}"
    public = run_cli(tmp_path / "r", "key", "public", str(old / "legacy.secret"), check=True).stdout.strip()
    assert public == expected
    root, name = pushed["root"], pushed["name"]
    cache = f"file://{tmp_path / 'cache2'}"
    run_cli(root, "push", name, "--to", cache, "--secret-key", str(old / "legacy.secret"), check=True)
    node = tmp_path / "node"
    run_cli(node, "pull", name, "--from", cache, "--trusted-key", public, check=True)
    assert run_in_env(node / "store" / name, "tinyengine") == "tinyengine 1.0 tinydep 1.0"
    # The same 32 bytes in a file not named .secret are a public key: refused for signing.
    (old / "legacy.key").write_text((old / "legacy.secret").read_text())
    one_error(run_cli(root, "push", name, "--to", cache, "--secret-key", str(old / "legacy.key")), 2,
              "is a public key")
