"""Fetching what a build needs besides packages: source archives and GitHub-style release assets.

Nothing unverified is installed: a source archive is checked against the recipe's sha256, a
release asset against the digest the release API publishes for it (an asset without one is
refused), and an archive is unpacked by extract.extract_tar with policy "inside" (no absolute
paths, no `..`, no links leading out of the tree, no write through a link, no device files, bounded
bytes and members: the first such member refuses the whole archive) into a scratch directory that
is moved into the environment only when all of it unpacked.

Nothing is written or read through a link: the environment holds links made by uv venv (bin/python
to the base interpreter, lib64 to lib) and the archive may hold links of its own, so every path
below the build directory is walked with O_NOFOLLOW (`open_dir`), files are created with O_EXCL
(`install_file`), and the source tree is moved by rename(2) between directory descriptors.

The release API and download bases are configurable (`LLMGW_STORE_GITHUB_API`, default
https://api.github.com), so tests serve releases from 127.0.0.1.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
from pathlib import Path
from typing import Any

from llmgw_store.base.errors import IntegrityError, NetworkError, RecipeError, UsageError
from llmgw_store.base.report import say
from llmgw_store.build.recipe import COMPONENT_RE, SHA256_RE
from llmgw_store.system.trees import force_rmtree

GITHUB_API = "https://api.github.com"
MAX_ASSETS = 1000  # GitHub allows 1000 assets per release
# RFC 3986 characters only: no space or newline (it becomes a requirement line), no `#` (the
# digest is appended as the fragment).
URL_RE = re.compile(r"https?://[A-Za-z0-9._~:/?\[\]@!$&'()*+,;=%-]+")


def api_base() -> str:
    return os.environ.get("LLMGW_STORE_GITHUB_API", GITHUB_API).rstrip("/")


def cached_download(url: str, sha256: str, downloads: Path) -> Path:
    """The file at `url`, checked against `sha256`, from the download cache when already there."""
    from llmgw_store.build import pypi
    from llmgw_store.system.trees import sha256_of

    if not SHA256_RE.fullmatch(sha256):  # it names the cached file, so it is checked before any path is made of it
        raise IntegrityError(f"{url}: {sha256!r} is not a sha256 digest; refusing it")
    tail = url.split("?")[0].rsplit("/", 1)[-1]
    dest = downloads / f"{sha256[:16]}-{tail if COMPONENT_RE.fullmatch(tail) else 'download'}"
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
    from llmgw_store.system.extract import extract_tar

    scratch.mkdir(parents=True)
    try:
        with open(archive, "rb") as f:
            # `top` alone moves into the environment: a link under it must stay under it.
            extract_tar(f, scratch, policy="inside", max_bytes=max_bytes, max_members=SOURCE_MAX_MEMBERS,
                        link_root=top, label=archive.name)
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


# A source's requirements file is a list of package lines: anything bigger is not one.
MAX_REQUIREMENTS_BYTES = 1 << 20
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def open_dir(base: Path, rel: str, *, create: bool = False) -> int:
    """A descriptor of the directory `base/rel`, reached one component at a time with O_NOFOLLOW
    relative to the last: a symbolic link or a non-directory anywhere below `base` raises OSError
    (ELOOP, ENOTDIR) and is never followed, whoever made it (the archive, uv venv). `base` itself is
    the caller's own directory (the build's .partial, an unpack scratch). With `create`, missing
    components are made, mode 0755. The caller closes the descriptor."""
    fd = os.open(base, _DIR_FLAGS)
    try:
        for part in (rel.split("/") if rel else []):
            if create:
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass  # what is there is opened below with O_NOFOLLOW, so a link still fails
            child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def env_dir(env: Path, rel: str, recipe_file, field: str) -> int:
    """`open_dir(env, rel, create=True)` for a directory the recipe names in the environment; a link
    or a file on the way is refused with a RecipeError naming `field`."""
    try:
        return open_dir(env, rel, create=True)
    except OSError as exc:
        raise RecipeError(recipe_file, field, f"{rel!r} passes through a link or a file in the environment; "
                          f"refusing to write through it ({exc.strerror})") from None


def _split(rel: str) -> tuple[str, str]:
    parent, _, name = rel.rpartition("/")
    return parent, name


def source_requirements(tree: Path, rel: str, recipe_file, where: str) -> list[str]:
    """A source's requirements file (`tree/rel`, inside the unpacked archive): PyPI requirement lines
    only. Options (-r, -e, --index-url ...), URLs and `name @ url` references are refused with the
    line named: they would bypass the index, --exclude-newer and the hashes. The file must be a
    regular file reached without following any link (a link in the archive could name /etc/passwd or
    a file beside the source), and at most MAX_REQUIREMENTS_BYTES."""
    from packaging.requirements import InvalidRequirement, Requirement

    field = f"{where}.requirements"
    parent, name = _split(rel)
    try:
        dir_fd = open_dir(tree, parent)
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
        finally:
            os.close(dir_fd)
    except FileNotFoundError:
        raise RecipeError(recipe_file, field, f"the archive has no file {rel!r}") from None
    except OSError as exc:
        raise RecipeError(recipe_file, field, f"{rel!r} in the archive is, or passes through, a symbolic link "
                          f"or a non-directory; refusing to follow it ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise RecipeError(recipe_file, field, f"{rel!r} in the archive is not a regular file")
        data = f.read(MAX_REQUIREMENTS_BYTES + 1)
    if len(data) > MAX_REQUIREMENTS_BYTES:
        raise RecipeError(recipe_file, field, f"{rel!r} is larger than {MAX_REQUIREMENTS_BYTES} bytes; "
                          "a requirements file lists packages")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise RecipeError(recipe_file, field, f"{rel!r} is not UTF-8 text") from None
    out = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        what = f"{name} line {n}: {raw.strip()!r}"
        if line.startswith("-"):
            raise RecipeError(recipe_file, field, f"{what}: options are not allowed")
        if "://" in line:
            raise RecipeError(recipe_file, field, f"{what}: URLs are not allowed")
        try:
            req = Requirement(line)
        except InvalidRequirement as exc:
            raise RecipeError(recipe_file, field, f"{what}: {str(exc).splitlines()[0]}") from None
        if req.url:
            raise RecipeError(recipe_file, field, f"{what}: direct references are not allowed")
        out.append(str(req))
    return out


def move_tree(scratch: Path, top: str, env: Path, dest: str, recipe_file, where: str) -> None:
    """Move the unpacked directory `scratch/top` to `env/dest` (the recipe's source `dir`). Neither
    side follows a link: `top` must be a real directory of the archive, `dest`'s parents are made or
    opened with O_NOFOLLOW, and `dest` must not exist (an empty directory made here is what the
    rename replaces: rename(2) onto an empty directory is atomic, and never follows a link)."""
    top_parent, top_name = _split(top)
    parent, name = _split(dest)
    try:
        src_fd = open_dir(scratch, top_parent)
    except OSError as exc:
        raise RecipeError(recipe_file, f"{where}.top",
                          f"{top!r} passes through a link in the archive ({exc.strerror})") from None
    try:
        if not stat.S_ISDIR(os.lstat(top_name, dir_fd=src_fd).st_mode):
            raise RecipeError(recipe_file, f"{where}.top",
                              f"{top!r} in the archive is a link or a file, not a directory")
        dest_fd = env_dir(env, parent, recipe_file, f"{where}.dir")
        try:
            try:
                os.mkdir(name, 0o755, dir_fd=dest_fd)
            except FileExistsError:
                raise RecipeError(recipe_file, f"{where}.dir", f"{dest!r} already exists in the environment; "
                                  "a source never replaces what is there") from None
            os.rename(top_name, name, src_dir_fd=src_fd, dst_dir_fd=dest_fd)
        finally:
            os.close(dest_fd)
    finally:
        os.close(src_fd)


def install_file(src: Path, dir_fd: int, name: str, mode: int, shown: str, recipe_file, field: str) -> None:
    """Copy `src` to a new file `name` in the directory `dir_fd`. O_CREAT|O_EXCL|O_NOFOLLOW: an
    existing file or link of that name (bin/python is a link to the base interpreter) is refused,
    never written through."""
    try:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    except FileExistsError:
        raise RecipeError(recipe_file, field, f"{shown} already exists in the environment; an asset never replaces "
                          "a file (choose another asset_dir)") from None
    with os.fdopen(fd, "wb") as out, open(src, "rb") as data:
        shutil.copyfileobj(data, out)
        os.fchmod(out.fileno(), mode)


def release(repo: str, tag: str) -> list[dict[str, Any]]:
    """The assets of a GitHub-style release: name, download URL, sha256, and the `problem` (no digest,
    a malformed one, a URL that is not plain http(s)) that makes `pick` refuse it. The answer is
    untrusted: an asset whose name is not a plain file name is dropped, and the URL, which becomes a
    requirement line, may hold no space, newline or `#`."""
    from llmgw_store.app import httpclient, network
    from llmgw_store.build import pypi

    httpx = httpclient.load()

    url = f"{api_base()}/repos/{repo}/releases/tags/{tag}"
    network.require(f"asking {url} for the assets of release {tag}")

    def get(watch):
        resp = http.get(url, headers={"Accept": "application/vnd.github+json"})
        pypi.check_transient(f"the release API (GET {url})", resp)
        return resp

    try:
        with pypi.client(netrc=False) as http:
            resp = pypi.attempted(f"the release API (GET {url})", get)
    except (NetworkError, httpx.HTTPError) as exc:
        raise NetworkError(f"cannot get an answer from the release API at {url}: {exc}") from None
    if resp.status_code == 404:
        raise UsageError(f"no release {tag!r} in {repo} ({url})")
    if resp.status_code != 200:
        raise NetworkError(f"the release API answered HTTP {resp.status_code} for {url}")
    try:
        doc = resp.json()
    except ValueError:
        raise NetworkError(f"the release API answered {url} with something that is not JSON") from None
    assets = doc.get("assets") if isinstance(doc, dict) else None
    if not isinstance(assets, list) or len(assets) > MAX_ASSETS:
        raise NetworkError(f"the release API's answer for {url} has no list of at most {MAX_ASSETS} assets")
    out = []
    for a in assets:
        a = a if isinstance(a, dict) else {}
        name, link, digest = a.get("name"), a.get("browser_download_url"), a.get("digest")
        if not (isinstance(name, str) and COMPONENT_RE.fullmatch(name)):
            continue  # no recipe can name it (names are plain file names), so it is never picked or shown
        sha = digest[7:].lower() if isinstance(digest, str) and digest.startswith("sha256:") else None
        problem = None
        if not (isinstance(link, str) and URL_RE.fullmatch(link)):
            problem = f"publishes a download URL for {name} that is not a plain http(s) URL"
        elif sha is None:
            problem = f"publishes no sha256 digest for {name}"
        elif not SHA256_RE.fullmatch(sha):
            problem = f"publishes a malformed sha256 digest for {name}"
        out.append({"name": name, "url": link, "sha256": sha if problem is None else None, "problem": problem})
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
    if asset["problem"]:
        raise IntegrityError(f"release {tag} of {repo} {asset['problem']}; refusing it")
    return asset
