"""An empty value of a size or duration option is a usage error (exit 2, one line), never "no
limit": `gc --keep-dead-for ''` deleted a path unrooted a moment ago, `--max-freed ''` and
`--min-free ''` let gc delete without the bound the operator meant to give."""

from __future__ import annotations

import pytest

from llmgw_store.app.units import parse_duration, parse_size
from llmgw_store.base.errors import UsageError
from tests.conftest import run_cli

CASES = [
    ("gc", "--max-freed"), ("gc", "--min-free"), ("gc", "--max-cache"), ("gc", "--keep-dead-for"),
    ("gc", "--delete-older-than"), ("generations p", "--older-than"), ("systemd-units", "--keep-dead-for"),
    ("cache gc file:///nonexistent --keep-from k:AAAA", "--grace"),
]


@pytest.fixture(scope="module")
def empty_store(tmp_path_factory):
    from llmgw_store.core.local_store import Store

    root = tmp_path_factory.mktemp("empty") / "root"
    Store.open(root, create=True).close()
    return root


@pytest.mark.parametrize("command, option", CASES)
def test_an_empty_size_or_duration_is_exit_2(empty_store, tmp_path, command, option):
    before = sorted(p.relative_to(empty_store) for p in empty_store.rglob("*"))
    extra = ["--out", str(tmp_path)] if command == "systemd-units" else []
    proc = run_cli(empty_store, *command.split(), option, "", *extra)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("llmgw-store: error: ") and "empty" in lines[0], proc.stderr
    assert sorted(p.relative_to(empty_store) for p in empty_store.rglob("*")) == before
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("text", ["", " ", "\t"])
def test_the_parsers_refuse_an_empty_value(text):
    for parse in (parse_size, parse_duration):
        with pytest.raises(UsageError, match="empty"):
            parse(text)


def test_a_given_value_still_works(empty_store):
    proc = run_cli(empty_store, "--json", "gc", "--max-freed", "1G", "--keep-dead-for", "1h", "--min-free", "0")
    assert proc.returncode == 0, proc.stderr
