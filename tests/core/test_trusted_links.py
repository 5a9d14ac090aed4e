"""A link among the components of a path the store writes to outside its root (a Prometheus
textfile, keygen --out) or reads its config from is followed only when the directory holding it is
trusted (root's or the store owner's, not writable by others unless sticky: system/files.untrusted).
Attacked by a real second user who owns a directory on the way; the positive cases beside each
(a link in root's directory, /var/run -> /run) still work."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.conftest import cli_cmd
from tests.support.users import as_user, second_user, shared_dir


@pytest.fixture(scope="module")
def intruder():
    yield from second_user("llmgwtl")


@pytest.fixture
def place(intruder):
    """exp/ (the intruder's, as a home or an exporter's directory), victimdir/ (root's, 0755: as
    /etc/cron.d), an empty store; and exp/l -> the shared directory, planted by the intruder."""
    d = shared_dir()
    exp, victim = d / "exp", d / "victimdir"
    exp.mkdir()
    victim.mkdir()
    victim.chmod(0o755)
    os.chown(exp, intruder.pw_uid, intruder.pw_gid)
    as_user(intruder, "import os, sys; os.symlink(sys.argv[1], sys.argv[2])", str(d), str(exp / "l"))
    root = d / "root"
    from llmgw_store.core.local_store import Store

    Store.open(root, create=True).close()
    yield {"dir": d, "exp": exp, "victim": victim, "root": root}
    shutil.rmtree(d, ignore_errors=True)


def cli(root: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(cli_cmd(root, *args), capture_output=True, text=True, timeout=120,
                          env={**os.environ, "LLMGW_STORE_CONFIG": "", **(env or {})})


def test_a_link_in_another_users_directory_is_not_followed_to_write(place):
    through = place["exp"] / "l" / "victimdir"
    proc = cli(place["root"], "stats", "--prometheus", str(through / "m.prom"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "symbolic link" in proc.stderr, proc.stderr
    proc = cli(place["root"], "keygen", "k9", "--out", str(through))
    assert proc.returncode == 2 and "symbolic link" in proc.stderr, proc.stderr
    assert list(place["victim"].iterdir()) == []


def test_a_link_in_roots_directory_is_followed(place):
    mine = place["dir"] / "mine"
    mine.mkdir()
    (mine / "l").symlink_to(place["dir"])
    proc = cli(place["root"], "stats", "--prometheus", str(mine / "l" / "victimdir" / "m.prom"))
    assert proc.returncode == 0, proc.stderr
    proc = cli(place["root"], "keygen", "k9", "--out", str(mine / "l" / "victimdir"))
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in place["victim"].iterdir()) == ["k9.public", "k9.secret", "m.prom"]


def test_system_links_such_as_var_run_still_work(place):
    if not os.path.islink("/var/run") or not os.path.isdir("/run"):
        pytest.skip("/var/run is not a link to /run here")
    d = Path(tempfile.mkdtemp(prefix="llmgw-tl-", dir="/run"))
    try:
        proc = cli(place["root"], "stats", "--prometheus", f"/var/run/{d.name}/m.prom")
        assert proc.returncode == 0, proc.stderr
        assert (d / "m.prom").read_text().startswith("#")
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_a_config_file_reached_through_a_link_in_another_users_directory_is_refused(intruder, place):
    etc = place["dir"] / "etc"
    etc.mkdir()
    conf = etc / "config.toml"
    conf.write_text("lock_timeout = 7\n")
    as_user(intruder, "import os, sys; os.symlink(sys.argv[1], sys.argv[2])", str(conf), str(place["exp"] / "cfg.toml"))
    proc = cli(place["root"], "config", env={"LLMGW_STORE_CONFIG": str(place["exp"] / "cfg.toml")})
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"owned by uid {intruder.pw_uid}" in proc.stderr, proc.stderr
    # The same file through a link in root's own directory is read.
    (etc / "cfg.toml").symlink_to(conf)
    proc = cli(place["root"], "--json", "config", env={"LLMGW_STORE_CONFIG": str(etc / "cfg.toml")})
    assert proc.returncode == 0, proc.stderr
    assert '"lock_timeout"' in proc.stdout and "7" in proc.stdout
