"""`config`: the settings in effect and where each comes from."""

from __future__ import annotations

import os
from typing import Any

import click
from click.core import ParameterSource

from llmgw_store.cli import config
from llmgw_store.cli.app import Context, cli
from llmgw_store.cli.handlers import default_root
from llmgw_store.cli.output import SCHEMA_VERSION


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
    values = loaded.values if loaded is not None else {}
    path, explicit = config.locate(group.params.get("config_file"))
    settings: dict[str, dict[str, Any]] = {}  # name -> the --json document's entry
    for s in config.SETTINGS:
        flag = None
        if config.GLOBAL in s.commands and group.get_parameter_source(s.param) == ParameterSource.COMMANDLINE:
            flag = group.params[s.param]
        try:
            value, source = config.effective(s, flag, os.environ, values)
        except ValueError:
            value, source = os.environ[s.env], "env (not a valid value: the commands that take it refuse it)"
        # Shown without credentials (an index token, a cache's password): both outputs are for eyes and logs.
        value = [_public(v) for v in value] if isinstance(value, (tuple, list)) else _public(value)
        settings[s.name] = {"value": value, "source": source,
                            "flag": s.flag, "env": s.env, "key": s.name,
                            "commands": ["(every command)"] if config.GLOBAL in s.commands or "*" in s.commands
                            else list(s.commands)}
    file_line = (loaded.path if loaded is not None else
                 f"none ({path} does not exist)" if path is not None and not explicit else "none")
    width = max(len(n) for n in settings)
    lines = [f"config file: {file_line}"]
    for name, d in settings.items():
        v = d["value"]
        shown = (" ".join(map(str, v)) or "(none)") if isinstance(v, list) else (
            _unset(name) if v is None else str(v))
        where = {"flag": d["flag"], "env": f"env {d['env']}", "file": "config file"}.get(d["source"], d["source"])
        lines.append(f"{name:<{width}}  {shown:<40}  {where}")
    obj.emit({"schema_version": SCHEMA_VERSION, "config_file": loaded.path if loaded is not None else None,
              "settings": settings}, "\n".join(lines))


def _public(value: object) -> object:
    from llmgw_store.app.credentials import public_url

    return public_url(value) if isinstance(value, str) else value


def _unset(name: str) -> str:
    if name == "root":
        return default_root()
    if name == "uv":
        return "(the store's pinned uv)"
    if name == "lock_timeout":
        return "(each command's own: see its --help)"
    return "(none)"
