"""The one tree walk (system/trees.walk) on real trees: a link to a directory is listed, never
entered (also when it replaces a directory between its listing and its opening); a FIFO is listed,
never opened; a directory replaced by another is not entered; the order is a listing's (sorted,
depth first, a directory before what it holds); the depth and entry bounds raise TreeTooLarge; a
walk stopped early closes its descriptors. Each refusal beside the case that works."""

from __future__ import annotations

import os
import stat
import threading
from contextlib import nullcontext

import pytest

from llmgw_store.system.trees import TreeTooLarge, force_rmtree, walk, walk_files


def _tree(root):
    """root/{b, a, aa, c/{z, a}, d/e/f/g}: names made out of order."""
    root.mkdir()
    for name in ("b", "a", "aa"):
        (root / name).write_text(name)
    (root / "c").mkdir()
    (root / "c" / "z").write_text("z")
    (root / "c" / "a").write_text("a")
    (root / "d" / "e" / "f").mkdir(parents=True)
    (root / "d" / "e" / "f" / "g").write_text("g")
    return root


def _open_fds():
    return len(os.listdir("/proc/self/fd"))


def test_order_is_sorted_depth_first(tmp_path):
    root = _tree(tmp_path / "t")
    assert [rel for rel, _ in walk(root)] == ["", "a", "aa", "b", "c", "c/a", "c/z", "d", "d/e", "d/e/f", "d/e/f/g"]


def test_unsorted_walk_yields_the_same_entries_depth_first(tmp_path):
    root = _tree(tmp_path / "t")
    rels = [rel for rel, _ in walk(root, sort=False)]
    assert sorted(rels) == [rel for rel, _ in walk(root)]
    for i, rel in enumerate(rels[1:], 1):  # each entry's directory came before it
        parent = rel.rpartition("/")[0]
        assert parent in rels[:i]


def test_yields_each_entrys_lstat(tmp_path):
    root = _tree(tmp_path / "t")
    (root / "link").symlink_to("a")
    got = dict(walk(root))
    for rel, st in got.items():
        assert (st.st_ino, st.st_mode) == (os.lstat(root / rel).st_ino, os.lstat(root / rel).st_mode)
    assert stat.S_ISLNK(got["link"].st_mode)


