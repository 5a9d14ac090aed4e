"""extract_tar against hostile archives built by hand, and the genuine archives it must unpack.

Every attack asserts two things: the archive is refused (IntegrityError naming archive and
member), and nothing outside the destination changed: `tmp_path` holds a sentinel directory
`outside/` with a file in it, and a snapshot of everything under `tmp_path` except the
destination (names, modes, link counts, contents, link targets) is the same afterwards.
"""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from llmgw_store.base.errors import IntegrityError
from llmgw_store.build import fetch
from llmgw_store.system.extract import extract_tar

# --- building archives ---------------------------------------------------------------------------


def d(name: str, mode: int = 0o755):
    info = tarfile.TarInfo(name)
    info.type, info.mode = tarfile.DIRTYPE, mode
    return info, None


def f(name: str, data: bytes = b"x", mode: int = 0o644):
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), mode
    return info, data


def sym(name: str, target: str):
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = tarfile.SYMTYPE, target, 0o777
    return info, None


def hard(name: str, target: str):
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.LNKTYPE, target
    return info, None


def special(name: str, kind: bytes):
    info = tarfile.TarInfo(name)
    info.type, info.devmajor, info.devminor = kind, 1, 3
    return info, None


def tar_bytes(members, mode: str = "w:gz") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode, format=tarfile.PAX_FORMAT) as tf:
        for info, data in members:
            tf.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def cve_2025_4517(dest: str, prefix: str, up: int, last, *, physical: bool = False) -> list:
    """The published shape: directories with long names nested 16 deep, each reachable through a
    one-letter link, so that `a/b/.../p` is short to write but its resolution is nearly PATH_MAX
    long; a link `a/.../p/lll...` back up to `prefix` that os.path.realpath can no longer lstat, so
    it treats it as a directory; `escape` through it and `up` levels higher; then `last` through
    `escape`. Component length chosen from len(dest) so the deepest directory still fits PATH_MAX
    (tarfile must be able to make it) and the long link does not. With `physical` the long link
    is named by its real path (no write through the one-letter links), so that what refuses it is
    the resolution of `escape` itself."""
    base = len(dest) + 1 + len(prefix)
    comp = "d" * (230 if physical else min(250, (4090 - base) // 16 - 1))
    steps = "abcdefghijklmnop"
    members, path = [d(prefix)] if prefix else [], prefix
    for step in steps:
        members.append(d(os.path.join(path, comp)))
        members.append(sym(os.path.join(path, step), comp))
        path = os.path.join(path, comp)
    linkpath = os.path.join(*steps, "l" * 254)
    members.append(sym(os.path.join(path if physical else os.path.join(prefix, *steps), "l" * 254), "../" * len(steps)))
    members.append(sym(os.path.join(prefix, "escape"), linkpath + "/.." * up + "/outside"))
    members.append(last(os.path.join(prefix, "escape")))
    return members


# --- the sentinel --------------------------------------------------------------------------------


def snapshot(root: Path, skip: Path) -> dict:
    """Every entry under `root` except `skip` and below, as (mode, nlink, content or target)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [n for n in dirnames if Path(dirpath, n) != skip]
        for n in dirnames + filenames:
            p = Path(dirpath, n)
            if p == skip:
                continue
            st = os.lstat(p)
            body = os.readlink(p) if stat.S_ISLNK(st.st_mode) else p.read_bytes() if stat.S_ISREG(st.st_mode) else None
            out[str(p)] = (st.st_mode, st.st_nlink, body)
    return out


@pytest.fixture
def outside(tmp_path) -> Path:
    o = tmp_path / "outside"
    o.mkdir()
    (o / "secret").write_text("secret\n")
    return o


# --- extract_tar directly ------------------------------------------------------------------------

def unpack(dest: Path, members, *, policy="inside", mode="w:gz", **kw):
    kw.setdefault("max_bytes", None)
    kw.setdefault("max_members", 10_000)
    return extract_tar(io.BytesIO(tar_bytes(members, mode)), dest, policy=policy, label="evil.tar", **kw)


def refused(tmp_path: Path, members, match: str | None = None, *, policy="inside", dest: Path | None = None,
            **kw) -> str:
    """Assert the archive is refused and nothing outside `dest` changed; return the message."""
    if dest is None:
        dest = tmp_path / "dest"
        dest.mkdir()
    before = snapshot(tmp_path, dest)
    passwd = os.stat("/etc/passwd")
    with pytest.raises(IntegrityError, match=match) as exc:
        unpack(dest, members, policy=policy, **kw)
    assert snapshot(tmp_path, dest) == before
    assert os.stat("/etc/passwd").st_nlink == passwd.st_nlink
    assert str(exc.value).startswith("evil.tar: refusing to unpack: member ")
    return str(exc.value)


BOTH = pytest.mark.parametrize("policy", ["inside", "signed"])


@BOTH
def test_cve_2025_4517_shape_is_refused_under_both_policies(tmp_path, outside, policy):
    dest = tmp_path / "dest"
    dest.mkdir()
    members = cve_2025_4517(str(dest), "", 1, lambda esc: f(esc + "/pwned", b"pwned\n"), physical=True)
    # "inside" refuses the link that leads out; "signed" keeps it as content and refuses the write.
    # (under "inside" the first link back up, long before `escape`, already leaves its top directory)
    where = {"inside": "is a symlink that leads out", "signed": "'escape/pwned' is below the symlink member"}
    refused(tmp_path, members, where[policy], policy=policy, dest=dest)


@BOTH
@pytest.mark.parametrize("hops", [1, 2, 5, 40, 60])
def test_a_chain_of_links_then_a_file_through_it(tmp_path, outside, policy, hops):
    """c1 -> ., c2 -> c1, ... cN -> c(N-1), esc -> cN/.. (lexically dest itself, physically its
    parent), then esc/outside/pwned."""
    members = [sym("c1", ".")] + [sym(f"c{i}", f"c{i - 1}") for i in range(2, hops + 1)]
    members += [sym("esc", f"c{hops}/.."), f("esc/outside/pwned", b"pwned\n")]
    msg = refused(tmp_path, members, policy=policy)
    if policy == "signed":
        assert "'esc/outside/pwned' is below the symlink member 'esc'" in msg
    elif hops < 40:
        assert "'esc' is a symlink that leads out of the tree" in msg
    else:  # esc and c40 ... c1 are 41 links, as many as the kernel would refuse to follow (ELOOP)
        assert f"'{'esc' if hops == 40 else 'c41'}' is a symlink through more than 40 links" in msg
    assert not (outside / "pwned").exists()


@pytest.mark.parametrize("members, bad", [
    ([d("sub"), sym("sub/b", ".."), sym("sub/a", "b/..")], "sub/b"),      # b -> .. leaves sub already
    ([sym("x", "."), sym("y", "x/x/x/..")], "y"),                         # x -> . repeated, then up
    ([sym("x", "."), sym("y", "x/./x/../../outside")], "y"),
    ([d("a"), d("a/b"), sym("a/b/up", "../.."), sym("z", "a/b/up/../outside")], "a/b/up"),
    ([d("t"), d("t/a"), d("t/a/b"), sym("t/a/b/up", "../.."), sym("t/z", "a/b/up/../outside")], "t/z"),
    ([d("top"), sym("top/py", "../bin/python")], "top/py"),             # beside top: bin/python once moved
    ([sym("self", "self/x")], "self"),                                    # a loop
    ([sym("p", "q"), sym("q", "p")], "q"),
    ([sym("abs", "/etc")], "abs"),
    ([sym("up", "..")], "up"),
    ([d("a"), sym("a/up", "../../outside")], "a/up"),
    ([d("a"), sym("a/link", "/tmp"), sym("b", "a/link/x")], "a/link"),
])
def test_inside_policy_resolves_every_hop(tmp_path, outside, members, bad):
    refused(tmp_path, members + [f(bad + "/pwned")], f"member '{bad}' is a symlink")


def test_a_link_made_to_lead_out_by_a_later_link_is_refused_at_the_end(tmp_path, outside):
    """t/l -> d/e/../.. is t while e is a directory name; once t/d/e -> .. it is dest itself,
    outside l's top directory t."""
    members = [d("t"), sym("t/l", "d/e/../.."), d("t/d"), sym("t/d/e", "..")]
    msg = refused(tmp_path, members, "member 't/l' is a symlink that leads out of its top directory")
    assert "once the archive's later links are made" in msg


@BOTH
def test_a_file_below_a_symlink_member(tmp_path, outside, policy):
    target = "." if policy == "inside" else str(outside)
    refused(tmp_path, [d("pkg"), sym("pkg/lib", target), f("pkg/lib/x", b"pwned")],
            "'pkg/lib/x' is below the symlink member 'pkg/lib'", policy=policy)
    assert not (outside / "x").exists()


@pytest.mark.parametrize("members", [
    [sym("a", "b"), f("a", b"replaced")],
    [f("a", b"1"), f("a", b"2")],
    [f("a", b"1"), sym("a", "b")],
    [d("a"), f("a", b"1")],
    [f("a", b"1"), d("a")],
    [f("a", b"1"), f("a/b", b"2")],
    [d("a"), f("a/x"), hard("a/y", "a/x"), hard("a/y", "a/x")],
])
def test_a_member_that_would_replace_an_earlier_one(tmp_path, members):
    msg = refused(tmp_path, members)
    assert "would replace an earlier member" in msg or "is below the file member 'a'" in msg


@BOTH
@pytest.mark.parametrize("target, why", [
    ("/etc/passwd", "absolute"),
    ("../outside/secret", ".. component"),
    ("pkg/../../outside/secret", ".. component"),
    ("pkg/link", "not a regular file extracted earlier"),      # a symlink member
    ("pkg/later", "not a regular file extracted earlier"),     # a member that comes after
    ("pkg", "not a regular file extracted earlier"),           # a directory
    ("pkg/missing", "not a regular file extracted earlier"),
    ("", "empty"),
])
def test_hard_links_only_to_earlier_regular_files(tmp_path, outside, policy, target, why):
    members = [d("pkg"), f("pkg/file"), sym("pkg/link", "file"), hard("pkg/h", target), f("pkg/later")]
    refused(tmp_path, members, f"member 'pkg/h' .*{why}", policy=policy)


@BOTH
@pytest.mark.parametrize("name, why", [
    ("/tmp/llmgw-extract-abs", "absolute name"),
    ("//etc/x", "absolute name"),
    ("../outside/pwned", r"\.\. component"),
    ("a/../../outside/pwned", r"\.\. component"),
    ("a/b/../../../outside/pwned", r"\.\. component"),
    ("", "empty name"),
    (".", "empty name"),
    ("a" * 256, "component over 255 bytes"),
    ("/".join(["a" * 200] * 21), "bytes \\(at most 4096\\)"),
    ("/".join("a" * 200), "components deep"),
])
def test_bad_names(tmp_path, outside, policy, name, why):
    refused(tmp_path, [f(name, b"pwned")], why, policy=policy)
    assert not Path("/tmp/llmgw-extract-abs").exists() and not (outside / "pwned").exists()


def test_a_nul_byte_in_a_name(tmp_path):
    info, data = f("a\x00b")
    info.pax_headers = {"path": "a\x00/../../outside/pwned"}
    refused(tmp_path, [(info, data)], "NUL byte")


@BOTH
@pytest.mark.parametrize("kind", [tarfile.CHRTYPE, tarfile.BLKTYPE, tarfile.FIFOTYPE, b"V", b"Z"])
def test_devices_fifos_and_other_types(tmp_path, policy, kind):
    refused(tmp_path, [d("pkg"), special("pkg/dev", kind)], "'pkg/dev' is a device, fifo or other special file",
            policy=policy)


@BOTH
@pytest.mark.parametrize("member", [f("su", b"#!/bin/sh\n", 0o4755), f("sg", b"x", 0o2755), d("sticky", 0o1777)])
def test_setuid_setgid_and_sticky_bits_are_refused(tmp_path, policy, member):
    refused(tmp_path, [member], "setuid, setgid or sticky bit", policy=policy)


class ZeroTar(io.RawIOBase):
    """One header declaring `size` bytes, then zeros produced on demand; counts what was read."""

    def __init__(self, size: int):
        info = tarfile.TarInfo("bomb")
        info.size = size
        self.header, self.left, self.consumed = info.tobuf(tarfile.USTAR_FORMAT), size + 1024, 0

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        n = 0
        if self.header:
            n = min(len(b), len(self.header))
            b[:n], self.header = self.header[:n], self.header[n:]
        else:
            n = min(len(b), self.left)
            b[:n] = bytes(n)
            self.left -= n
        self.consumed += n
        return n


def test_a_tar_bomb_stops_before_its_bytes_are_read(tmp_path):
    dest = tmp_path / "dest"
    dest.mkdir()
    stream = ZeroTar(100 << 20)
    with pytest.raises(IntegrityError, match=r"'bomb' would take the archive past 1048576 bytes \(104857600 bytes"):
        extract_tar(io.BufferedReader(stream), dest, policy="inside", max_bytes=1 << 20, max_members=10,
                    label="bomb.tar")
    assert stream.consumed < 1 << 20
    assert not (dest / "bomb").exists()


def test_a_bomb_of_many_files_stops_at_the_first_one_past_the_bound(tmp_path):
    dest = tmp_path / "dest"
    dest.mkdir()
    members = [f(f"f{i}", bytes(400_000)) for i in range(5)]
    refused(tmp_path, members, "'f2' would take the archive past 1000000 bytes", dest=dest, max_bytes=1_000_000)
    assert sorted(p.name for p in dest.iterdir()) == ["f0", "f1"]


def test_too_many_members(tmp_path):
    dest = tmp_path / "dest"
    dest.mkdir()
    refused(tmp_path, [f(f"f{i:02}") for i in range(20)], "'f10' is past the limit of 10 members", dest=dest,
            max_members=10)
    assert len(list(dest.iterdir())) == 10


@BOTH
@pytest.mark.parametrize("planted, members", [
    ("sub", [f("sub/file", b"pwned")]),                      # a planted link as a parent
    ("sub", [d("sub"), f("sub/file", b"pwned")]),            # ... named by a directory member
    ("sub", [f("a"), hard("sub/file", "a")]),                # ... as the parent of a hard link
    ("sub", [sym("sub/file", "x")]),                         # ... as the parent of a symlink
    ("secret", [f("secret", b"pwned")]),                     # a planted link as the file itself
])
def test_a_link_planted_in_dest_is_never_followed(tmp_path, outside, policy, planted, members):
    dest = tmp_path / "dest"
    dest.mkdir()
    os.symlink(outside / planted if planted == "secret" else outside, dest / planted)
    msg = refused(tmp_path, members, policy=policy, dest=dest)
    assert "meets an entry already in the way" in msg and "which is not followed" in msg
    assert sorted(p.name for p in outside.iterdir()) == ["secret"]
    assert (outside / "secret").read_text() == "secret\n"


def test_signed_top_holds_every_member(tmp_path, outside):
    refused(tmp_path, [d("env"), f("env/a"), f("other/b")], "'other/b' is outside env/", policy="signed", top="env")


def test_signed_top_must_be_a_directory(tmp_path):
    refused(tmp_path, [f("env", b"x")], "'env' is env itself and not a directory", policy="signed", top="env")


def test_corrupt_archives_are_not_readable(tmp_path):
    dest = tmp_path / "dest"
    dest.mkdir()
    good = tar_bytes([f("a", bytes(10_000))])
    for bad in (b"not a tar at all" * 100, good[: len(good) // 2]):
        with pytest.raises(IntegrityError, match="evil.tar: not a readable tar archive"):
            extract_tar(io.BytesIO(bad), dest, policy="inside", max_bytes=None, max_members=10, label="evil.tar")
        for p in dest.iterdir():
            p.unlink()


# --- what must unpack ------------------------------------------------------------------------------


def test_a_genuine_source_tarball(tmp_path):
    members = [
        d("./pkg-1.0/", 0o775),
        f("./pkg-1.0/setup.py", b"print('setup')\n", 0o664),
        d("pkg-1.0/bin"),
        f("pkg-1.0/bin/run", b"#!/bin/sh\necho run\n", 0o775),
        f("pkg-1.0/bin/all", b"#!/bin/sh\n", 0o777),
        d("pkg-1.0/src/pkg/data"),                           # parents it implies are made
        f("pkg-1.0/src/pkg/data/v1.txt", b"v1\n"),
        sym("pkg-1.0/src/pkg/data/latest", "v1.txt"),
        sym("pkg-1.0/docs", "src/pkg/../pkg/data"),           # relative, with a .. that stays inside
        sym("pkg-1.0/up", "src/pkg/data/../../.."),           # pkg-1.0 itself
        sym("pkg-1.0/dangling", "not/there"),
        hard("pkg-1.0/bin/run-again", "pkg-1.0/bin/run"),
        d("pkg-1.0/readonly", 0o555),
        f("pkg-1.0/readonly/frozen.txt", b"frozen\n", 0o444),
        d("pkg-1.0/empty", 0o700),
    ]
    dest = tmp_path / "dest"
    dest.mkdir()
    stats = unpack(dest, members, max_bytes=1 << 20, max_members=len(members))
    root = dest / "pkg-1.0"
    assert (root / "setup.py").read_text() == "print('setup')\n"
    assert (root / "docs" / "latest").read_text() == "v1\n" and os.readlink(root / "docs") == "src/pkg/../pkg/data"
    assert (root / "up" / "setup.py").exists() and os.readlink(root / "dangling") == "not/there"
    modes = {p: stat.S_IMODE(os.lstat(root / p).st_mode) for p in
             ("", "setup.py", "bin/run", "bin/all", "src", "src/pkg/data", "readonly", "readonly/frozen.txt", "empty")}
    assert modes == {"": 0o755, "setup.py": 0o644, "bin/run": 0o755, "bin/all": 0o755, "src": 0o755,
                     "src/pkg/data": 0o755, "readonly": 0o555, "readonly/frozen.txt": 0o444, "empty": 0o700}
    assert os.stat(root / "bin/run").st_ino == os.stat(root / "bin/run-again").st_ino
    assert (stats.files, stats.hardlinks, stats.symlinks, stats.dirs, stats.members) == (5, 1, 4, 5, len(members))
    assert stats.bytes == sum(len(data) for info, data in members if data)
    (root / "readonly").chmod(0o755)


def test_signed_policy_keeps_absolute_links_and_checks_top(tmp_path):
    members = [d("env"), d("env/bin"), sym("env/bin/python", "/usr/bin/python3"), sym("env/bin/python3", "python"),
               f("env/bin/tool", b"#!/bin/sh\n", 0o755), sym("env/lib64", "lib"), d("env/lib")]
    dest = tmp_path / "dest"
    dest.mkdir()
    unpack(dest, members, policy="signed", top="env", max_bytes=None, max_members=100, mode="w")
    assert os.readlink(dest / "env/bin/python") == "/usr/bin/python3"
    assert os.readlink(dest / "env/lib64") == "lib"
    with pytest.raises(ValueError):
        unpack(tmp_path, [], policy="signed", top="../x", max_bytes=None, max_members=1)


def test_the_same_absolute_link_is_refused_under_inside(tmp_path):
    refused(tmp_path, [d("env"), d("env/bin"), sym("env/bin/python", "/usr/bin/python3")],
            "'env/bin/python' is a symlink to an absolute path")


def test_a_zstd_stream_in_one_pass(tmp_path):
    """What fleet will pass: a non-seekable zstd reader over an uncompressed tar."""
    import zstandard

    members = [d("env")] + [f(f"env/d{i % 7}/f{i}", os.urandom(i * 37)) for i in range(300)]
    compressed = zstandard.ZstdCompressor().compress(tar_bytes(members, "w"))
    dest = tmp_path / "dest"
    dest.mkdir()
    with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(compressed)) as zr:
        stats = extract_tar(zr, dest, policy="signed", top="env", max_bytes=None, max_members=1000)
    assert stats.files == 300
    for info, data in members[1:]:
        assert (dest / info.name).read_bytes() == data


def test_many_directories_do_not_exhaust_fds(tmp_path):
    """The fd cache is bounded: 600 directories, revisited out of order, with a soft fd limit of 256."""
    import resource

    members = [f(f"t/d{i}/x", b"1") for i in range(600)] + [f(f"t/d{i}/y", b"2") for i in range(0, 600, 7)]
    soft, hard_limit = resource.getrlimit(resource.RLIMIT_NOFILE)
    dest = tmp_path / "dest"
    dest.mkdir()
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard_limit))
    try:
        unpack(dest, members, max_members=10_000, mode="w")
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard_limit))
    assert len(list((dest / "t").iterdir())) == 600 and (dest / "t/d595/y").read_bytes() == b"2"


