"""Files the store writes outside its root (a Prometheus textfile, key files, systemd units) are made
the safe way: a random name created O_EXCL|O_NOFOLLOW in the target directory, opened without
following a link and checked (root's or ours; writable by others only with the sticky bit), then
renamed over. Attacked by a real second user who owns or shares the directory; the store runs as
pid 1 of its own pid namespace (`unshare --pid --fork`), as in a container, so a name built from
its pid is one the attacker can guess."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import cli_cmd
from tests.support.users import as_user, second_user, shared_dir


@pytest.fixture(scope="module")
def intruder():
    yield from second_user("llmgwow")


@pytest.fixture
def place(tmp_path):
    d = shared_dir()
    victim = d / "victim"
    victim.write_text("root's file\n")
    victim.chmod(0o644)
    root = d / "root"
    from llmgw_store.core.local_store import Store

    Store.open(root, create=True).close()  # an empty store: enough for stats
    yield {"dir": d, "victim": victim, "root": root}
    shutil.rmtree(d, ignore_errors=True)


def as_pid_1(root: Path, *args: str) -> subprocess.CompletedProcess:
    """The installed command as pid 1 of a new pid namespace (a container's first process)."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare(1)")
    return subprocess.run(["unshare", "--pid", "--fork", *cli_cmd(root, *args)], capture_output=True, text=True,
                          timeout=120)


def intruder_dir(intruder, place, mode=0o755) -> Path:
    d = place["dir"] / "theirs"
    d.mkdir()
    os.chown(d, intruder.pw_uid, intruder.pw_gid)
    d.chmod(mode)
    return d


PLANT = """
import os, sys
for name in sys.argv[2:]:
    os.symlink(sys.argv[1], os.path.join(os.path.dirname(sys.argv[1]), "theirs", name))
"""


def test_prometheus_textfile_in_another_users_directory_never_reaches_roots_files(intruder, place):
    """The owner of node_exporter's directory plants the temp name the store used
    (`.llmgw.prom.<pid>.tmp`) as a link to a root file: before the fix, root wrote the metrics
    through it."""
    theirs = intruder_dir(intruder, place)
    as_user(intruder, PLANT, str(place["victim"]), ".llmgw.prom.1.tmp", "llmgw.prom")
    proc = as_pid_1(place["root"], "stats", "--prometheus", str(theirs / "llmgw.prom"))
    assert place["victim"].read_text() == "root's file\n"
    assert proc.returncode == 2 and "owned by uid" in proc.stderr, proc.stderr
    assert sorted(p.name for p in theirs.iterdir()) == [".llmgw.prom.1.tmp", "llmgw.prom"]  # nothing written


def test_prometheus_textfile_in_a_sticky_shared_directory_replaces_a_planted_link(intruder, place):
    """/tmp-like (1777, root's): allowed; a link planted at the final name or at the old
    predictable temp name is replaced or ignored, never written through."""
    sticky = place["dir"] / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    as_user(intruder, PLANT.replace('"theirs"', '"sticky"'), str(place["victim"]), ".llmgw.prom.1.tmp", "llmgw.prom")
    proc = as_pid_1(place["root"], "stats", "--prometheus", str(sticky / "llmgw.prom"))
    assert proc.returncode == 0, proc.stderr
    assert place["victim"].read_text() == "root's file\n"
    out = sticky / "llmgw.prom"
    assert not out.is_symlink() and "llmgw_store_paths" in out.read_text() and out.stat().st_uid == 0
    assert oct(out.stat().st_mode & 0o777) == oct(0o644)


def test_prometheus_textfile_in_roots_directory(place):
    out_dir = place["dir"] / "textfile"
    out_dir.mkdir()
    proc = as_pid_1(place["root"], "stats", "--prometheus", str(out_dir / "llmgw.prom"))
    assert proc.returncode == 0, proc.stderr
    assert [p.name for p in out_dir.iterdir()] == ["llmgw.prom"]  # no temporary file left


@pytest.mark.parametrize("how", ["link-dir", "group-writable"])
def test_prometheus_textfile_refuses_a_linked_or_open_directory(place, how):
    real = place["dir"] / "real"
    real.mkdir()
    if how == "link-dir":
        target = place["dir"] / "link"
        target.symlink_to(real)
    else:
        real.chmod(0o775)
        target = real
    proc = as_pid_1(place["root"], "stats", "--prometheus", str(target / "llmgw.prom"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert list(real.iterdir()) == []


def test_keygen_public_file_is_never_written_through_a_link(intruder, place):
    """`keygen NAME --out DIR` created the secret exclusively but wrote NAME.public through an
    existing link: in a shared sticky directory, a link planted there made root overwrite any file.
    Now a planted name is refused (nothing written), and a clean sticky directory works."""
    sticky = place["dir"] / "keys"
    sticky.mkdir()
    sticky.chmod(0o1777)
    as_user(intruder, PLANT.replace('"theirs"', '"keys"'), str(place["victim"]), "k1.public")
    proc = as_pid_1(place["root"], "keygen", "k1", "--out", str(sticky))
    assert place["victim"].read_text() == "root's file\n"
    assert proc.returncode == 2 and "exists" in proc.stderr, proc.stderr
    assert sorted(p.name for p in sticky.iterdir()) == ["k1.public"]  # the link, left as it was
    proc = as_pid_1(place["root"], "keygen", "k2", "--out", str(sticky))
    assert proc.returncode == 0, proc.stderr
    public, secret = sticky / "k2.public", sticky / "k2.secret"
    assert not public.is_symlink() and public.read_text().startswith("k2:")
    assert secret.stat().st_mode & 0o777 == 0o600 and secret.stat().st_uid == 0


def test_keygen_refuses_another_users_directory_and_an_existing_secret(intruder, place):
    theirs = intruder_dir(intruder, place)
    proc = as_pid_1(place["root"], "keygen", "k1", "--out", str(theirs))
    assert proc.returncode == 2 and "owned by uid" in proc.stderr and list(theirs.iterdir()) == [], proc.stderr
    mine = place["dir"] / "mine"
    mine.mkdir()
    (mine / "k2.secret").symlink_to(place["victim"])  # a link counts as taken: never replaced
    proc = as_pid_1(place["root"], "keygen", "k2", "--out", str(mine))
    assert proc.returncode == 2 and "exists" in proc.stderr, proc.stderr
    assert (mine / "k2.secret").is_symlink() and place["victim"].read_text() == "root's file\n"
    assert sorted(p.name for p in mine.iterdir()) == ["k2.secret"]


def test_systemd_units_refuse_another_users_directory(intruder, place):
    theirs = intruder_dir(intruder, place)
    as_user(intruder, PLANT, str(place["victim"]), "llmgw-store-gc.service")
    proc = as_pid_1(place["root"], "systemd-units", "--out", str(theirs))
    assert proc.returncode == 2 and "owned by uid" in proc.stderr, proc.stderr
    assert place["victim"].read_text() == "root's file\n"
    mine = place["dir"] / "units"
    mine.mkdir()
    (mine / "llmgw-store-gc.timer").symlink_to(place["victim"])
    proc = as_pid_1(place["root"], "systemd-units", "--out", str(mine))
    assert proc.returncode == 0, proc.stderr
    assert place["victim"].read_text() == "root's file\n"
    assert not (mine / "llmgw-store-gc.timer").is_symlink()
    assert sorted(p.name for p in mine.iterdir()) == ["llmgw-store-gc.service", "llmgw-store-gc.timer"]
