"""Profiles and what runs from them: `activate`, `rollback`, `generations`, `list-profiles`,
`pin`, `unpin`, `env`, `run`."""

from __future__ import annotations

import click

from llmgw_store.cli import handlers
from llmgw_store.cli.app import Context, cli, lock_timeout_option, spec_params
from llmgw_store.core import locks


@cli.command()
@spec_params("activate")
@click.pass_obj
def activate(obj: Context, **kw) -> None:
    """Make TARGET the current generation of PROFILE (atomically).

    TARGET is a store path (or its name or key), or a RECIPE.toml that is built first if needed
    (the build options apply to it). Activating what is already current makes no new generation.
    With a check (--check, or the recipe's `health`), the profile switches only if the check
    passes; else it is left as it was and the command exits 1 with the check's last lines.

    \b
    Examples:
      llmgw-store activate vllm /var/lib/llmgw-store/store/5x...-vllm-0.6.3-cu128
      llmgw-store activate vllm examples/vllm.toml --variant cu128
      llmgw-store activate vllm examples/vllm.toml --check 'vllm --version' --check-timeout 60
      llmgw-store activate vllm vllm@7 --check 'systemctl restart vllm' --then-check
    """
    handlers.activate(obj, kw)


@cli.command()
@spec_params("rollback")
@click.pass_obj
def rollback(obj: Context, **kw) -> None:
    """Switch PROFILE back to its previous generation, or to generation N with --to N.

    A cold generation N (deleted, its store path collected) comes back from its record: pulled
    from a --substituter, else rebuilt from its recorded lock (offline from uv's cache when it
    can be: same hashes, no re-resolution), and switched to only if it has the recorded content hash.

    \b
    Example:
      llmgw-store rollback vllm          # the generation before the current one
      llmgw-store rollback vllm --to 3
    """
    handlers.rollback(obj, kw)


@cli.command()
@spec_params("generations")
@click.pass_obj
def generations(obj: Context, profile: str, delete: tuple[int, ...], older_than: str | None, keep: int | None,
                forget: tuple[int, ...], keep_records: int | None, history: bool, dry_run: bool,
                substituters: tuple[str, ...], substitute_only: bool, lock_timeout: float) -> None:
    """List PROFILE's generations (number, date, hot or cold, engine version, store path, current),
    or delete some.

    A generation is hot while its store path is on disk, cold once it is gone (deleted, then
    collected); a cold generation can still be rolled back to from its record.

    \b
    Examples:
      llmgw-store generations vllm
      llmgw-store generations vllm --delete 3 --delete 4
      llmgw-store generations vllm --older-than 30d
      llmgw-store generations vllm --forget 2 --keep-records 50
    """
    from llmgw_store.roots import profiles

    if delete or older_than is not None or keep is not None or forget or keep_records is not None:
        from llmgw_store.app.units import parse_duration

        d = profiles.delete_generations(profile, numbers=list(delete), keep=keep, dry_run=dry_run, root=obj.root,
                                        older_than=parse_duration(older_than) if older_than is not None else None,
                                        forget=list(forget), keep_records=keep_records, lock_timeout=lock_timeout)
        verb = "would delete" if dry_run else "deleted"
        text = f"{profile}: {verb} generation(s) {', '.join(map(str, d.deleted)) or 'none'}"
        if d.forgotten:
            text += f"; {'would forget' if dry_run else 'forgot'} {', '.join(map(str, d.forgotten))}"
        if d.records_dropped:
            text += f"; dropped the records of {', '.join(map(str, d.records_dropped))}"
        obj.emit(d.to_json(), text)
        return
    r = profiles.generations(profile, root=obj.root, lock_timeout=lock_timeout, substituters=tuple(substituters),
                             substitute_only=substitute_only)
    for line in r.index_differs:
        obj.progress(f"index differs: {line} (the next change of the profile records it)")
    for line in r.records_refused:
        obj.progress(f"record refused: {line}")

    doc = r.to_json()
    obj.emit(doc, handlers.generations_text(profile, doc, history))