# --- through fetch.unpack_source (what builds use) -----------------------------------------------


@pytest.mark.parametrize("last", ["file", "symlink"])
def test_unpack_source_refuses_the_cve_2025_4517_shape(tmp_path, outside, last):
    """Before extract.py, tarfile's `data` filter let this write outside/pwned (realpath gives up
    past PATH_MAX and treats the long link as a directory), and the lexical pre-check passed it."""
    scratch = tmp_path / "scratch"
    if last == "file":
        make = lambda esc: f(esc + "/pwned", b"pwned\n")  # noqa: E731
    else:
        make = lambda esc: sym(esc + "/pwned", "secret")  # noqa: E731
    archive = tmp_path / "pkg-1.0.tar.gz"
    archive.write_bytes(tar_bytes(cve_2025_4517(str(scratch), "pkg-1.0", 2, make)))
    before = snapshot(tmp_path, scratch)
    # Refused where the archive first writes through one of its links: the long link itself.
    with pytest.raises(IntegrityError, match=r"pkg-1.0.tar.gz: refusing to unpack: member 'pkg-1.0/a/b/c/.*"
                                             r" is below the symlink member 'pkg-1.0/a' \(a write through a link\)"):
        fetch.unpack_source(archive, scratch, None, "recipe.toml", "build[0].source")
    assert not os.path.lexists(outside / "pwned")
    assert snapshot(tmp_path, scratch) == before