def test_a_link_to_a_directory_is_listed_not_entered(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("s")
    root = tmp_path / "t"
    root.mkdir()
    (root / "real").mkdir()
    (root / "real" / "inside").write_text("i")
    (root / "link").symlink_to(outside)
    got = dict(walk(root))
    assert sorted(got) == ["", "link", "real", "real/inside"]
    assert stat.S_ISLNK(got["link"].st_mode)


def test_a_root_that_is_a_link_is_not_entered(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_text("f")
    (tmp_path / "l").symlink_to(tmp_path / "d")
    got = list(walk(tmp_path / "l"))
    assert [rel for rel, _ in got] == [""] and stat.S_ISLNK(got[0][1].st_mode)


@pytest.mark.parametrize("strict", [False, True])
def test_a_directory_swapped_for_a_link_after_its_listing_is_not_entered(tmp_path, strict):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("s")
    root = tmp_path / "t"
    (root / "d").mkdir(parents=True)
    (root / "d" / "mine").write_text("m")
    seen = []
    it = walk(root, strict=strict)
    with pytest.raises(OSError) if strict else nullcontext():
        for rel, _ in it:
            seen.append(rel)
            if rel == "d":  # listed as a directory; swapped before the walk opens it
                os.rename(root / "d", tmp_path / "moved")
                (root / "d").symlink_to(outside)
    assert "d/secret" not in seen and "d/mine" not in seen


@pytest.mark.parametrize("strict", [False, True])
def test_a_directory_replaced_by_another_is_not_entered(tmp_path, strict):
    root = tmp_path / "t"
    (root / "d").mkdir(parents=True)
    seen = []
    with pytest.raises(OSError, match="replaced") if strict else nullcontext():
        for rel, _ in walk(root, strict=strict):
            seen.append(rel)
            if rel == "d":
                os.rename(root / "d", tmp_path / "moved")
                (root / "d").mkdir()
                (root / "d" / "planted").write_text("p")
    assert "d/planted" not in seen


def test_a_fifo_is_listed_never_opened(tmp_path):
    root = tmp_path / "t"
    root.mkdir()
    os.mkfifo(root / "fifo")
    (root / "z").write_text("z")
    out: list = []
    worker = threading.Thread(target=lambda: out.extend(walk(root)), daemon=True)
    worker.start()
    worker.join(60)  # a bound for a broken walk, not a timing assertion: a correct one never waits
    if worker.is_alive():  # blocked in open(): release it, then fail
        os.close(os.open(root / "fifo", os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("the walk opened the FIFO")
    got = dict(out)
    assert sorted(got) == ["", "fifo", "z"] and stat.S_ISFIFO(got["fifo"].st_mode)


def test_depth_bound(tmp_path):
    root = _tree(tmp_path / "t")  # d/e/f is the deepest directory: depth 3
    assert len(list(walk(root, max_depth=3))) == 11
    with pytest.raises(TreeTooLarge, match="nested deeper than 2 directories") as caught:
        list(walk(root, max_depth=2))
    assert (caught.value.bound, caught.value.limit, caught.value.root) == ("depth", 2, os.fspath(root))


def test_entry_bound(tmp_path):
    root = _tree(tmp_path / "t")  # 11 entries, the root counted
    assert len(list(walk(root, max_entries=11))) == 11
    with pytest.raises(TreeTooLarge, match="more than 10 entries") as caught:
        list(walk(root, max_entries=10))
    assert (caught.value.bound, caught.value.limit) == ("entries", 10)


def test_a_bound_error_or_an_early_stop_closes_every_descriptor(tmp_path):
    root = _tree(tmp_path / "t")
    before = _open_fds()
    with pytest.raises(TreeTooLarge):
        list(walk(root, max_entries=10))
    assert _open_fds() == before
    it = walk(root)
    for rel, _ in it:
        if rel == "d/e/f":  # three directories deep: three descriptors open
            assert _open_fds() > before
            break
    it.close()
    assert _open_fds() == before


def test_missing_root_and_file_root(tmp_path):
    assert list(walk(tmp_path / "missing")) == []
    with pytest.raises(FileNotFoundError):
        list(walk(tmp_path / "missing", strict=True))
    (tmp_path / "f").write_text("f")
    assert [rel for rel, _ in walk(tmp_path / "f")] == [""]


def test_an_entry_gone_before_its_lstat(tmp_path):
    root = tmp_path / "t"
    root.mkdir()
    for name in ("a", "b", "c"):
        (root / name).write_text(name)
    seen = []
    for rel, _ in walk(root):  # sorted: the listing is read whole before "a" is yielded
        seen.append(rel)
        if rel == "a":
            (root / "b").unlink()
    assert seen == ["", "a", "c"]
    (root / "b").write_text("b")
    with pytest.raises(FileNotFoundError):
        for rel, _ in walk(root, strict=True):
            if rel == "a":
                (root / "b").unlink()


def test_walk_files_yields_every_non_directory_by_path(tmp_path):
    root = _tree(tmp_path / "t")
    (root / "link").symlink_to(tmp_path)
    got = {p: st for p, st in walk_files(root)}
    assert sorted(got) == sorted(os.path.join(root, r) for r in ("a", "aa", "b", "c/a", "c/z", "d/e/f/g", "link"))



def test_force_rmtree_removes_a_frozen_tree_and_leaves_what_its_links_point_to(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "kept").write_text("k")
    os.chmod(outside, 0o555)
    root = _tree(tmp_path / "t")
    (root / "c" / "link").symlink_to(outside)
    for d in (root / "d" / "e" / "f", root / "d" / "e", root / "d", root / "c", root):
        os.chmod(d, 0o500)  # frozen, and not even listable by the group
    force_rmtree(root)
    assert not os.path.lexists(root)
    assert stat.S_IMODE(os.lstat(outside).st_mode) == 0o555 and (outside / "kept").exists()
    force_rmtree(root)  # a missing tree is not an error
