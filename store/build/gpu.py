"""The host's NVIDIA driver and GPUs, which build of a recipe fits them, and the CUDA probe.

Driver: `/proc/driver/nvidia/version` or `nvidia-smi`. GPUs and their compute capability:
`nvidia-smi --query-gpu=index,name,compute_cap,driver_version --format=csv,noheader`. Both paths
can be pointed elsewhere (`LLMGW_STORE_NVIDIA_PROC`, `LLMGW_STORE_NVIDIA_SMI`), which is how the
tests stand in for hardware this machine does not have.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from llmgw_store.base.errors import UsageError
from llmgw_store.build.recipe import Build, Recipe


@dataclass(frozen=True)
class GPU:
    index: int
    name: str
    capability: float


@dataclass(frozen=True)
class Host:
    driver: str | None
    gpus: list[GPU] = field(default_factory=list)

    @property
    def capability(self) -> float | None:
        """The lowest compute capability among the GPUs: a build must run on every one."""
        return min((g.capability for g in self.gpus), default=None)


def probe_host() -> Host:
    import shutil

    proc = Path(os.environ.get("LLMGW_STORE_NVIDIA_PROC", "/proc/driver/nvidia/version"))
    driver = None
    try:
        driver = proc.read_text().splitlines()[0].strip() or None
    except (OSError, IndexError):
        pass
    smi = os.environ.get("LLMGW_STORE_NVIDIA_SMI") or shutil.which("nvidia-smi")
    gpus: list[GPU] = []
    if smi and (driver or os.environ.get("LLMGW_STORE_NVIDIA_SMI")):
        from llmgw_store.supervise import procs

        try:  # through procs, like every child: it dies with the store, whatever ends it
            done = procs.run([smi, "--query-gpu=index,name,compute_cap,driver_version", "--format=csv,noheader"],
                             env=dict(os.environ), timeout=30)
            out = "" if done.timed_out or done.returncode != 0 else done.output
        except OSError:
            out = ""
        for line in out.splitlines():
            parts = [p.strip() for p in line.split(",")]
            if len(parts) >= 3:
                try:
                    gpus.append(GPU(int(parts[0]), parts[1], float(parts[2])))
                except ValueError:
                    continue
                if driver is None and len(parts) >= 4:
                    driver = f"NVIDIA driver {parts[3]}"
    return Host(driver, gpus)


def _bounds(b: Build) -> tuple[float | None, float | None]:
    lo, hi = b.fields.get("min_compute_capability"), b.fields.get("max_compute_capability")
    return (float(lo) if lo is not None else None, float(hi) if hi is not None else None)


def choose(recipe: Recipe, variant: str | None, host: Host) -> tuple[Build, str]:
    """The build for this host, and a sentence saying why."""
    if variant is not None:
        return recipe.build_for(variant), f"--variant {variant}"
    if len(recipe.builds) == 1:
        return recipe.builds[0], "the recipe's only build"
    cc = host.capability
    if cc is None:
        plain = [b for b in recipe.builds if _bounds(b) == (None, None) and not b.fields.get("gpu_check")]
        chosen = plain[0] if plain else recipe.builds[0]
        why = "no NVIDIA GPU found" + ("" if plain else "; no CPU build in the recipe, so its first build")
        return chosen, why
    gpu = min(host.gpus, key=lambda g: g.capability)
    bounded = [b for b in recipe.builds if _bounds(b) != (None, None)]
    if not bounded:
        return recipe.builds[0], f"GPU {gpu.index} ({gpu.name}); the recipe's builds name no compute capability"
    for b in bounded:
        lo, hi = _bounds(b)
        if (lo is None or lo <= cc) and (hi is None or cc <= hi):
            span = f"{lo if lo is not None else '…'}..{hi if hi is not None else '…'}"
            return b, f"GPU {gpu.index} ({gpu.name}) has compute capability {cc:g}, within {span}"
    # A GPU no GPU build supports is an error, not a silent fall back to a CPU build.
    have = "; ".join(f"{b.variant} {_bounds(b)[0] or '…'}..{_bounds(b)[1] or '…'}" for b in bounded)
    raise UsageError(f"{recipe.file}: no build supports compute capability {cc:g} of GPU {gpu.index} ({gpu.name}) "
                     f"(builds: {have}); pick one with --variant, or add a build with a fixed older version")


PROBE = r"""
import sys
try:
    import torch
except Exception as exc:
    sys.exit(f"cannot import torch: {exc}")
if not torch.cuda.is_available():
    sys.exit(f"torch {torch.__version__} sees no CUDA device (built for CUDA {torch.version.cuda})")
cap = torch.cuda.get_device_capability(0)
try:
    value = (torch.ones(8, device="cuda") * 2).sum().item()
except Exception as exc:
    sys.exit(f"a CUDA kernel failed on compute capability {cap[0]}.{cap[1]} (torch archs {torch.cuda.get_arch_list()}): {exc}")
print(f"torch {torch.__version__} CUDA {torch.version.cuda} on {torch.cuda.get_device_name(0)} sm_{cap[0]}{cap[1]}: ok")
"""


def kernel_hint(output: str, host: Host) -> str:
    """The seed's hint when a build has no kernels for the card."""
    if "no kernel image is available" in output or "a CUDA kernel failed" in output:
        return (f" — this build has no kernels for compute capability {host.capability:g}: pick a build for this GPU "
                "with --variant, or one with a fixed older version that still supports it")
    return ""
