"""Binary caches: `push`, `pull`, `push-roots`, `cache gc`, `key public` (`keygen` is in integrity.py)."""

from __future__ import annotations

import functools

import click

from llmgw_store.cli.app import Context, cli, lock_timeout_option, setting_option
from llmgw_store.cli.handlers import cache_network
from llmgw_store.cli.spec import CACHE_NETWORK
from llmgw_store.core import locks


def cache_network_options(f):
    """How a command talks to binary caches (cli/config.py `cache.*`; docs/fleet.md, "Networks that
    fail"): the options become one `policy` argument (cache.backends.RetryPolicy)."""

    @functools.wraps(f)
    def with_policy(*args, **kwargs):
        from llmgw_store.cache.backends import RetryPolicy

        fields = cache_network(kwargs)  # the same reading as build's substituters (cli/handlers.py)
        for name in CACHE_NETWORK:
            del kwargs[f"cache_{name}"]
        kwargs["policy"] = RetryPolicy.from_env(**fields)
        return f(*args, **kwargs)

    for name in reversed(CACHE_NETWORK):
        with_policy = setting_option(f"cache.{name}")(with_policy)
    return with_policy


@cli.command()
@click.argument("paths", nargs=-1, required=True)
@click.option("--to", "to", required=True, help="Cache URL: file:///dir or http(s)://host/prefix (PUT).")
@click.option("--secret-key", required=True, envvar="LLMGW_STORE_SECRET_KEY", help="Signing key file (from keygen).")
@click.option("--format", "format_", type=click.IntRange(1, 2), default=2, show_default=True,
              help="Object format: 2 = files as shared blobs (delta pulls), 1 = one archive (older nodes).")
@click.option("--rewrite-blobs", is_flag=True, envvar="LLMGW_STORE_REWRITE_BLOBS",
              help="Upload every blob (or archive) again, even one the cache holds at the right size.")
@click.option("--drop-signature", "drop_signatures", multiple=True, metavar="NAME",
              help="Remove the signature of key NAME from the objects pushed (the end of a key rotation); repeatable.")
@click.option("--release", "release", metavar="NAME",
              help="Then point the release NAME at the (one) path pushed, signed with the same key (release set).")
@lock_timeout_option(locks.LOCK_TIMEOUT_S, "the store's locks and a running cache gc's marker")
@cache_network_options
@click.pass_obj
def push(obj: Context, paths: tuple[str, ...], to: str, secret_key: str, format_: int, rewrite_blobs: bool,
         drop_signatures: tuple[str, ...], release: str | None, lock_timeout: float, policy) -> None:
    """Upload store PATHS and what they reference to a binary cache, signed.

    \b
    Example:
      llmgw-store push vllm --to file:///srv/llmgw-cache --secret-key /etc/llmgw-store/builder-1.secret
    """
    from llmgw_store.api import push as do_push

    if release is not None:
        from llmgw_store.base.errors import UsageError
        from llmgw_store.cache.releases import check_release_name

        check_release_name(release)
        if len(paths) != 1:
            raise UsageError("push --release takes one PATH: the one the release points at")
    r = do_push(list(paths), to, secret_key, root=obj.root, format=format_, lock_timeout=lock_timeout, policy=policy,
                rewrite_blobs=rewrite_blobs, drop_signatures=drop_signatures)
    text = f"pushed {len(r.pushed)}, repaired {len(r.repaired)}, already there {len(r.already_there)}"
    doc = r.to_json()
    if release is not None:
        from llmgw_store.api import release_set

        pointer = release_set(release, paths[0], to, secret_key, root=obj.root, policy=policy).release
        doc["release"] = pointer.body()
        text += f"; release {release} -> {pointer.name} (sequence {pointer.seq})"
    obj.emit(doc, text)


@cli.command()
@click.argument("target")
@click.option("--from", "from_", multiple=True, required=True, help="Cache URL; repeatable (asked in order).")
@setting_option("trusted_keys", help="Public key accepted (name:base64 or a .public file); repeatable.")
@lock_timeout_option(locks.BUILD_LOCK_TIMEOUT_S, "each lock (another process fetching the same key, a gc)")
@cache_network_options
@click.pass_obj
def pull(obj: Context, target: str, from_: tuple[str, ...], trusted_keys: tuple[str, ...], lock_timeout: float,
         policy) -> None:
    """Fetch a store path (by key or store path name) and its references from a binary cache.

    \b
    Example:
      llmgw-store pull 5x...-vllm-0.33.0-cu130 --from https://cache.internal/llmgw --trusted-key builder-1.public
    """
    from llmgw_store.cache.pull import pull as do_pull

    r = do_pull(target, list(from_), list(trusted_keys), root=obj.root, lock_timeout=lock_timeout, policy=policy)
    obj.emit(r.to_json(), r.path)


