"""Where binary caches live: `file:///dir`, `http(s)://host/prefix` (GET to read, PUT to write) and
`s3://bucket/prefix` (boto3, optional). Each backend has `get(name, dest=None)` (None when the
object does not exist) and `put(name, src)`; a write is whole or absent for readers.
"""

from __future__ import annotations

import os
from pathlib import Path

from llmgw_store.core.errors import NetworkError, UsageError


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
