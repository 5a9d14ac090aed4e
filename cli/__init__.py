"""The `llmgw-store` command: parses arguments, calls one library function, formats its result."""

from .main import cli, main

__all__ = ["cli", "main"]
