"""`config`: the settings in effect and where each comes from."""

from __future__ import annotations

import os

import click
from click.core import ParameterSource

from llmgw_store.cli import config, handlers
from llmgw_store.cli.app import Context, cli


@cli.command(name="config")
@click.pass_context
def config_cmd(ctx: click.Context) -> None:
    """Show every setting in effect and where it comes from: a flag (of the group: --root,
    --progress), its environment variable, the config file, or the built-in default.

    The config file is TOML: --config FILE, else $LLMGW_STORE_CONFIG (empty: none), else
    /etc/llmgw-store/config.toml as root, else $XDG_CONFIG_HOME/llmgw-store/config.toml. Keys:
    those below (`[gc]` holds the gc.* ones); docs/operations.md shows a node's and a builder's.

    \b
    Examples:
      llmgw-store config
      LLMGW_STORE_CONFIG=/etc/llmgw-store/node.toml llmgw-store --json config
    """
    obj: Context = ctx.obj
    group = ctx.find_root()
    loaded = group.meta.get("llmgw_store.config")
    flags = {s.param: group.params[s.param] for s in config.SETTINGS
             if config.GLOBAL in s.commands and group.get_parameter_source(s.param) == ParameterSource.COMMANDLINE}
    obj.emit(*handlers.config_shown(loaded.path if loaded is not None else None,
                                     loaded.values if loaded is not None else {}, group.params.get("config_file"),
                                     flags, os.environ))
