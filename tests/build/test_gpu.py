"""Which build fits the host, and the GPU check. No GPU here: a stand-in nvidia-smi (a script that
prints what the real one prints) and driver file describe the hardware to the real code."""

from __future__ import annotations

import json
import sqlite3

import pytest

from llmgw_store.base.errors import UsageError
from llmgw_store.build import recipe as recipes
from llmgw_store.build.gpu import GPU, Host, choose
from tests.conftest import PYTHON, run_cli

MULTI = """
[engine]
name = "tinyengine"
binary = "tinyengine"

[[build]]
variant = "cu130"
python = "{python}"
requirements = ["tinyengine=={{version}}"]
min_compute_capability = 7.5
{gpu_check}

[[build]]
variant = "legacy"
python = "{python}"
version = "1.0"
requirements = ["tinyengine=={{version}}"]
min_compute_capability = 6.0
max_compute_capability = 7.0

[[build]]
variant = "cpu"
python = "{python}"
requirements = ["tinyengine=={{version}}"]
"""


def _recipe(tmp_path, gpu_check=""):
    f = tmp_path / "multi.toml"
    f.write_text(MULTI.format(python=PYTHON, gpu_check=gpu_check))
    return f


def test_choose_by_compute_capability(tmp_path):
    r = recipes.load(_recipe(tmp_path))
    h100 = Host("NVIDIA driver 560", [GPU(0, "H100", 9.0), GPU(1, "H100", 9.0)])
    p100 = Host("NVIDIA driver 535", [GPU(0, "Tesla P100", 6.0)])
    assert choose(r, None, h100)[0].variant == "cu130"
    b, why = choose(r, None, p100)
    assert b.variant == "legacy" and why == "GPU 0 (Tesla P100) has compute capability 6, within 6.0..7.0"
    b, why = choose(r, None, Host(None))
    assert b.variant == "cpu" and why == "no NVIDIA GPU found"
    assert choose(r, "legacy", h100) == (r.build_for("legacy"), "--variant legacy")
    # a mixed node: the lowest card decides
    assert choose(r, None, Host("d", [GPU(0, "H100", 9.0), GPU(1, "T4", 6.5)]))[0].variant == "legacy"
    with pytest.raises(UsageError, match="no build supports compute capability 5"):
        choose(r, None, Host("d", [GPU(0, "K80", 5.0)]))


def fake_smi(tmp_path, line: str):
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\necho '{line}'\n")
    smi.chmod(0o755)
    return smi


def test_cli_says_which_build_it_chose_and_why(tmp_path, index, uv_bin):
    smi = fake_smi(tmp_path, "0, Tesla P100-PCIE-16GB, 6.0, 535.183.01")
    proc = run_cli(tmp_path / "root", "--json", "build", str(_recipe(tmp_path)), "--index-url", index.url, "--uv", str(uv_bin),
                   env={"LLMGW_STORE_NVIDIA_SMI": str(smi), "LLMGW_STORE_NVIDIA_PROC": str(tmp_path / "none")})
    assert proc.returncode == 0, proc.stderr
    assert "chose build 'legacy': GPU 0 (Tesla P100-PCIE-16GB) has compute capability 6, within 6.0..7.0" in proc.stderr
    assert json.loads(proc.stdout)["variant"] == "legacy"


def test_gpu_check_runs_where_a_driver_is_present_and_refuses_a_failing_build(tmp_path, index, uv_bin):
    driver = tmp_path / "version"
    driver.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  560.35.03\n")
    smi = fake_smi(tmp_path, "0, NVIDIA H100 80GB HBM3, 9.0, 560.35.03")
    root = tmp_path / "root"
    proc = run_cli(root, "build", str(_recipe(tmp_path, "gpu_check = true")), "--index-url", index.url, "--uv", str(uv_bin),
                   env={"LLMGW_STORE_NVIDIA_SMI": str(smi), "LLMGW_STORE_NVIDIA_PROC": str(driver)})
    # the environment has no torch: the probe fails, and nothing is registered
    assert proc.returncode == 1 and "GPU check failed: cannot import torch" in proc.stderr, proc.stderr
    assert [p.name for p in (root / "store").iterdir() if p.name != ".wheels"] == []  # the wheel home stays
    assert sqlite3.connect(root / "var" / "db.sqlite").execute("SELECT outcome FROM builds").fetchall() == [("failed",)]


def test_gpu_check_is_skipped_without_a_driver(tmp_path, index, uv_bin):
    proc = run_cli(tmp_path / "root", "build", str(_recipe(tmp_path, "gpu_check = true")), "--variant", "cu130",
                   "--index-url", index.url, "--uv", str(uv_bin), env={"LLMGW_STORE_NVIDIA_PROC": str(tmp_path / "none")})
    assert proc.returncode == 0, proc.stderr
    assert "no NVIDIA driver on this host: GPU check skipped" in proc.stderr
