"""Package indexes and release servers beyond conftest's one index: a main index with a second
(PyTorch-like) index, and a GitHub-like release server with tinyengine's assets."""

from __future__ import annotations

import pytest

from tests.support.index_server import PackageIndex
from tests.support.recipes import TOOL
from tests.support.release_server import ReleaseServer
from tests.support.wheels import build_wheel


@pytest.fixture(scope="module")
def two_indexes(tmp_path_factory):
    """The main index serves tinyengine (which needs tinytorch and tinytriton) and both of those;
    the second index serves tinytorch's CUDA build and a *higher* tinytriton, as an attacker who
    registered it there would."""
    d = tmp_path_factory.mktemp("two-indexes")
    main, extra = PackageIndex(), PackageIndex()
    day = "2024-01-01T00:00:00Z"
    engine = build_wheel(d / "main", "tinyengine", "1.0", requires=("tinytorch", "tinytriton"),
                         scripts={"tinyengine": "tinyengine:main"})
    main.add("tinyengine", engine, "2024-02-01T00:00:00Z")
    main.add("tinytorch", build_wheel(d / "main", "tinytorch", "1.0"), day)
    main.add("tinytriton", build_wheel(d / "main", "tinytriton", "1.0"), day)
    extra.add("tinytorch", build_wheel(d / "extra", "tinytorch", "1.0+cu126"), day)
    extra.add("tinytorch", build_wheel(d / "extra", "tinytorch", "2.0+cu126"), "2024-06-01T00:00:00Z")  # after as_of
    extra.add("tinytriton", build_wheel(d / "extra", "tinytriton", "9.0"), day)
    main.start(), extra.start()
    yield main, extra
    main.stop(), extra.stop()


@pytest.fixture
def releases(wheels):
    """tinyengine's GitHub-like releases: the 1.0 wheel and the `tinytool` asset under tag v1.0."""
    srv = ReleaseServer()
    srv.add("org/tinyengine", "v1.0", wheels["tinyengine-1.0"].name, wheels["tinyengine-1.0"].read_bytes())
    srv.add("org/tinyengine", "v1.0", "tinytool", TOOL)
    yield srv
    srv.stop()
