"""Every bench keeps running (issue 28): each one's quick mode runs here, offline, and its result
document must hold every row it promises, each with a figure and a ratio (bench/follow_figures.py's
quick mode too: every side it reports). The seven quick runs start
together (one module fixture) and each test waits for its own, so they take about the time of the
longest. Figures are never asserted: a quick run's numbers are not the record (bench/README.md).

The harness's own measures are checked against what they once got wrong: the peak RSS of a
command started by a bench that has touched 600 MiB (wait4 from that bench reported 614 MiB for
`rm -rf`), and CPU seconds of a child nobody waits for (wait4 does not count it).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.support.delta import delta_wheels, template, world  # noqa: F401  (fixtures)

BENCH = REPO / "bench"
sys.path.insert(0, str(BENCH))

import harness  # noqa: E402

PY = sys.executable
HAVE_NIX = bool(shutil.which("nix-env") and shutil.which("nix-store"))

# bench -> (argv, the rows its quick mode must produce)
BENCHES = {
    "profiles": ([PY, BENCH / "bench_profiles.py"], [
        "activate vs python -c pass", "activate vs python -I -S -c pass",
        *(["activate vs nix-env --set"] if HAVE_NIX else []),
        "rollback vs python -c pass", "rollback vs python -I -S -c pass",
        *(["rollback vs nix-env --switch-generation"] if HAVE_NIX else []),
        "list vs python -c pass", "info vs python -c pass", "env vs python -c pass",
        "generations vs python -c pass", "config vs python -c pass"]),
    "gc": ([PY, BENCH / "bench_gc.py"], [
        "gc of 2 dead environments vs chmod -R u+w + rm -rf", "gc --dry-run, 20 paths vs 2 paths",
        "generations, 30 generations vs 10", "gc --dry-run, 30 generations vs 10",
        "gc --dry-run, 30 stale temp-roots files vs none"]),
    "integrity": ([PY, BENCH / "bench_integrity.py"], [
        "verify vs b3sum" if shutil.which("b3sum") else "verify vs blake3 pass in python",
        "second version beside the first: disk it adds vs its size"]),
    "fleet": ([PY, BENCH / "bench_fleet.py"], [
        "pull vs curl | zstd -d | tar -x", "pull (format 1) vs curl | zstd -d | tar -x", "push vs tar -c | zstd",
        "cold build vs pull", "delta pull of the neighbour"]),
    "build": ([PY, BENCH / "bench_build.py"], [
        "cache-hit build vs python -c pass", "cache-hit build vs python -I -S -c pass",
        "cold build, warm uv cache vs the seed's commands", "cold build, empty caches vs the seed's commands",
        "disk: one environment + all the store keeps for it after the default gc",
        "disk: per-root fixed costs"]),
    "vllm": (["bash", BENCH / "bench_vllm.sh"], [
        "cold build, warm uv cache vs the seed's commands",
        "disk: one environment + all the store keeps for it after the default gc", "disk: per-root fixed costs",
        "neighbour (--as-of 2024-06-02): disk it adds vs its size",
        "neighbour (--as-of 2024-06-02): its bytecode step vs the first build's"]),
}


# bench/follow_figures.py (issue 35's figures) is a pytest module on the tests' fixtures, not a
# harness bench: its quick mode (MEASURE_QUICK=1) runs beside the others, in a pytest of its own,
# measuring the llmgw-store installed beside this interpreter. The sides it must report:
FOLLOW_SIDES = ["hit", "follow-file-after", "follow-nginx-after", "switching-follow-nginx", "push-roots-nginx"]


# bench -> the rows that measure an environment: each must name the built one it measured (issue 33:
# a bench's record on a generated tree or empty directories is not what a user runs)
ON_BUILT = {
    "gc": ["gc of 2 dead environments", "gc --dry-run, 20 paths vs 2 paths"],
    "integrity": ["verify vs"],
    "build": ["disk: one environment", "disk: per-root fixed costs"],
    "vllm": ["disk: one environment", "disk: per-root fixed costs"],
}


class QuickRuns:
    """The benches' quick runs, started together; `result(name)` waits for one."""

    def __init__(self, out: Path) -> None:
        self.out = out
        env = {k: v for k, v in os.environ.items() if k not in ("LLMGW_STORE_ROOT", "LLMGW_STORE_UV")}
        env.update(LLMGW_STORE_PYTHON_PREFERENCE="only-system", PYTHON=PY)
        self.env = env
        self.fleet_work = out / "fleet-work"  # kept: test_pull_only_reuses_a_full_run pulls from it again
        self.procs = {
            name: subprocess.Popen([*map(str, argv), "--quick", "--out", str(out / name),
                                    *(["--work", str(self.fleet_work)] if name == "fleet" else [])],
                                   cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   start_new_session=True)
            for name, (argv, _) in BENCHES.items()
        }
        follow = out / "follow"
        follow.mkdir()
        self.procs["follow"] = subprocess.Popen(
            [PY, "-m", "pytest", str(BENCH / "follow_figures.py"), "-q", "-p", "no:cacheprovider", "-n", "0"],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
            env={**env, "MEASURE_QUICK": "1", "MEASURE_OUT": str(follow / "follow.json"),
                 "MEASURE_EXES": f"after={Path(PY).with_name('llmgw-store')}"})

    def result(self, name: str) -> tuple[dict, str]:
        proc = self.procs[name]
        stdout, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"bench {name} --quick exited {proc.returncode}:\n{stderr[-4000:]}"
        return json.loads((self.out / name / f"{name}.json").read_text()), stdout

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
        subprocess.run(["chmod", "-R", "u+w", str(self.fleet_work)], check=False, capture_output=True)
        shutil.rmtree(self.fleet_work, ignore_errors=True)


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    runs = QuickRuns(tmp_path_factory.mktemp("bench-quick"))
    yield runs
    runs.stop()