@cli.command("push-roots")
@setting_option("node.roots_to")
@setting_option("node.secret_key")
@click.option("--node", help="The node's name in the cache: the secret key's name (the default); another is refused.")
@setting_option("releases", help="The release a profile follows, published beside the key it runs (for `fleet`); "
                                 "repeatable (the config file: releases = {vllm = \"vllm-prod\"}).")
@cache_network_options
@click.pass_obj
def push_roots(obj: Context, to: str | None, secret_key: str | None, node: str | None, releases: tuple[str, ...],
               policy) -> None:
    """Publish the keys this node's roots hold (profiles, pins, paths in use) as a signed roots
    document, which `cache gc` keeps, with the key each profile runs and the release it follows.

    \b
    Example:
      llmgw-store push-roots --to s3://llmgw-cache/prod --secret-key /etc/llmgw-store/node-7.secret
    """
    from llmgw_store.api import push_roots as do_push_roots

    if to is None or secret_key is None:
        flag, key = ("--to", "roots_to") if to is None else ("--secret-key", "secret_key")
        raise click.UsageError(f"Missing option '{flag}' (or `{key}` in the config file's [node] table).")
    from llmgw_store.cli.handlers import followed

    r = do_push_roots(to, secret_key, node=node, root=obj.root, policy=policy, releases=followed(releases))
    obj.emit(r.to_json(), f"{r.object}: {len(r.keys)} store path(s)")


@cli.group()
def cache() -> None:
    """Binary-cache maintenance."""


@cache.command("gc")
@click.argument("url")
@click.option("--keep-from", "keep_from", multiple=True, required=True,
              help="Public key (name:base64 or a .public file) of a node whose roots document is honoured; repeatable.")
@click.option("--grace", default="1d", show_default=True,
              help="Keep whatever was written more recently than this (pushes not yet in a roots document).")
@click.option("--dry-run", is_flag=True,
              help="List what would be deleted, and why each object is kept; delete nothing.")
@click.option("--allow-no-roots", is_flag=True,
              help="Go on when the cache holds no roots document (deletes every object older than the grace).")
@setting_option("trusted_keys", help="Public key of a builder, to check the release pointers (their objects are "
                "kept); repeatable. A --keep-from key may sign them too.")
@cache_network_options
@click.pass_obj
def cache_gc(obj: Context, url: str, keep_from: tuple[str, ...], grace: str, dry_run: bool,
             allow_no_roots: bool, trusted_keys: tuple[str, ...], policy) -> None:
    """Delete the objects and blobs of the cache URL that no published roots document and no
    release pointer holds.

    \b
    Example:
      llmgw-store cache gc s3://llmgw-cache/prod --keep-from /etc/llmgw-store/nodes/ --grace 7d --dry-run
    """
    from llmgw_store.api import cache_gc as do_cache_gc
    from llmgw_store.app.units import human_size

    r = do_cache_gc(url, list(keep_from), grace=grace, dry_run=dry_run, allow_no_roots=allow_no_roots,
                    release_keys=list(trusted_keys), policy=policy, root=obj.root)
    verb = "would delete" if r.dry_run else "deleted"
    summary = (f"{verb} {len(r.deleted_objects)} object file(s), {r.deleted_blobs} blob(s), "
               f"{human_size(r.freed_bytes)}; kept {r.kept_objects} object(s), {r.kept_blobs} blob(s) for "
               f"{len(r.roots)} node(s)")
    kept = [f"keep {name}: {why}" for name, why in r.why_kept.items()] if r.dry_run else []
    obj.emit(r.to_json(), "\n".join([*kept, *r.deleted_objects, summary]))


@cli.group()
def key() -> None:
    """Signing keys (made by `keygen`)."""


@key.command("public")
@click.argument("secret", type=click.Path(dir_okay=False))
@click.pass_obj
def key_public(obj: Context, secret: str) -> None:
    """Print the public key (name:base64) of the SECRET key file, to pass as --trusted-key or to
    write to NAME.public.

    \b
    Example:
      llmgw-store key public /etc/llmgw-store/builder-1.secret > builder-1.public
    """
    from llmgw_store.app.results import document
    from llmgw_store.cache.signing import public_key_of

    public = public_key_of(secret)
    obj.emit(document({"public_key": public}), public)
