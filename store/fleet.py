"""Binary caches: one node builds, the others fetch the same bytes, signed.

A cache is a flat namespace of objects keyed by the store key:

    <key>.json       metadata: name, key inputs, content hash, sizes, compression, references,
                     the archive's sha256, and ed25519 signatures over all of that
    <key>.tar.zst    the store path as a tar stream, zstd-compressed

The metadata is written last: an object without it does not exist for pullers. Backends:
`file:///dir`, `http(s)://host/prefix` (GET to read, PUT to write) and `s3://bucket/prefix`
(boto3, optional).

Trust: a puller accepts an object only if one of its trusted public keys signed the metadata, the
archive's sha256 matches the metadata, and the unpacked tree's content hash matches the metadata;
then it registers the path like a build would (frozen, renamed into place, one transaction). A
compromised cache can withhold objects or serve stale ones it once had signed; it cannot make a
node install bytes no trusted key signed.

Keys are `name:base64` (as Nix writes them): `<name>.secret` holds the 32-byte ed25519 seed,
`<name>.public` the verify key.
"""

from __future__ import annotations

import base64
import json
import os
import tarfile
import time
from pathlib import Path
from typing import Any, Callable

from .errors import IntegrityError, NetworkError, NotFoundError, UsageError
from .fsutil import sha256_of
from .keys import KEY_RE, canonical_json
from .local_store import Store

ZSTD_LEVEL = 3


def _quiet(_: str) -> None:
    pass


# --- keys ----------------------------------------------------------------------------------

def keygen(name: str, out_dir: str | Path) -> dict[str, str]:
    from nacl.signing import SigningKey

    if not name or ":" in name or "/" in name:
        raise UsageError(f"{name!r} is not a key name (no ':' or '/')")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sk = SigningKey.generate()
    secret, public = out / f"{name}.secret", out / f"{name}.public"
    if secret.exists():
        raise UsageError(f"{secret} exists; refusing to overwrite a secret key")
    fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"{name}:{base64.b64encode(bytes(sk)).decode()}\n")
    public.write_text(f"{name}:{base64.b64encode(bytes(sk.verify_key)).decode()}\n")
    return {"secret": str(secret), "public": str(public), "public_key": public.read_text().strip()}


def _key_text(value: str) -> str:
    """A key given inline (`name:base64`) or as a file holding it."""
    if os.path.isfile(value):
        return Path(value).read_text().strip()
    return value.strip()


def _parse_key(text: str, what: str) -> tuple[str, bytes]:
    name, _, b64 = text.partition(":")
    try:
        raw = base64.b64decode(b64, validate=True)
    except ValueError:
        raw = b""
    if not name or len(raw) != 32:
        raise UsageError(f"{what} is not a key of the form name:base64 (32 bytes)")
    return name, raw


def trusted_keys(values: list[str] | tuple[str, ...]) -> dict[str, bytes]:
    keys = dict(_parse_key(_key_text(v), f"trusted key {v!r}") for v in values)
    for v in os.environ.get("LLMGW_STORE_TRUSTED_KEYS", "").split():
        name, raw = _parse_key(_key_text(v), f"trusted key {v!r} (LLMGW_STORE_TRUSTED_KEYS)")
        keys[name] = raw
    return keys


def _signed_part(meta: dict[str, Any]) -> bytes:
    return canonical_json({k: v for k, v in meta.items() if k != "signatures"})


def sign(meta: dict[str, Any], secret: str) -> None:
    from nacl.signing import SigningKey

    name, seed = _parse_key(_key_text(secret), "the secret key")
    sig = SigningKey(seed).sign(_signed_part(meta)).signature
    meta.setdefault("signatures", []).append({"key": name, "sig": base64.b64encode(sig).decode()})


def check_signature(meta: dict[str, Any], trusted: dict[str, bytes]) -> str:
    """The name of the trusted key that signed `meta`; IntegrityError when none did."""
    from nacl.exceptions import BadSignatureError
    from nacl.signing import VerifyKey

    if not trusted:
        raise UsageError("no trusted public keys: pass --trusted-key (name:base64 or a .public file)")
    body = _signed_part(meta)
    for s in meta.get("signatures", []):
        key = trusted.get(s.get("key"))
        if key is None:
            continue
        try:
            VerifyKey(key).verify(body, base64.b64decode(s.get("sig", "")))
            return s["key"]
        except (BadSignatureError, ValueError):
            continue
    signers = ", ".join(s.get("key", "?") for s in meta.get("signatures", [])) or "nobody"
    raise IntegrityError(f"{meta.get('name', '?')}: not signed by a trusted key (signed by: {signers}); refusing it")


# --- backends ------------------------------------------------------------------------------