def test_follow_figures_quick_mode_gives_every_side(quick):
    proc = quick.procs["follow"]
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, f"follow_figures quick run exited {proc.returncode}:\n{stdout[-4000:]}{stderr[-2000:]}"
    if " skipped" in stdout and not (quick.out / "follow" / "follow.json").exists():
        pytest.skip(f"follow_figures skipped itself: {stdout.strip().splitlines()[-1]}")
    doc = json.loads((quick.out / "follow" / "follow.json").read_text())
    assert doc["quick"] is True and doc["rounds"] == 2 and doc["switch_rounds"] == 2
    assert sorted(doc["results"]) == sorted(FOLLOW_SIDES)
    for side, fig in doc["results"].items():
        assert fig["n"] == (2 if side in ("switching-follow-nginx", "push-roots-nginx") else doc["rounds"]), side
        assert number(fig["wall_median"]) and fig["wall_median"] > 0, side
        assert number(fig["cpu_median"]) and fig["cpu_median"] >= 0, side
    assert all(n > 0 for n in doc["imports"].values()) and set(doc["imports"]) == {"hit", *FOLLOW_SIDES[1:3]}


def number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


@pytest.mark.parametrize("name", list(BENCHES))
def test_quick_mode_gives_every_row(quick, name):
    doc, stdout = quick.result(name)
    want = BENCHES[name][1]
    if any("the Nix rows are skipped" in n for n in doc["notes"]):  # installed, but unusable here: said so
        want = [w for w in want if "nix-env" not in w]
    rows = doc["rows"]
    for prefix in want:
        assert any(r["row"].startswith(prefix) for r in rows), f"{name}: no {prefix!r} in {[r['row'] for r in rows]}"
    for r in rows:
        assert number(r["figure"]) and r["figure"] >= 0, r
        assert number(r["baseline_figure"]) and r["baseline_figure"] > 0, r
        assert number(r["ratio"]) and r["ratio"] >= 0, r
        assert len(r["load"]) == 2 and all(number(x) for x in r["load"]), r
        if "subject" in r:  # a timed row: both sides measured in every round
            for side in (r["subject"], r["against"]):
                assert len(side["runs_s"]) == r["rounds"] >= 2, r
                assert number(side["wall_s"]) and side["wall_s"] > 0, r
                if doc["host"]["launcher"].startswith(("bench/launch.c", "GNU time")):
                    assert number(side["rss_mib"]) and side["rss_mib"] > 0, r
                if doc["host"]["cpu_accounting"].startswith("cgroup"):
                    assert number(side["cpu_s"]), r
    assert doc["quick"] is True and doc["host"]["work_fs"] != "unknown"
    assert doc["host"]["python"] == PY and doc["host"]["install"] in ("editable", "regular")
    for r in rows:  # the table a note quotes has each row
        assert r["row"].replace("|", "\\|") in stdout


@pytest.mark.parametrize("name", list(ON_BUILT))
def test_rows_on_environments_name_the_built_one(quick, name):
    doc, _ = quick.result(name)
    for prefix in ON_BUILT[name]:
        rows = [r for r in doc["rows"] if r["row"].startswith(prefix)]
        assert rows, f"{name}: no {prefix!r}"
        for r in rows:
            assert re.fullmatch(r"[0-9a-z]{32}-[A-Za-z0-9._+-]+", r.get("built") or ""), r
            assert "-benchtree-" not in r["built"], r  # the generated tree's name


def test_hot_path_rows_name_their_interpreter_and_flag_an_editable_install(quick):
    doc, _ = quick.result("profiles")
    for r in doc["rows"]:
        assert r["interpreter"] == PY and r["install"] == doc["host"]["install"]
        assert ("flag" in r) == (doc["host"]["install"] != "regular"), r


def test_fleet_says_what_served_the_pull(quick):
    doc, _ = quick.result("fleet")
    served = [n for n in doc["notes"] if n.startswith("served by")]
    assert served and ("nginx" in served[0]) == bool(shutil.which("nginx") or os.access("/usr/sbin/nginx", os.X_OK))


