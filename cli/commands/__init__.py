"""The commands, one module per area; importing this package registers them all on the group."""

from llmgw_store.cli.commands import build, config, fleet, gc, inspect, integrity, profiles, query, release  # noqa: F401