def test_unpack_source_takes_the_top_directory_and_passes_the_bound(tmp_path):
    archive = tmp_path / "pkg-1.0.tar.gz"
    archive.write_bytes(tar_bytes([d("pkg-1.0"), f("pkg-1.0/a.py", b"a\n" * 1000), sym("pkg-1.0/b.py", "a.py")]))
    top = fetch.unpack_source(archive, tmp_path / "s1", None, "recipe.toml", "build[0].source")
    assert top == tmp_path / "s1" / "pkg-1.0" and (top / "b.py").read_text() == "a\n" * 1000
    with pytest.raises(IntegrityError, match="past 100 bytes"):
        fetch.unpack_source(archive, tmp_path / "s2", None, "recipe.toml", "build[0].source", max_bytes=100)
    assert not (tmp_path / "s2").exists()


# --- issue 11: a nested top, extended-header bombs, link-resolution work -------------------------


def test_a_link_under_a_nested_top_may_not_leave_it(tmp_path, outside):
    """Only `top` moves into the environment: a link there that climbs to a directory beside it
    (inside the archive's top-level directory, so the old floor passed it) would, once moved, point
    into the environment (bin/, lib/) and uv would write through it outside the store."""
    archive = tmp_path / "pkg.tar.gz"
    archive.write_bytes(tar_bytes([d("a/b/c/d/e"), d("a/victimdir"), f("a/b/c/d/e/setup.py"),
                                   sym("a/b/c/d/e/kern", "../../../../victimdir")]))
    before = snapshot(tmp_path, tmp_path / "s1")
    with pytest.raises(IntegrityError, match=r"member 'a/b/c/d/e/kern' is a symlink that leads out of a/b/c/d/e/"):
        fetch.unpack_source(archive, tmp_path / "s1", "a/b/c/d/e", "recipe.toml", "build[0].source")
    assert not (tmp_path / "s1").exists()
    assert snapshot(tmp_path, tmp_path / "s1") == before


