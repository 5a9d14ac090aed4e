"""Fetching what a build needs besides packages: source archives and GitHub-style release assets.

Nothing unverified is installed: a source archive is checked against the recipe's sha256, a
release asset against the digest the release API publishes for it (an asset without one is
refused), and an archive is unpacked by extract.extract_tar with policy "inside" (no absolute
paths, no `..`, no links leading out of the tree, no write through a link, no device files, bounded
bytes and members: the first such member refuses the whole archive) into a scratch directory that
is moved into the environment only when all of it unpacked.

The release API and download bases are configurable (`LLMGW_STORE_GITHUB_API`, default
https://api.github.com), so tests serve releases from 127.0.0.1.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from llmgw_store.core.errors import IntegrityError, NetworkError, RecipeError, UsageError
from llmgw_store.core.fsutil import force_rmtree
from llmgw_store.core.report import say

GITHUB_API = "https://api.github.com"


def api_base() -> str:
    return os.environ.get("LLMGW_STORE_GITHUB_API", GITHUB_API).rstrip("/")


def cached_download(url: str, sha256: str, downloads: Path) -> Path:
    """The file at `url`, checked against `sha256`, from the download cache when already there."""
    from llmgw_store.build import pypi
    from llmgw_store.core.fsutil import sha256_of

    dest = downloads / f"{sha256[:16]}-{Path(url.split('?')[0]).name or 'download'}"
    if dest.exists() and sha256_of(dest) == sha256.lower():
        return dest
    say(f"downloading {url}")
    return pypi.download(url, dest, sha256)


SOURCE_MAX_MEMBERS = 500_000  # a Linux kernel tree has about 90k
SOURCE_MAX_BYTES = 32 * 10**9  # the bound when a recipe sets no free_gb


def unpack_source(archive: Path, scratch: Path, top: str | None, recipe_file, where: str, *,
                  max_bytes: int | None = None) -> Path:
    """Unpack `archive` into `scratch` safely; return the directory `top` (default: the archive's
    single top-level directory). At most `max_bytes` of file contents (None: no bound). On a
    refused member nothing is left in `scratch`."""
    from llmgw_store.core.extract import extract_tar

    scratch.mkdir(parents=True)
    try:
        with open(archive, "rb") as f:
            extract_tar(f, scratch, policy="inside", max_bytes=max_bytes, max_members=SOURCE_MAX_MEMBERS,
                        label=archive.name)
    except BaseException:
        force_rmtree(scratch)  # read-only directories are restored only at the end; none may be left
        raise
    if top is None:
        entries = list(scratch.iterdir())
        if len(entries) != 1 or not entries[0].is_dir():
            force_rmtree(scratch)
            raise RecipeError(recipe_file, f"{where}.top", "the archive has no single top directory; name it with top")
        return entries[0]
    found = scratch / top
    if ".." in Path(top).parts or not found.is_dir():
        force_rmtree(scratch)
        raise RecipeError(recipe_file, f"{where}.top", f"the archive has no directory {top!r}")
    return found


def source_requirements(path: Path, recipe_file, where: str) -> list[str]:
    """A source's requirements file: PyPI requirement lines only. Options (-r, -e, --index-url ...),
    URLs and `name @ url` references are refused with the line named: they would bypass the index,
    --exclude-newer and the hashes."""
    from packaging.requirements import InvalidRequirement, Requirement

    out = []
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        what = f"{path.name} line {n}: {raw.strip()!r}"
        if line.startswith("-"):
            raise RecipeError(recipe_file, f"{where}.requirements", f"{what}: options are not allowed")
        if "://" in line:
            raise RecipeError(recipe_file, f"{where}.requirements", f"{what}: URLs are not allowed")
        try:
            req = Requirement(line)
        except InvalidRequirement as exc:
            raise RecipeError(recipe_file, f"{where}.requirements", f"{what}: {exc}") from None
        if req.url:
            raise RecipeError(recipe_file, f"{where}.requirements", f"{what}: direct references are not allowed")
        out.append(str(req))
    return out


def release(repo: str, tag: str) -> list[dict[str, Any]]:
    """The assets of a GitHub-style release: name, download URL, sha256 (None when unpublished)."""
    import httpx

    url = f"{api_base()}/repos/{repo}/releases/tags/{tag}"
    try:
        resp = httpx.get(url, timeout=60, follow_redirects=True, headers={"Accept": "application/vnd.github+json"})
    except httpx.HTTPError as exc:
        raise NetworkError(f"cannot reach the release API at {url}: {exc}") from exc
    if resp.status_code == 404:
        raise UsageError(f"no release {tag!r} in {repo} ({url})")
    if resp.status_code != 200:
        raise NetworkError(f"the release API answered HTTP {resp.status_code} for {url}")
    out = []
    for a in resp.json().get("assets", []):
        digest = a.get("digest") or ""
        out.append({"name": a["name"], "url": a["browser_download_url"],
                    "sha256": digest.split(":", 1)[1].lower() if digest.startswith("sha256:") else None})
    return out


def pick(assets: list[dict[str, Any]], repo: str, tag: str, *, name: str | None = None,
         prefix: str = "", suffix: str = "") -> dict[str, Any]:
    """One asset, by exact name or by prefix and suffix; refused when it has no published digest."""
    if name is not None:
        found = [a for a in assets if a["name"] == name]
    else:
        found = [a for a in assets if a["name"].startswith(prefix) and a["name"].endswith(suffix)]
    if len(found) != 1:
        what = name or f"{prefix}*{suffix}"
        have = ", ".join(a["name"] for a in assets) or "none"
        raise UsageError(f"release {tag} of {repo}: {len(found)} assets match {what!r} (it has: {have})")
    asset = found[0]
    if not asset["sha256"]:
        raise IntegrityError(f"release {tag} of {repo} publishes no sha256 digest for {asset['name']}; refusing it")
    return asset
