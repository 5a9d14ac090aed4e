"""Two neighbouring environments built from wheels with a blob-sized file (format-2 cache objects:
blobs, packs, delta pulls), a builder store with keys, and pushing and pulling them in format 2:
fixtures for tests/cache/test_fleet_delta.py and tests/cache/test_cache_gc.py; and a minor upgrade of a package
of many small files (`upgrade_world`: what content-defined packs are for)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import build_store, copy_store, run_cli


@pytest.fixture(scope="module")
def delta_wheels(tmp_path_factory):
    """The test wheels, with a 1 MiB file in tinyengine (a blob of its own) and a few small ones in
    tinydep (a pack)."""
    import random

    from tests.support.wheels import build_wheel

    d = tmp_path_factory.mktemp("delta-wheels")
    script = {"tinyengine": "tinyengine:main"}
    weights = {"tinyengine/weights.bin": random.Random(1).randbytes(1 << 20)}

    def small(v):
        return {f"tinydep/data{i}.txt": f"tinydep {v} data {i}\n".encode() * 50 for i in range(5)}
    return {
        "tinydep-1.0": build_wheel(d, "tinydep", "1.0", extra_files=small("1.0")),
        "tinydep-2.0": build_wheel(d, "tinydep", "2.0", extra_files=small("2.0")),
        "tinyengine-1.0": build_wheel(d, "tinyengine", "1.0", requires=("tinydep",), scripts=script,
                                      extra_files=weights),
        "tinyengine-1.1": build_wheel(d, "tinyengine", "1.1", requires=("tinydep",), scripts=script,
                                      extra_files=weights),
    }


@pytest.fixture(scope="module")
def template(tmp_path_factory, delta_wheels):
    """tinyengine 1.0 resolved as of two dates: with tinydep 1.0, then with tinydep 2.0 (one
    package differs: neighbouring environments)."""
    t = build_store(tmp_path_factory.mktemp("delta"), delta_wheels, "2024-02-02", "2024-06-02")
    yield t
    t["index"].stop()


def _module_text(rng, size: int) -> bytes:
    """`size` bytes that compress as source code does (words from a small vocabulary)."""
    words = ["def", "return", "self", "import", "class", "config", "hidden_states", "attention", "layer",
             "None", "torch", "tensor", "if", "else", "for", "in", "range", "weight", "bias", "=", "(", ")",
             "model", "output", "batch", "dim", "mask", "logits", "cache", "past_key_values"]
    out = bytearray()
    while len(out) < size:
        out += (" ".join(rng.choice(words) for _ in range(12)) + "\n").encode()
    return bytes(out[:size])


@pytest.fixture(scope="module")
def upgrade_template(tmp_path_factory):
    """tinyengine 1.0 resolved as of two dates, with tinydep 1.0, then 2.0: a minor upgrade of a
    library of 12 model directories of 10 modules (4-12 KiB each, 1 MiB in all), of which 2.0
    changes one directory's modules (and its version): most of the package is the same bytes."""
    import random

    from tests.support.wheels import build_wheel

    d = tmp_path_factory.mktemp("upgrade-wheels")
    rng = random.Random(31)
    library = {f"tinydep/models/m{m:02}/part{i}.py": _module_text(rng, rng.randrange(4 << 10, 12 << 10))
               for m in range(12) for i in range(10)}
    newer = dict(library)
    for i in range(10):
        newer[f"tinydep/models/m05/part{i}.py"] = _module_text(rng, rng.randrange(4 << 10, 12 << 10))
    wheels = {
        "tinydep-1.0": build_wheel(d, "tinydep", "1.0", extra_files=library),
        "tinydep-2.0": build_wheel(d, "tinydep", "2.0", extra_files=newer),
        "tinyengine-1.0": build_wheel(d, "tinyengine", "1.0", requires=("tinydep",),
                                      scripts={"tinyengine": "tinyengine:main"}),
    }
    t = build_store(tmp_path_factory.mktemp("upgrade"), wheels, "2024-02-02", "2024-06-02")
    yield t
    t["index"].stop()


def _world(template, tmp_path):
    root = copy_store(template["root"], tmp_path / "builder")
    keys = tmp_path / "keys"
    run_cli(root, "keygen", "builder-1", "--out", str(keys), check=True)
    run_cli(root, "keygen", "intruder", "--out", str(keys), check=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    return {"root": root, "keys": keys, "names": template["names"], "node": tmp_path / "node", "tmp": tmp_path,
            "outside": outside}


@pytest.fixture
def world(template, tmp_path):
    return _world(template, tmp_path)


@pytest.fixture
def upgrade_world(upgrade_template, tmp_path):
    """`world` for the two environments of `upgrade_template`."""
    return _world(upgrade_template, tmp_path)


def push2(w, name, cache):
    return json.loads(run_cli(w["root"], "--json", "push", name, "--to", cache, "--secret-key",
                              str(w["keys"] / "builder-1.secret"), check=True).stdout)


def pull2(w, target, cache, check=True):
    proc = run_cli(w["node"], "--json", "pull", target, "--from", cache, "--trusted-key",
                   str(w["keys"] / "builder-1.public"), check=check)
    return json.loads(proc.stdout) if check else proc
