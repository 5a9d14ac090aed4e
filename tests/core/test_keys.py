from __future__ import annotations

import hashlib
import shutil
import subprocess

import pytest

from llmgw_store.core.keys import KEY_RE, canonical_json, key_of_name, nix_base32, path_name, store_key

# Printed by `nix-hash --type sha1|sha256 --flat --base32` (Nix 2.8.0) for a file holding "hello".
NIX_VECTORS = {
    "sha1": "9m1skbnr5i43n3yypvda5s65vhfwdx5a",
    "sha256": "094qif9n4cq4fdg459qzbhg1c6wywawwaaivx0k0x8xhbyx4vwic",
}


def test_nix_base32_matches_nix():
    for algo, expected in NIX_VECTORS.items():
        assert nix_base32(hashlib.new(algo, b"hello").digest()) == expected


@pytest.mark.skipif(shutil.which("nix-hash") is None, reason="Debian's nix-bin is not installed")
def test_nix_base32_matches_live_nix(tmp_path):
    for size in (0, 1, 7, 100):
        f = tmp_path / f"f{size}"
        f.write_bytes(bytes(range(size % 256)) * (size // 256 + 1))
        want = subprocess.run(["nix-hash", "--type", "sha256", "--flat", "--base32", str(f)],
                              capture_output=True, text=True, check=True).stdout.strip()
        assert nix_base32(hashlib.sha256(f.read_bytes()).digest()) == want


def test_canonical_json_ignores_key_order_and_whitespace():
    assert canonical_json({"b": 1, "a": [1, {"d": 2, "c": 3}]}) == b'{"a":[1,{"c":3,"d":2}],"b":1}'


def test_key_is_160_bits_in_32_chars_and_follows_every_input():
    base = {"engine": "e", "version": "1", "as_of": "2024-01-01T00:00:00Z", "uv": "0.13.9"}
    k = store_key(base)
    assert KEY_RE.match(k) and len(k) == 32
    assert store_key(dict(reversed(list(base.items())))) == k
    for field, other in [("engine", "f"), ("version", "2"), ("as_of", "2024-01-02T00:00:00Z"), ("uv", "0.13.8")]:
        assert store_key({**base, field: other}) != k


def test_names_carry_their_key():
    k = store_key({"x": 1})
    name = path_name(k, "vllm", "0.6.3.post1", "cu128")
    assert name == f"{k}-vllm-0.6.3.post1-cu128"
    assert key_of_name(name) == k
    assert key_of_name("not-a-store-path") is None
    assert key_of_name(k) is None  # a bare key is not a path name
