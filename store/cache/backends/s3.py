"""`s3://bucket/prefix`: S3-compatible object storage through boto3 (`pip install 'llmgw-store[s3]'`).
Credentials and region come from boto3's usual places; `LLMGW_STORE_S3_ENDPOINT` (or
AWS_ENDPOINT_URL) names a non-AWS endpoint (MinIO, Ceph, a test server).

botocore's own retries are off (one attempt per call): the store's policy (retry.py) decides, so
attempts are bounded once; its connect and read timeouts are the policy's stall time."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

from llmgw_store.base.errors import IntegrityError, NetworkError, UsageError
from llmgw_store.cache.backends.base import (
    MAX_LISTED,
    Listed,
    Opened,
    StreamingBackend,
    check_folder,
    listed,
    object_name,
)
from llmgw_store.cache.backends.retry import RetryPolicy, Transient, Watch, run

_ABSENT = ("NoSuchKey", "404", "NotFound")
_TRANSIENT_CODES = ("RequestTimeout", "RequestTimeTooSkewed", "SlowDown", "Throttling", "ThrottlingException",
                    "InternalError", "ServiceUnavailable", "RequestLimitExceeded")


class S3Backend(StreamingBackend):
    def __init__(self, url: str, policy: RetryPolicy | None = None):
        try:
            import boto3
        except ImportError:
            raise UsageError("s3:// caches need boto3: pip install 'llmgw-store[s3]'") from None
        bucket, _, prefix = url[len("s3://"):].partition("/")
        if not bucket:
            raise UsageError(f"{url!r}: an S3 cache URL is s3://bucket/prefix")
        self.bucket, self.prefix = bucket, prefix.strip("/")
        self.policy = policy or RetryPolicy.from_env()
        endpoint = os.environ.get("LLMGW_STORE_S3_ENDPOINT") or os.environ.get("AWS_ENDPOINT_URL")
        from botocore.config import Config

        # Pulls fetch blobs from many threads through this one (thread-safe) client.
        self.client = boto3.client("s3", endpoint_url=endpoint, config=Config(
            max_pool_connections=32, retries={"total_max_attempts": 1}, connect_timeout=self.policy.stall,
            read_timeout=self.policy.stall))

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def where(self, name: str) -> str:
        return f"s3://{self.bucket}/{self._key(name)}"

    def _error(self, what: str, exc: Exception) -> NetworkError:
        """Transient for throttling, 5xx, timeouts and connection errors; NetworkError otherwise."""
        from botocore.exceptions import ClientError

        if isinstance(exc, ClientError):
            err = exc.response.get("Error", {})
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
            if err.get("Code") in _TRANSIENT_CODES or status in (408, 429) or 500 <= status <= 599:
                return Transient(f"{what}: {exc}")
            return NetworkError(f"{what}: {exc}")
        return Transient(f"{what}: {exc}")  # BotoCoreError: connection, timeout, a cut stream

    @contextmanager
    def _open(self, name: str, offset: int, watch: Watch):
        from botocore.exceptions import BotoCoreError, ClientError

        watch.timeout()
        try:
            resp = self.client.get_object(Bucket=self.bucket, Key=self._key(name),
                                          **({"Range": f"bytes={offset}-"} if offset else {}))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in _ABSENT:
                yield None
                return
            raise self._error(self.where(name), exc) from None
        except BotoCoreError as exc:
            raise self._error(self.where(name), exc) from None
        watch.got(0)
        body = resp["Body"]
        start, total = 0, resp.get("ContentLength")
        span = resp.get("ContentRange") or ""
        if span.startswith("bytes "):
            first, _, whole = span[len("bytes "):].partition("/")
            start = int(first.partition("-")[0])
            total = int(whole) if whole.isdigit() else None
        raw = getattr(body, "_raw_stream", None)
        # read1: whatever has arrived, so a slow stream shows its pace to the stall watch.
        reader = raw.read1 if raw is not None and hasattr(raw, "read1") else body.read

        def read(n: int) -> bytes:
            try:
                return reader(n)
            except (BotoCoreError, OSError) as exc:
                raise self._error(self.where(name), exc) from None
            except Exception as exc:  # urllib3's own errors (ProtocolError, ReadTimeoutError) on a raw read
                raise Transient(f"{self.where(name)}: {exc}") from None

        try:
            yield Opened(total if isinstance(total, int) else None, start, read)
        finally:
            body.close()

    def _call(self, what: str, op):
        from botocore.exceptions import BotoCoreError, ClientError

        def attempt(watch: Watch):
            try:
                return op()
            except (ClientError, BotoCoreError) as exc:
                raise self._error(what, exc) from None

        return run(self.policy, what, attempt)

    def put(self, name: str, src: Path | bytes) -> None:
        key = self._key(object_name(name))
        if isinstance(src, bytes):
            self._call(self.where(name), lambda: self.client.put_object(Bucket=self.bucket, Key=key, Body=src))
        else:
            self._call(self.where(name), lambda: self.client.upload_file(str(src), self.bucket, key))

    def size(self, name: str) -> int | None:
        from botocore.exceptions import ClientError

        def head():
            try:
                return self.client.head_object(Bucket=self.bucket, Key=self._key(object_name(name)))
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") in _ABSENT:
                    return None
                raise

        resp = self._call(self.where(name), head)
        if resp is None:
            return None
        length = resp.get("ContentLength")
        return length if isinstance(length, int) else 0

    def delete(self, name: str) -> None:
        self._call(self.where(name), lambda: self.client.delete_object(Bucket=self.bucket,
                                                                       Key=self._key(object_name(name))))

    def list(self, folder: str = "") -> list[Listed]:
        prefix = self._key(f"{check_folder(folder)}/" if folder else "")

        def pages() -> list[Listed]:
            out: list[Listed] = []
            for page in self.client.get_paginator("list_objects_v2").paginate(
                    Bucket=self.bucket, Prefix=prefix, Delimiter="/"):
                for o in page.get("Contents", []):
                    item = listed(folder, o["Key"][len(prefix):], o.get("Size"), o["LastModified"].timestamp())
                    if item is not None:
                        out.append(item)
                if len(out) > MAX_LISTED:
                    raise IntegrityError(f"{self.where(prefix)}: lists more than {MAX_LISTED} objects; refusing it")
            return out

        return self._call(self.where(prefix), pages)