def test_links_inside_a_nested_top_and_beside_it_are_kept(tmp_path):
    archive = tmp_path / "pkg.tar.gz"
    archive.write_bytes(tar_bytes([d("a/b/c/d/e/sub"), f("a/b/c/d/e/y.py", b"y\n"), sym("a/b/c/d/e/sub/y", "../y.py"),
                                   sym("a/b/c/d/e/x", "sub/../y.py"), sym("a/other", "b/c")]))
    top = fetch.unpack_source(archive, tmp_path / "s1", "a/b/c/d/e", "recipe.toml", "build[0].source")
    assert (top / "x").read_text() == (top / "sub/y").read_text() == "y\n"
    assert os.readlink(tmp_path / "s1/a/other") == "b/c"  # not moved, so its own top directory bounds it


GNU_NAME = ("d" * 99 + "/") * 39 + "f"  # 3901 bytes, 40 components


def raw_extended_header(kind: bytes, size: int) -> bytes:
    """An uncompressed tar: a pax (x) or GNU long-name (L) header declaring `size` bytes of data,
    the data, then a genuine member."""
    hdr = tarfile.TarInfo("././@PaxHeader" if kind == tarfile.XHDTYPE else "././@LongLink")
    hdr.type, hdr.size = kind, size
    if kind == tarfile.XHDTYPE:
        data = (b"%d comment=" % size).ljust(size - 1, b"a") + b"\n"
    else:  # a NUL-terminated name of 100-byte components, as long as fits
        data = GNU_NAME[: max(0, size - 1)].encode().ljust(size, b"\0")
    body = hdr.tobuf(format=tarfile.GNU_FORMAT) + data + bytes(-size % 512)
    member = tarfile.TarInfo("pkg/file")
    member.size = 3
    return body + member.tobuf(format=tarfile.GNU_FORMAT) + b"hi\n".ljust(512, b"\0") + bytes(1024)


