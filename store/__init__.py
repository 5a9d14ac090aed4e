"""llmgw-store: a Nix-style content-addressed store for uv-built inference-engine environments.

The library is five layers, each importing only from those below it (docs/architecture.md):
`core` < `build` | `cache` < `roots` < `integrity` < `api` (what the commands do) < `cli`.
The public names are loaded on first use (PEP 562), so importing the package costs nothing.
"""

from __future__ import annotations

_EXPORTS = {
    "BuildOptions": "build.builder", "BuildResult": "build.builder",
    "Store": "core.local_store",
    "StoreError": "base.errors", "UsageError": "base.errors", "RecipeError": "base.errors", "NotFoundError": "base.errors",
    "LockTimeout": "base.errors", "NetworkError": "base.errors", "IntegrityError": "base.errors", "CommandError": "base.errors",
    "IndexError_": "base.errors",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> object:  # no `typing` import: this module is on the hot path
    if name in _EXPORTS:
        from importlib import import_module  # here, not above: importlib brings warnings with it

        return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
