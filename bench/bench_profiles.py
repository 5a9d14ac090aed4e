"""Benchmark the profile hot paths — `activate`, `rollback`, `list`, `info` — against what a user
would compare them with, side by side (bench/harness.py: alternating fresh processes, medians,
median of per-round ratios, load, peak RSS, CPU).

Two small environments A and B are built from a package index on 127.0.0.1 (offline) and profile
`p` is set to A (generation 1). Then, each in its own alternating comparison:
  activate   `llmgw-store activate p B` from A (a new generation every run; the untimed preparation
             rolls back to A first when a rotation left the profile at B), against the same
             interpreter's bare start (`python -c pass`, and `python -I -S -c pass` beside it) and
             Nix's `nix-env -p PROFILE --set PATH` (a new generation of a Nix profile every run);
  rollback   `llmgw-store rollback p --to 1` from B, against the same bare starts and
             `nix-env -p PROFILE --switch-generation 1`;
  list, info, env, generations, config
             `llmgw-store list`, `info p`, `env p`, `generations p`, `config`, against the bare start.
Each store run is checked (the profile link points where it should). Nix is Debian's `nix-bin` (as
root it writes /nix/store); without it the Nix rows are skipped and the document says so.
These are hot-path rows: from an editable install they are refused (or, with --allow-editable and
in --quick, flagged), and every row names the interpreter it measured.

    python bench/bench_profiles.py [--rounds 15] [--out DIR]        # full run (a regular install)
    python bench/bench_profiles.py --quick --out DIR                   # what the test suite runs
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import PY, cli, packages, store_json, uv_bin
from harness import Bench, BenchError, Side, add_common_args


def nix_profile(bench: Bench, rounds: int) -> tuple[Path, str, list[str]] | None:
    """A Nix profile at generation 1 (path A) and enough distinct store paths B_i that every timed
    `--set` makes a new generation; None (with a note) where Nix cannot be used here."""
    if not (shutil.which("nix-env") and shutil.which("nix-store")):
        bench.note("nix-env not installed (Debian: apt-get install nix-bin): the Nix rows are skipped")
        return None
    d = bench.work / "nix"
    paths = []
    for i in range(2 * rounds + 8):
        src = d / "src" / f"llmgw-bench-{i}"
        src.mkdir(parents=True)
        (src / "f").write_text(f"{os.getpid()} {i}\n")
        proc = subprocess.run(["nix-store", "--add", str(src)], capture_output=True, text=True)
        if proc.returncode != 0:
            bench.note(f"nix-store --add failed ({proc.stderr.strip()[-200:]}): the Nix rows are skipped")
            return None
        paths.append(proc.stdout.strip())
    prof = d / "profile"
    subprocess.run(["nix-env", "-p", str(prof), "--set", paths[0]], check=True, capture_output=True)
    version = subprocess.run(["nix-env", "--version"], capture_output=True, text=True).stdout.split()[-1]
    return prof, version, paths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(ap, rounds=15)
    args = ap.parse_args()
    with Bench("profiles", args) as bench:
        flag = bench.hot_path()
        root = bench.work / "root"
        with packages(bench.work, bench.quick) as pk:  # the tiny recipe, offline
            paths = [store_json(bench.meter, root, "build", pk.recipe, *pk.index_args, "--uv", uv_bin(),
                                "--as-of", as_of)[0]["path"] for as_of in ("2024-02-02", "2024-06-02")]
        a, b = paths
        assert a != b, "the two builds gave one path"
        subprocess.run(cli(root, "activate", "p", a), check=True, capture_output=True)
        link = root / "profiles" / "p"

        def at(want: str) -> bool:
            return os.path.realpath(link) == want

        def checked(want: str):
            def after(_i, _run):
                if not at(want):
                    raise BenchError(f"the profile is at {os.path.realpath(link)}, not {want}")
            return after

        def activate_argv(_i):
            if not at(a):  # untimed: back to A, so the timed run switches
                subprocess.run(cli(root, "rollback", "p", "--to", "1"), check=True, capture_output=True)
            return cli(root, "activate", "p", b)

        def rollback_argv(_i):
            if not at(b):
                subprocess.run(cli(root, "activate", "p", b), check=True, capture_output=True)
            return cli(root, "rollback", "p", "--to", "1")

        nix = nix_profile(bench, bench.rounds)
        nix_set, nix_switch = [], []
        if nix:
            prof, version, npaths = nix
            fresh = iter(npaths[1:])

            def nix_set_argv(_i):
                return ["nix-env", "-p", str(prof), "--set", next(fresh)]

            def nix_switch_argv(_i):
                if os.readlink(prof) == f"{prof.name}-1-link":  # untimed: leave generation 1 first
                    subprocess.run(["nix-env", "-p", str(prof), "--set", next(fresh)], check=True, capture_output=True)
                return ["nix-env", "-p", str(prof), "--switch-generation", "1"]

            def nix_at(gen_one: bool):
                def after(_i, _run):
                    if (os.readlink(prof) == f"{prof.name}-1-link") != gen_one:
                        raise BenchError(f"the Nix profile is at {os.readlink(prof)}")
                return after

            nix_set = [Side(f"nix-env --set (Nix {version})", nix_set_argv, after=nix_at(False))]
            nix_switch = [Side(f"nix-env --switch-generation (Nix {version})", nix_switch_argv, after=nix_at(True))]
        # issue 25's goals: <= 3x the bare start, <= 1.5x Nix's time (none against -I -S: shown beside)
        goals = [("<=", 3.0), None, ("<=", 1.5)]

        def bare_sides():
            return [Side("python -c pass", [str(PY), "-c", "pass"]),
                    Side("python -I -S -c pass", [str(PY), "-I", "-S", "-c", "pass"])]

        bench.compare("activate", Side("llmgw-store activate p B", activate_argv, after=checked(b)),
                      bare_sides() + nix_set, goal=goals, hot=True, note=flag)
        bench.compare("rollback", Side("llmgw-store rollback p --to 1", rollback_argv, after=checked(a)),
                      bare_sides() + nix_switch, goal=goals, hot=True, note=flag)
        # The reads the fast path answers (integrity/reads.py): <= 3x the bare start each.
        for what, argv in (("list", cli(root, "list")), ("info", cli(root, "info", "p")),
                           ("env", cli(root, "env", "p")), ("generations", cli(root, "generations", "p")),
                           ("config", cli(root, "config"))):
            bench.compare(what, Side(f"llmgw-store {what}", argv), bare_sides()[:1], goal=[("<=", 3.0)], hot=True,
                          note=flag)
        bench.finish()


if __name__ == "__main__":
    main()
