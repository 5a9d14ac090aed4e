"""The test engine's recipes (tinyengine from the tests' package indexes; bench/common.py's index
serves the benches' quick modes the same packages), source archives and the full recipe with a
source, assets and a release wheel: one copy of each, for every test module and bench. Importable
without pytest (standard library only): the benches run from a regular install, which has none."""

from __future__ import annotations

import io
import json
import sys
import tarfile
from pathlib import Path

PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"

# conftest's template (str.format with `python` and `extra`: lines added to the build); kept
# byte for byte, since a recipe's bytes enter its store path's key.
TINY_RECIPE = """
[engine]
name = "tinyengine"
pypi = "tinyengine"
binary = "tinyengine"

[[build]]
variant = "cpu"
python = "{python}"
requirements = ["tinyengine=={{version}}"]
verify = ["tinyengine"]
{extra}
"""


def tiny_recipe(extra: str = "", *, variant: str = "cpu", requirements=("tinyengine=={version}",),
                verify=("tinyengine",), extra_index: str | None = None, index_packages=None,
                python: str = PYTHON) -> str:
    """tinyengine's recipe: one build, `extra` lines added to it (`version = "1.0"`, `health = ...`).
    With the defaults it is TINY_RECIPE's text."""
    lines = [f'variant = "{variant}"', f'python = "{python}"', f"requirements = {json.dumps(list(requirements))}",
             f"verify = {json.dumps(list(verify))}"]
    if extra_index is not None:
        lines += [f'extra_index = "{extra_index}"', f"index_packages = {json.dumps(list(index_packages or ()))}"]
    return ('\n[engine]\nname = "tinyengine"\npypi = "tinyengine"\nbinary = "tinyengine"\n\n[[build]]\n'
            + "\n".join(lines) + f"\n{extra}\n")


def write_recipe(dir: Path, extra: str = "", name: str = "tiny.toml", **fields) -> Path:
    """`dir/name` holding tiny_recipe(extra, **fields)."""
    p = dir / name
    p.write_text(tiny_recipe(extra, **fields))
    return p


# --- a source archive, release assets, a release wheel ---------------------------------------------

FULL = """
[engine]
name = "tinyengine"
binary = "tinyengine"
repo = "org/tinyengine"

[[build]]
variant = "full"
python = "{python}"
version = "1.0"
requirements = []
verify = ["tinyengine"]
assets = ["tinytool"]
asset_tag = "v{{version}}"

[build.source]
url = "{base}/download/src/tinysrc.tar.gz"
sha256 = "{sha}"
requirements = "requirements.txt"
dir = "src"

[build.wheel]
tag = "v{{version}}"
prefix = "tinyengine-"
project = "tinyengine"
"""

TOOL = b"#!/bin/sh\necho tinytool 1.0\n"  # the release asset `tinytool`


def make_tar(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for info, data in members:
            tf.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def file_member(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


GOOD_SOURCE = [file_member("tinysrc-1.0/requirements.txt", b"# what serve.py needs\ntinydep<2\n"),
               file_member("tinysrc-1.0/serve.py", b"print('serving')\n")]
