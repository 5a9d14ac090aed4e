"""llmgw-store: a Nix-style content-addressed store for uv-built inference-engine environments.

The public names are loaded on first use (PEP 562), so `import llmgw_store.errors` from the CLI does
not pay for the builder's imports on commands that never build.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "build": "builder", "BuildOptions": "builder", "BuildResult": "builder",
    "Store": "local_store",
    "StoreError": "errors", "UsageError": "errors", "RecipeError": "errors", "NotFoundError": "errors",
    "LockTimeout": "errors", "NetworkError": "errors", "IntegrityError": "errors", "CommandError": "errors",
    "IndexError_": "errors",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