def test_pull_only_reuses_a_full_run(quick, tmp_path):
    """--pull-only after a full run in the same --work (issue 28's done-when): the fixture's fleet
    run (a quick one) kept its --work."""
    quick.result("fleet")
    again = subprocess.run([PY, BENCH / "bench_fleet.py", "--quick", "--pull-only", "--work", quick.fleet_work,
                            "--out", tmp_path], capture_output=True, text=True, env=quick.env, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    rows = json.loads((tmp_path / "fleet-pull.json").read_text())["rows"]
    assert [r["row"] for r in rows] == ["pull vs curl | zstd -d | tar -x", "pull (format 1) vs curl | zstd -d | tar -x"]
    assert all(number(r["ratio"]) for r in rows)


def test_hot_path_bench_refuses_an_editable_install_outside_quick(tmp_path):
    if harness.install_kind() != "editable":
        pytest.skip("this interpreter's llmgw-store is not an editable install")
    proc = subprocess.run([PY, BENCH / "bench_profiles.py", "--out", tmp_path], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1
    assert "installed editable" in proc.stderr and "--allow-editable" in proc.stderr
    assert not (tmp_path / "profiles.json").exists()


# --- the harness's measures ------------------------------------------------------------------

def _fat_parent_measure(launcher: str) -> str:
    """A bench process that has touched 600 MiB measures `rm -rf` of nothing: the figure printed."""
    code = (f"import sys; sys.path.insert(0, {str(BENCH)!r}); import harness\n"
            "big = bytearray(600 << 20)\n"
            "for i in range(0, len(big), 4096): big[i] = 1\n"
            f"m = harness.Meter({launcher!r})\n"
            "try:\n    print(m.run(['rm', '-rf', '/nonexistent-llmgw-bench']).rss_mib)\nfinally:\n    m.close()\n")
    return subprocess.run([PY, "-c", code], capture_output=True, text=True, check=True, timeout=120).stdout.strip()


@pytest.mark.parametrize("launcher", ["c", "time"])
def test_peak_rss_is_the_commands_own_not_the_benchs(launcher):
    if launcher == "c" and not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler")
    if launcher == "time" and harness._gnu_time() is None:
        pytest.skip("no GNU time")
    rss = float(_fat_parent_measure(launcher))
    assert 0 < rss < 3, f"rm -rf measured at {rss} MiB from a 600 MiB bench"


def test_without_a_launcher_no_peak_rss_is_claimed():
    assert _fat_parent_measure("none") == "None"


def test_cpu_seconds_count_a_child_nobody_waits_for():
    meter = harness.Meter()
    try:
        if meter.cgroup is None:
            pytest.skip(f"no cgroup here: {meter.cpu_accounting}")
        # the shell starts a child that spins for 0.3 s of its own CPU and exits without waiting for it
        spin = f"{PY} -c 'import time\nwhile time.process_time() < 0.3: pass' &"
        run = meter.run(["/bin/sh", "-c", spin])
    finally:
        meter.close()
    assert run.cpu_waited_s < 0.3 <= run.cpu_s
    assert run.stragglers_killed == 0


def test_a_failed_command_is_one_error_naming_it():
    meter = harness.Meter()
    try:
        with pytest.raises(SystemExit, match="exit 3: /bin/sh -c"):
            meter.run(["/bin/sh", "-c", "echo boom >&2; exit 3"])
        assert meter.run(["/bin/sh", "-c", "exit 3"], check=False).code == 3
    finally:
        meter.close()


def test_pull_figures_runs_on_a_pushed_environment(world, tmp_path):
    """bench/pull_figures.py (issue 33's pull row from the documented nginx) on a tiny pushed
    environment, one round: both sides run and every figure of the row is there, so the script
    the record cites does not rot."""
    from tests.support.nginx import NGINX

    if NGINX is None:
        pytest.skip("nginx is not installed (apt-get install nginx)")
    from tests.conftest import run_cli

    name, keys = world["names"][0], world["keys"]
    cache, v1 = tmp_path / "cache", tmp_path / "v1"
    for where, fmt in ((cache, "2"), (v1, "1")):
        run_cli(world["root"], "push", name, "--to", f"file://{where}", "--format", fmt, "--secret-key",
                str(keys / "builder-1.secret"), check=True)
    archive = next(v1.rglob("*.tar.zst"))
    out = tmp_path / "pull.json"
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "pull_figures.py"),
                           "--cli", str(Path(sys.executable).with_name("llmgw-store")), "--cache", str(cache),
                           "--archive", str(archive), "--key", name[:32], "--trusted-key",
                           str(keys / "builder-1.public"), "--work", str(tmp_path / "work"), "--rounds", "1",
                           "--json", str(out)], capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert set(doc["medians"]) == {"pull", "pipe"}
    assert all(doc["medians"][k]["wall_s"] > 0 and doc["medians"][k]["cpu_s"] > 0 for k in ("pull", "pipe"))
    assert doc["wall_ratio"] > 0 and doc["cpu_ratio"] > 0 and doc["rss_ratio"] > 0