class Counting(io.RawIOBase):
    def __init__(self, data: bytes):
        self.data, self.consumed = data, 0

    def readable(self):
        return True

    def readinto(self, b):
        n = min(len(b), len(self.data) - self.consumed)
        b[:n] = self.data[self.consumed:self.consumed + n]
        self.consumed += n
        return n


@pytest.mark.parametrize("kind, what", [(tarfile.XHDTYPE, "pax"), (tarfile.GNUTYPE_LONGNAME, "GNU long-name/long-link")])
def test_a_huge_extended_header_is_refused_before_it_is_read(tmp_path, kind, what):
    """tarfile reads a pax or GNU long-name header whole into memory (204 KB of gzip made 625 MB
    of RSS); the bound is checked on its declared size, before its data is read, and the 8 MB name
    does not end up in the error."""
    dest = tmp_path / "dest"
    dest.mkdir()
    stream = Counting(raw_extended_header(kind, 8 << 20))
    with pytest.raises(IntegrityError, match=rf"refusing to unpack: {what} header\(s\) of 8388608 bytes before one member") as exc:
        extract_tar(io.BufferedReader(stream, 1 << 16), dest, policy="inside", max_bytes=None, max_members=10,
                    label="evil.tar")
    assert stream.consumed < 1 << 20
    assert len(str(exc.value)) < 300
    assert list(dest.iterdir()) == []