@cli.command(name="list-profiles")
@click.pass_obj
def list_profiles(obj: Context) -> None:
    """List profiles with their current generation and store path."""
    from llmgw_store.roots.profiles import list_profiles as do_list

    r = do_list(root=obj.root)
    obj.emit(r.to_json(), "\n".join(f"{p.profile}  generation {p.current} of {p.generations}  {p.path}" for p in r.profiles))


@cli.command()
@click.argument("name")
@click.argument("path")
@lock_timeout_option(locks.LOCK_TIMEOUT_S, "a gc to let go of the gc lock")
@click.pass_obj
def pin(obj: Context, name: str, path: str, lock_timeout: float) -> None:
    """Keep PATH from gc under the pin NAME (ROOT/gcroots/NAME).

    \b
    Example:
      llmgw-store pin vllm-known-good /var/lib/llmgw-store/store/5x...-vllm-0.6.3-cu128
    """
    from llmgw_store.roots.pins import pin as do_pin

    r = do_pin(name, path, root=obj.root, lock_timeout=lock_timeout)
    obj.emit(r.to_json(), f"pinned {r.path} as {name}")


@cli.command()
@click.argument("name")
@lock_timeout_option(locks.LOCK_TIMEOUT_S, "the index")
@click.pass_obj
def unpin(obj: Context, name: str, lock_timeout: float) -> None:
    """Remove the pin NAME (the store path stays until a gc finds nothing else holds it)."""
    from llmgw_store.roots.pins import unpin as do_unpin

    r = do_unpin(name, root=obj.root, lock_timeout=lock_timeout)
    obj.emit(r.to_json(), f"unpinned {name} ({r.path})")


@cli.command()
@click.argument("profile")
@click.argument("target", required=False, metavar="[TARGET]")
@lock_timeout_option(locks.LOCK_TIMEOUT_S, "a gc to let go of the gc lock, the profile's lock")
@click.pass_obj
def hold(obj: Context, profile: str, target: str | None, lock_timeout: float) -> None:
    """Hold PROFILE at TARGET (a store path, its name or key, PROFILE@N; by default its current
    generation, else TARGET is activated): the profile ignores its release until `unhold`.

    \b
    Examples:
      llmgw-store hold vllm
      llmgw-store hold vllm vllm@3
    """
    from llmgw_store.api import hold as do_hold

    made, switched = do_hold(profile, target, root=obj.root, lock_timeout=lock_timeout)
    doc = made.to_json()
    doc["generation"] = switched.generation if switched is not None else None
    doc["changed"] = bool(switched is not None and switched.changed)
    moved = f" (generation {switched.generation})" if switched is not None and switched.changed else ""
    obj.emit(doc, f"{profile}: held at {made.name}{moved}; its release is not followed until `unhold {profile}`")


@cli.command()
@click.argument("profile")
@click.pass_obj
def unhold(obj: Context, profile: str) -> None:
    """Release the hold of PROFILE: its next follow (`activate PROFILE`) moves it to its release."""
    from llmgw_store.roots.holds import unhold as do_unhold

    r = do_unhold(profile, root=obj.root)
    obj.emit(r.to_json(), f"{profile}: no longer held (was held at {r.name} since {r.since})")


@cli.command()
@spec_params("env")
@click.pass_obj
def env(obj: Context, target: str) -> None:
    """Print shell lines (PATH, VIRTUAL_ENV) for a profile (following its later switches), or for
    PROFILE@N or a store path (its name, its key): eval "$(llmgw-store env vllm)"."""
    from llmgw_store.roots.runenv import env_lines, shell_text

    r = env_lines(target, root=obj.root)
    obj.emit(r.to_json(), shell_text(r.variables).rstrip("\n"))


@cli.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("target", metavar="PROFILE|PATH")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.pass_obj
def run(obj: Context, target: str, command: tuple[str, ...]) -> None:
    """Run COMMAND in a profile's current generation (for service units), or in PROFILE@N or a
    store path (its name, its key).

    \b
    Example:
      llmgw-store run vllm -- vllm serve Qwen/Qwen2.5-7B-Instruct --port 8000
    """
    from llmgw_store.roots.runenv import exec_in

    argv = list(command[1:] if command[:1] == ("--",) else command)
    exec_in(target, argv, root=obj.root)
