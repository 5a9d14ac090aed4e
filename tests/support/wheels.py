"""Build small but real wheels (PEP 427) for the test index: a package, its metadata, its RECORD."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

ZIP_TIME = (2024, 1, 1, 0, 0, 0)


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_wheel(
    dest: Path,
    name: str,
    version: str,
    *,
    requires: tuple[str, ...] = (),
    scripts: dict[str, str] | None = None,
    extra_files: dict[str, bytes] | None = None,
    data_scripts: dict[str, Path] | None = None,
    tag: str = "py3-none-any",
) -> Path:
    """A wheel for `name` whose module prints its name and version (and its dependencies') when run.
    `scripts` maps console-script names to `module:function`; `data_scripts` puts files (such as a
    real binary) under `<name>-<version>.data/scripts/`."""
    pkg = name.replace("-", "_")
    dist_info = f"{pkg}-{version}.dist-info"
    deps = [r.split("<")[0].split(">")[0].split("=")[0].strip().replace("-", "_") for r in requires]
    module = (
        f'__version__ = "{version}"\n\n'
        "def main():\n"
        "    from importlib.metadata import version\n"
        f'    parts = ["{name} " + __version__]\n'
        f"    for dep in {deps!r}:\n"
        '        parts.append(dep + " " + version(dep))\n'
        '    print(" ".join(parts))\n'
    ).encode()
    files: dict[str, bytes] = {f"{pkg}/__init__.py": module}
    files.update(extra_files or {})
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    meta += [f"Requires-Dist: {r}" for r in requires]
    files[f"{dist_info}/METADATA"] = ("\n".join(meta) + "\n").encode()
    files[f"{dist_info}/WHEEL"] = (
        f"Wheel-Version: 1.0\nGenerator: llmgw-store-tests\nRoot-Is-Purelib: true\nTag: {tag}\n"
    ).encode()
    if scripts:
        files[f"{dist_info}/entry_points.txt"] = (
            "[console_scripts]\n" + "".join(f"{k} = {v}\n" for k, v in scripts.items())
        ).encode()
    big: dict[str, Path] = {f"{pkg}-{version}.data/scripts/{k}": v for k, v in (data_scripts or {}).items()}
    record = [f"{path},{_record_hash(data)},{len(data)}" for path, data in files.items()]
    for path, src in big.items():
        record.append(f"{path},{_record_hash(src.read_bytes())},{src.stat().st_size}")
    record.append(f"{dist_info}/RECORD,,")
    files[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()

    dest.mkdir(parents=True, exist_ok=True)
    out = dest / f"{pkg}-{version}-{tag}.whl"
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for path, data in files.items():
            zf.writestr(zipfile.ZipInfo(path, ZIP_TIME), data)
        for path, src in big.items():
            info = zipfile.ZipInfo(path, ZIP_TIME)
            info.external_attr = 0o755 << 16
            with open(src, "rb") as f:
                zf.writestr(info, f.read(), compress_type=zipfile.ZIP_STORED)
    return out