@pytest.mark.parametrize("kind", [tarfile.XHDTYPE, tarfile.GNUTYPE_LONGNAME])
def test_the_header_bound_sees_each_header_before_its_data(kind):
    """The bound uses tarfile's public hooks only: TarFile makes each header with its `tarinfo=`
    class's `frombuf`, before the data an extended header declares is read. If a Python release
    parsed headers another way the bound would silently stop working: fail here instead (the bomb
    test above would too)."""
    seen = []

    class Spy(tarfile.TarInfo):
        @classmethod
        def frombuf(cls, buf, encoding, errors):
            info = super().frombuf(buf, encoding, errors)
            seen.append((info.type, stream.consumed))
            return info

    stream = Counting(raw_extended_header(kind, 1 << 20))
    with tarfile.open(fileobj=io.BufferedReader(stream, 4096), mode="r|*", tarinfo=Spy) as tf:
        assert [m.size for m in tf] == [3]  # the one member, named by the extended header
    assert [t for t, _ in seen[:2]] == [kind, tarfile.REGTYPE]
    assert seen[0][1] < 1 << 16  # the extended header was parsed before its megabyte of data was read


@pytest.mark.parametrize("kind", [tarfile.XHDTYPE, tarfile.GNUTYPE_LONGNAME])
def test_a_small_extended_header_still_works(tmp_path, kind):
    dest = tmp_path / "dest"
    dest.mkdir()
    data = raw_extended_header(kind, 4000)
    stats = extract_tar(io.BytesIO(data), dest, policy="inside", max_bytes=None, max_members=10, label="ok.tar")
    assert stats.files == 1  # a GNU long name of 4000 bytes names the member after it
    assert (dest / (GNU_NAME if kind == tarfile.GNUTYPE_LONGNAME else "pkg/file")).read_bytes() == b"hi\n"


