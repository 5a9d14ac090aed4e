"""A profile's generation summary (roots/summary.py) on a real store: `generations` reads one file,
not one per record, and says exactly what the records say; a summary that is tampered with, from
another key or stale is not believed, and the next change of the profile makes it again from the
records."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from llmgw_store.core.layout import Layout
from llmgw_store.roots import records, summary
from llmgw_store.system import files
from tests.conftest import build_store, copy_store, run_cli


@pytest.fixture(scope="module")
def template(tmp_path_factory, wheels):
    """Profile p: generations 1-5 alternating two paths, 2 deleted (cold, record kept), 4 forgotten."""
    t = build_store(tmp_path_factory.mktemp("summary"), wheels, "2024-02-02", "2024-06-02")
    t["index"].stop()
    root = t["root"]
    for i in range(5):
        run_cli(root, "activate", "p", t["paths"][i % 2], check=True)
    run_cli(root, "generations", "p", "--delete", "2", check=True)
    run_cli(root, "generations", "p", "--forget", "4", check=True)
    return t


@pytest.fixture
def store(template, tmp_path):
    root = copy_store(template["root"], tmp_path / "root")
    assert read_summary(root) and read_summary(root)[1]["stamp"] != record_stamp(root, 1)  # a copy: other inodes
    records.refresh_summary(Layout(root), "p")  # what the next change of the profile does
    return root, template["paths"]


def listing(root: Path) -> dict:
    return json.loads(run_cli(root, "--json", "generations", "p", check=True).stdout)


def from_records(root: Path) -> dict:
    """The listing read from the records alone (no summary to believe)."""
    (root / "profiles" / ".p.summary").unlink(missing_ok=True)
    return listing(root)


def read_summary(root: Path) -> dict[int, dict] | None:
    layout = Layout(root)
    fd = os.open(layout.profiles, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return summary.read(fd, "p", records.secret(layout))
    finally:
        os.close(fd)


def record_stamp(root: Path, n: int) -> list[int]:
    return summary.stamp(os.lstat(root / "profiles" / f".p-{n}.record"))


def test_listing_from_the_summary_is_the_listing_from_the_records(store):
    root, _ = store
    entries = read_summary(root)  # the changes of the profile wrote it
    assert sorted(entries) == [1, 2, 3, 5]
    assert all(entries[n]["stamp"] == record_stamp(root, n) for n in entries)
    from_summary = listing(root)
    assert [g["number"] for g in from_summary["generations"]] == [1, 2, 3, 5]
    assert [g["linked"] for g in from_summary["generations"]] == [True, False, True, True]
    assert from_summary == from_records(root)
    assert read_summary(root) is None  # a listing only looks: the next change makes it again
    run_cli(root, "generations", "p", "--forget", "2", check=True)  # a record removed
    assert sorted(read_summary(root)) == [1, 3, 5]


def test_the_first_activation_makes_the_summary(store, tmp_path):
    root, paths = store
    run_cli(root, "activate", "q", paths[0], check=True)  # the switch fast path
    layout = Layout(root)
    fd = os.open(layout.profiles, os.O_RDONLY | os.O_DIRECTORY)
    try:
        entries = summary.read(fd, "q", records.secret(layout))
    finally:
        os.close(fd)
    assert sorted(entries) == [1] and entries[1]["name"] == Path(paths[0]).name


def test_every_change_of_a_record_keeps_the_summary_current(store):
    root, paths = store
    run_cli(root, "activate", "p", paths[1], check=True)  # generation 6 (switch fast path)
    entries = read_summary(root)
    assert 6 in entries and entries[6]["stamp"] == record_stamp(root, 6)
    run_cli(root, "activate", "p", paths[0], "--keep-records", "3", check=True)  # 7, prunes cold 2
    entries = read_summary(root)
    assert 7 in entries and 2 not in entries and entries[7]["stamp"] == record_stamp(root, 7)
    run_cli(root, "generations", "p", "--forget", "3", check=True)
    entries = read_summary(root)
    assert 3 not in entries and sorted(entries) == sorted(records.numbers(Layout(root), "p"))
    before = listing(root)
    assert before == from_records(root)


def test_a_tampered_summary_is_not_believed_and_is_rebuilt(store):
    root, _ = store
    truth = listing(root)
    f = root / "profiles" / ".p.summary"
    raw = f.read_bytes()
    assert b'"version":"1.0"' in raw
    f.write_bytes(raw.replace(b'"version":"1.0"', b'"version":"6.6"'))
    assert read_summary(root) is None
    assert listing(root) == truth
    run_cli(root, "generations", "p", "--forget", "2", check=True)  # the next change makes it again
    assert read_summary(root) is not None and b"6.6" not in f.read_bytes()


def test_a_summary_under_another_key_is_not_believed(store):
    root, _ = store
    truth = listing(root)
    entries = read_summary(root)
    assert entries
    for e in entries.values():
        e["version"] = "6.6"
    fd = os.open(root / "profiles", os.O_RDONLY | os.O_DIRECTORY)
    try:
        summary.write(fd, "p", b"\x00" * 32, entries)  # the right shape, the wrong key
    finally:
        os.close(fd)
    assert read_summary(root) is None
    assert listing(root) == truth


def test_a_stale_summary_is_rebuilt_from_the_record(store):
    root, _ = store
    layout = Layout(root)
    rec = records.load(layout, "p", 3)
    # A record put back behind the summary's back (a backup restored), with a valid digest.
    changed = records.with_activation(rec, {**rec.activation, "rolled_back_to": 1})
    body = changed.body()
    doc = {**body, "digest": records.seal(records.secret(layout), body)}
    fd = os.open(layout.profiles, os.O_RDONLY | os.O_DIRECTORY)
    try:
        files.write_atomic(".p-3.record", json.dumps(doc).encode(), dir_fd=fd, mode=0o600)
    finally:
        os.close(fd)
    assert read_summary(root)[3]["stamp"] != record_stamp(root, 3)  # stale for 3
    got = listing(root)
    assert [g["rolled_back_to"] for g in got["generations"] if g["number"] == 3] == [1]
    run_cli(root, "generations", "p", "--forget", "2", check=True)  # a change takes the entry again
    assert read_summary(root)[3]["rolled_back_to"] == 1 and read_summary(root)[3]["stamp"] == record_stamp(root, 3)
    assert listing(root) == from_records(root)


def test_a_record_changed_under_a_valid_summary_is_refused(store):
    root, _ = store
    f = root / "profiles" / ".p-3.record"
    f.write_bytes(f.read_bytes().replace(b'"kind": "activate"', b'"kind": "activatE"'))
    got = listing(root)
    assert [g["number"] for g in got["generations"] if g["record"]] == [1, 2, 5]
    assert len(got["records_refused"]) == 1 and ".p-3.record" in got["records_refused"][0]
    assert got == from_records(root)