class FileBackend:
    def __init__(self, root: Path):
        self.root = root

    def get(self, name: str, dest: Path | None = None) -> bytes | None:
        p = self.root / name
        if not p.exists():
            return None
        if dest is not None:
            import shutil

            shutil.copyfile(p, dest)
            return b""
        return p.read_bytes()

    def put(self, name: str, src: Path | bytes) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".{name}.{os.getpid()}.tmp"
        if isinstance(src, bytes):
            tmp.write_bytes(src)
        else:
            import shutil

            shutil.copyfile(src, tmp)
        os.replace(tmp, self.root / name)  # readers see the whole object or none


class HttpBackend:
    def __init__(self, base: str):
        self.base = base.rstrip("/")

    def _client(self):
        import httpx

        return httpx.Client(timeout=300, follow_redirects=True, headers={"User-Agent": "llmgw-store"})

    def get(self, name: str, dest: Path | None = None) -> bytes | None:
        import httpx

        url = f"{self.base}/{name}"
        try:
            with self._client() as c, c.stream("GET", url) as r:
                if r.status_code == 404:
                    return None
                if r.status_code != 200:
                    raise NetworkError(f"GET {url}: HTTP {r.status_code}")
                if dest is None:
                    return r.read()
                with open(dest, "wb") as out:
                    for chunk in r.iter_bytes(1 << 20):
                        out.write(chunk)
                return b""
        except httpx.HTTPError as exc:
            raise NetworkError(f"GET {url}: {exc}") from exc

    def put(self, name: str, src: Path | bytes) -> None:
        import httpx

        url = f"{self.base}/{name}"
        try:
            with self._client() as c:
                if isinstance(src, bytes):
                    r = c.put(url, content=src)
                else:
                    with open(src, "rb") as f:
                        r = c.put(url, content=f, headers={"Content-Length": str(src.stat().st_size)})
        except httpx.HTTPError as exc:
            raise NetworkError(f"PUT {url}: {exc}") from exc
        if r.status_code not in (200, 201, 204):
            raise NetworkError(f"PUT {url}: HTTP {r.status_code} (does the server accept writes?)")


class S3Backend:
    """S3-compatible object storage through boto3 (`pip install 'llmgw-store[s3]'`). Credentials and
    region come from boto3's usual places; `LLMGW_STORE_S3_ENDPOINT` (or AWS_ENDPOINT_URL) names a
    non-AWS endpoint (MinIO, Ceph, a test server)."""

    def __init__(self, url: str):
        try:
            import boto3
        except ImportError:
            raise UsageError("s3:// caches need boto3: pip install 'llmgw-store[s3]'") from None
        bucket, _, prefix = url[len("s3://"):].partition("/")
        if not bucket:
            raise UsageError(f"{url!r}: an S3 cache URL is s3://bucket/prefix")
        self.bucket, self.prefix = bucket, prefix.strip("/")
        endpoint = os.environ.get("LLMGW_STORE_S3_ENDPOINT") or os.environ.get("AWS_ENDPOINT_URL")
        self.client = boto3.client("s3", endpoint_url=endpoint)

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def get(self, name: str, dest: Path | None = None) -> bytes | None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            if dest is not None:
                self.client.download_file(self.bucket, self._key(name), str(dest))
                return b""
            return self.client.get_object(Bucket=self.bucket, Key=self._key(name))["Body"].read()
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
                return None
            raise NetworkError(f"s3://{self.bucket}/{self._key(name)}: {exc}") from exc
        except BotoCoreError as exc:
            raise NetworkError(f"s3://{self.bucket}/{self._key(name)}: {exc}") from exc

    def put(self, name: str, src: Path | bytes) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            if isinstance(src, bytes):
                self.client.put_object(Bucket=self.bucket, Key=self._key(name), Body=src)
            else:
                self.client.upload_file(str(src), self.bucket, self._key(name))
        except (ClientError, BotoCoreError) as exc:
            raise NetworkError(f"s3://{self.bucket}/{self._key(name)}: {exc}") from exc


def backend_for(url: str):
    if url.startswith("file://"):
        return FileBackend(Path(url[len("file://"):]))
    if url.startswith(("http://", "https://")):
        return HttpBackend(url)
    if url.startswith("s3://"):
        return S3Backend(url)
    raise UsageError(f"{url!r}: a cache URL is file:///dir, http(s)://host/prefix or s3://bucket/prefix")


# --- push ----------------------------------------------------------------------------------

def _closure(store: Store, names: list[str]) -> list[str]:
    """`names` and what they reference, references first."""
    from .gc import _references

    order: list[str] = []

    def visit(n: str, seen: set[str]) -> None:
        if n in order or n in seen:
            return
        for ref in sorted(_references(store.layout, n)):
            visit(ref, seen | {n})
        order.append(n)

    for n in names:
        visit(n, set())
    return order