def test_long_names_in_pax_and_gnu_archives_still_unpack(tmp_path):
    long_name = "pkg/" + "n" * 200 + "/" + "m" * 200
    for fmt in (tarfile.PAX_FORMAT, tarfile.GNU_FORMAT):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
            info, data = f(long_name, b"z")
            tf.addfile(info, io.BytesIO(data))
        dest = tmp_path / f"dest{fmt}"
        dest.mkdir()
        extract_tar(io.BytesIO(buf.getvalue()), dest, policy="inside", max_bytes=None, max_members=10)
        assert (dest / long_name).read_bytes() == b"z"


def test_a_huge_name_is_cut_short_in_the_error(tmp_path):
    name = "pkg/" + "n" * 200_000  # a pax path of 200 KB: under the header bound, over the name bound
    msg = refused(tmp_path, [f(name)], "has a name of 200004 bytes")
    assert len(msg) < 400 and "(200004 characters)" in msg


def test_link_resolution_work_is_bounded(tmp_path):
    """10.5 KB of gzip: 38 links whose 4 KB targets of `./` each name the next, then 500 links into
    the chain; each resolution walked 76,000 components, twice for each of the 500 links. Now one
    resolution stops at MAX_RESOLVE_STEPS components."""
    pad = "./" * 1990
    members = [d("p")] + [sym(f"p/q{j}", pad + (f"q{j + 1}" if j < 37 else ".")) for j in range(38)]
    members += [sym(f"p/k{i}", pad + "q0") for i in range(500)]
    assert len(tar_bytes(members)) < 16_000
    refused(tmp_path, members, r"member 'p/q0' is a symlink whose resolution takes more than 1024 steps")


def test_too_many_symlinks(tmp_path, monkeypatch):
    from llmgw_store.system import extract
    monkeypatch.setattr(extract, "MAX_SYMLINKS", 50)  # 10,000 in earnest; the same check
    refused(tmp_path, [d("p"), f("p/x")] + [sym(f"p/l{i}", "x") for i in range(60)],
            "'p/l50' is past the limit of 50 symlinks")
    dest = tmp_path / "ok"
    dest.mkdir()
    assert unpack(dest, [d("p"), f("p/x")] + [sym(f"p/l{i}", "x") for i in range(50)]).symlinks == 50


def test_a_link_deeper_than_any_member_is_refused(tmp_path):
    refused(tmp_path, [d("p"), sym("p/deep", "/".join(["d"] * 200))], "leads more than 128 components deep")
