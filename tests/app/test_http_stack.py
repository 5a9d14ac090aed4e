"""The store's one HTTP stack (app/httpclient.py): what it refuses before any request, and what
it costs a command that makes none."""

from __future__ import annotations

import subprocess
import sys

import pytest

from llmgw_store.base.errors import UsageError
from llmgw_store.cache.backends.http import HttpBackend

PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


@pytest.mark.parametrize("proxy", ["ftp://alice:s3cret@proxy.example:21", "socks5://alice:s3cret@proxy.example:1080"])
def test_a_proxy_the_stack_cannot_use_is_one_line_without_its_credentials(monkeypatch, proxy):
    for var in PROXY_VARS:
        monkeypatch.delenv(var, raising=False)
        monkeypatch.delenv(var.upper(), raising=False)
    monkeypatch.setenv("ALL_PROXY", proxy)
    with pytest.raises(UsageError) as err:
        HttpBackend("http://127.0.0.1:9/cache")._prepare()
    assert "proxy" in str(err.value) and "s3cret" not in str(err.value) and "alice" not in str(err.value)


def test_a_cache_backend_imports_httpx_only_for_its_first_request():
    code = ("import sys; from llmgw_store.cache.backends import backend_for; b = backend_for('http://127.0.0.1:9/c');"
            "assert 'httpx' not in sys.modules, 'imported by making the backend'; b._prepare();"
            "assert 'httpx' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_httpx_is_loaded_without_its_command_line_tool():
    """httpx's package imports its CLI (click, pygments; rich missing: a stub `main`): the stack
    loads httpx without it, so a request costs no click (the fast follow's path has none)."""
    code = ("import sys; from llmgw_store.app import httpclient; c = httpclient.client(tls=False); c.close();"
            "httpx = httpclient.load(); assert httpx is sys.modules['httpx'] and httpx.Client;"
            "loaded = [m for m in ('click', 'pygments', 'rich', 'httpx._main') if m in sys.modules];"
            "assert not loaded, loaded; assert 'httpx._main' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_thread_that_loads_httpx_while_another_imports_it_waits_for_the_whole_module():
    """Pull workers make their first requests at once: a second thread's `load()` while the first
    one's import of httpx is under way (paused at httpx._api by a finder) gets the finished module,
    not the half-made one sys.modules already holds."""
    code = """if True:
        import sys, threading
        from llmgw_store.app import httpclient
        got, started = {}, threading.Event()
        def second():
            started.set()
            got["mod"] = httpclient.load()
            got["whole"] = hasattr(got["mod"], "Client")  # as it was handed out (the same object fills later)
        class Pause:
            def find_spec(self, name, path=None, target=None):
                if name == "httpx._api" and "t" not in got:
                    t = got["t"] = threading.Thread(target=second)
                    t.start()
                    started.wait()
                    t.join(1)  # a half-made module would be handed out at once; the whole one only after us
                return None
        sys.meta_path.insert(0, Pause())
        mod = httpclient.load()
        got["t"].join()
        assert got["mod"] is mod and got["whole"], "the second thread got httpx half made"
        """
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