def _archive(tree: Path, name: str, out: Path) -> None:
    import zstandard

    with open(out, "wb") as raw:
        cctx = zstandard.ZstdCompressor(level=ZSTD_LEVEL, threads=-1)
        with cctx.stream_writer(raw) as zw, tarfile.open(fileobj=zw, mode="w|", format=tarfile.GNU_FORMAT) as tf:
            tf.add(tree, arcname=name)


def push(targets: list[str], to: str, secret_key: str, *, root: str | Path | None = None,
         progress: Callable[[str], None] = _quiet) -> dict[str, Any]:
    from .resolve import registered

    backend = backend_for(to)
    pushed, skipped = [], []
    with Store.open(root) as store:
        names = _closure(store, [registered(store, t)["name"] for t in targets])
        for name in names:
            row = registered(store, name)
            key = row["key"]
            if backend.get(f"{key}.json") is not None:
                skipped.append(name)
                continue
            tree = store.layout.path_of(name)
            tmp = store.layout.tmp / f"push-{os.getpid()}-{key}.tar.zst"
            started = time.monotonic()
            try:
                _archive(tree, name, tmp)
                meta = {
                    "name": name, "key": key, "inputs": json.loads(row["inputs"]),
                    "content_hash": row["content_hash"], "size": row["size"], "files": row["files"],
                    "compression": "zstd", "archive": f"{key}.tar.zst", "archive_sha256": sha256_of(tmp),
                    "archive_size": tmp.stat().st_size,
                    "references": sorted(_closure(store, [name])[:-1]),
                }
                sign(meta, secret_key)
                backend.put(meta["archive"], tmp)
                backend.put(f"{key}.json", canonical_json(meta))  # last: the object now exists
            finally:
                tmp.unlink(missing_ok=True)
            progress(f"pushed {name} ({meta['archive_size'] / 1e6:.1f} MB compressed from {row['size'] / 1e6:.1f} MB "
                     f"in {time.monotonic() - started:.1f}s)")
            pushed.append(name)
    return {"pushed": pushed, "already_there": skipped, "to": to}


# --- pull ----------------------------------------------------------------------------------

def _find_meta(backends, target: str) -> tuple[Any, dict[str, Any]]:
    key = target if KEY_RE.match(target) else Path(target).name[:32]
    if not KEY_RE.match(key):
        raise UsageError(f"{target!r} is neither a store key nor a store path name")
    for b in backends:
        data = b.get(f"{key}.json")
        if data is not None:
            try:
                return b, json.loads(data)
            except ValueError as exc:
                raise IntegrityError(f"{key}.json is not valid JSON: {exc}") from None
    raise NotFoundError(f"no cache has {key}")


def _check_relocatable(tree: Path, name: str) -> None:
    """The environment must find its interpreter here: pyvenv.cfg's home must hold a python."""
    cfg = tree / "pyvenv.cfg"
    if not cfg.exists():
        return
    for line in cfg.read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "home":
            home = Path(value.strip())
            if not any((home / p).exists() for p in ("python3", "python")):
                raise UsageError(f"{name}: its interpreter {home} does not exist on this machine; install that "
                                 "Python there (or build the recipe locally)")


def _unsafe_member(m: tarfile.TarInfo, name: str, symlinks: set[str]) -> str | None:
    """Environments hold absolute symlinks (bin/python -> the interpreter), and those are signed
    and hashed like any entry; what must never happen is a write outside the tree: no absolute or
    `..` names, nothing outside `name/`, no hardlink out, no devices, and no member below a symlink
    the archive made (a write through it)."""
    parts = Path(m.name).parts
    if m.name.startswith("/") or ".." in parts:
        return "has an absolute or .. path"
    if not parts or parts[0] != name:
        return f"is outside {name}"
    if m.isdev() or m.isfifo():
        return "is a device or special file"
    if m.islnk() and (Path(m.linkname).is_absolute() or ".." in Path(m.linkname).parts
                      or Path(m.linkname).parts[:1] != (name,)):
        return f"hardlinks out of the tree ({m.linkname})"
    if any("/".join(parts[:i]) in symlinks for i in range(1, len(parts))):
        return "would be written through a symlink"
    if m.issym():
        symlinks.add("/".join(parts))
    return None


def _zstd_stream(archive: Path):
    import zstandard

    return zstandard.ZstdDecompressor().stream_reader(open(archive, "rb"), closefd=True)


