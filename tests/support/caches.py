"""Binary caches on the three real backends (a directory, an HTTP object server on 127.0.0.1, an
S3-protocol server), as fixtures for the cache tests, and pushing a store path in format 1."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli
from tests.support.object_server import ObjectServer


@pytest.fixture(scope="module")
def s3_server():
    """A real S3-protocol server (moto's server mode) on 127.0.0.1."""
    from moto.server import ThreadedMotoServer

    srv = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    srv.start()
    host, port = srv.get_host_and_port()
    yield f"http://{host}:{port}"
    srv.stop()


@pytest.fixture(params=["file", "http", "s3"])
def cache(request, tmp_path, monkeypatch):
    if request.param == "file":
        yield f"file://{tmp_path / 'cache'}"
    elif request.param == "http":
        srv = ObjectServer()
        yield srv.url
        srv.stop()
    else:
        import boto3

        endpoint = request.getfixturevalue("s3_server")
        for k, v in {"LLMGW_STORE_S3_ENDPOINT": endpoint, "AWS_ACCESS_KEY_ID": "test",
                     "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}.items():
            monkeypatch.setenv(k, v)
        bucket = f"llmgw-{tmp_path.name.lower().replace('_', '-')[:40]}"
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
        yield f"s3://{bucket}/nodes"


def push(root, name, cache, secret, format="1"):
    """Push as format 1 (one archive) unless told: the v1 tests here and in test_cache_trust keep
    the monolithic path covered; tests/cache/test_fleet_delta.py covers format 2."""
    return json.loads(run_cli(root, "--json", "push", str(root / "store" / name), "--to", cache,
                              "--secret-key", str(secret), "--format", format, check=True).stdout)