def _check_members(archive: Path, name: str, label: str) -> None:
    """Every member is checked before a byte is written (one pass over the headers)."""
    symlinks: set[str] = set()
    with _zstd_stream(archive) as zr, tarfile.open(fileobj=zr, mode="r|") as tf:
        for m in tf:
            problem = _unsafe_member(m, name, symlinks)
            if problem:
                raise IntegrityError(f"{label}: member {m.name!r} {problem}; refusing it")


def _extract(archive: Path, dest: Path) -> None:
    """GNU tar extracts (it is several times faster than tarfile on trees of thousands of files and
    restores read-only directories last); the stream is decompressed here, so no zstd binary is
    needed. Ownership is not restored: the files belong to whoever runs the store."""
    import shutil
    import subprocess

    tar = shutil.which("tar")
    if tar is None:
        raise UsageError("pulling needs GNU tar on PATH")
    proc = subprocess.Popen([tar, "-x", "-f", "-", "-C", str(dest), "--no-same-owner", "--delay-directory-restore"],
                            stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        with _zstd_stream(archive) as zr:
            shutil.copyfileobj(zr, proc.stdin, 1 << 20)
        proc.stdin.close()
    except BrokenPipeError:
        pass
    err = proc.stderr.read().decode(errors="replace")
    if proc.wait() != 0:
        raise IntegrityError(f"{archive.name}: tar failed: {err.strip()[-300:]}")


def fetch_into_store(store: Store, backend, meta: dict[str, Any], trusted: dict[str, bytes],
                     progress: Callable[[str], None]) -> Path:
    """Download, check and register one object. Caller holds the key's lock (or is pull)."""
    from . import manifest
    from .fsutil import force_rmtree
    from .realise import _row

    signer = check_signature(meta, trusted)
    name, key = meta["name"], meta["key"]
    if not name.startswith(key + "-"):
        raise IntegrityError(f"{key}.json names {name!r}, which is not a path of that key; refusing it")
    layout = store.layout
    final = layout.path_of(name)
    scratch = layout.tmp / f"pull-{os.getpid()}-{key}"
    archive = layout.tmp / f"pull-{os.getpid()}-{key}.tar.zst"
    build_id = store.index.start_build(key, name)
    started = time.monotonic()
    try:
        force_rmtree(scratch)
        backend.get(meta["archive"], dest=archive)
        if sha256_of(archive) != meta["archive_sha256"]:
            raise IntegrityError(f"{meta['archive']}: sha256 differs from the signed metadata; refusing it")
        scratch.mkdir(parents=True)
        _check_members(archive, name, meta["archive"])
        _extract(archive, scratch)
        tree = scratch / name
        entries = manifest.scan(tree)
        if manifest.content_hash(entries) != meta["content_hash"]:
            raise IntegrityError(f"{name}: the unpacked tree's content hash differs from the signed metadata; refusing it")
        doc = manifest.read(tree)
        if doc.get("content_hash") != meta["content_hash"] or doc.get("key") != key:
            raise IntegrityError(f"{name}: its manifest does not match the signed metadata; refusing it")
        _check_relocatable(tree, name)
        os.rename(tree, final)  # atomic, same filesystem: complete or absent
    except BaseException as exc:
        store.index.fail_build(build_id, time.monotonic() - started, f"{type(exc).__name__}: {exc}")
        raise
    finally:
        force_rmtree(scratch)
        archive.unlink(missing_ok=True)
    row = _row(doc, doc["inputs"])
    store.index.register(row, build_id, round(time.monotonic() - started, 3))
    store.index.conn.execute("UPDATE builds SET outcome = 'substituted' WHERE id = ?", (build_id,))
    progress(f"substituted {name} from the cache (signed by {signer}) in {time.monotonic() - started:.1f}s")
    return final


def pull(target: str, from_: list[str], trusted: list[str], *, root: str | Path | None = None,
         progress: Callable[[str], None] = _quiet) -> dict[str, Any]:
    from . import locks
    from .temproots import TempRoots

    backends = [backend_for(u) for u in from_]
    keys = trusted_keys(trusted)
    pulled, present = [], []
    with Store.open(root) as store:

        def one(t: str) -> None:
            backend, meta = _find_meta(backends, t)
            for ref in meta.get("references", []):
                one(ref)
            name = meta["name"]
            if store.index.path_by_key(meta["key"]) and store.layout.path_of(name).is_dir():
                present.append(name)
                return
            TempRoots(store.layout).add(name)
            with locks.hold(store.layout.locks, meta["key"], f"pulling {name}", 3600, progress):
                if store.index.path_by_key(meta["key"]) and store.layout.path_of(name).is_dir():
                    present.append(name)
                    return
                fetch_into_store(store, backend, meta, keys, progress)
                pulled.append(name)

        one(target)
        return {"pulled": pulled, "already_present": present,
                "path": str(store.layout.path_of((pulled or present)[-1]))}
