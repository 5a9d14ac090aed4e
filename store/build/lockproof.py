"""The one proof that a store path's manifest holds the lock the path was installed from.

Kept apart from build/rebuild.py (which loads the builder) because generation records prove the
lock on every activation (roots/records.py): this imports only the manifest reader and blake3.
`build --check` and `verify --repair` (through rebuild.py) and records all use `proved_lock`.
"""

from __future__ import annotations

from pathlib import Path

from blake3 import blake3

from llmgw_store.base.errors import IntegrityError
from llmgw_store.core import manifest
from llmgw_store.core.keys import key_of_name

LOCK_FORMATS = ("requirements.lock", "pylock.toml")


def proved_lock(env: Path, name: str, recorded_hash: str) -> tuple[str, str]:
    """(lock text, lock format) of the store path `env` named `name`, once proved to be the lock it
    was installed from: its manifest names it (name and key), its contents listing hashes to the
    manifest's content hash and to `recorded_hash` (the index's), the format is one a build writes,
    and the manifest's lock text hashes to the listed digest of that lock file. Read without
    following a link, bounded (core/manifest.py). IntegrityError saying why otherwise."""
    why = None
    try:
        doc = manifest.read(env)
        listing = manifest.read_contents(env)
        if not isinstance(doc, dict) or doc.get("name") != name or doc.get("key") != key_of_name(name):
            why = "its manifest names another store path"
        elif not manifest.content_hash(listing) == doc.get("content_hash") == recorded_hash:
            why = "its listing does not hash to the content hash the index records"
        elif not isinstance(doc.get("lock"), str) or doc.get("lock_format") not in LOCK_FORMATS:
            why = "its manifest records no lock"
        else:
            path = f"{manifest.MANIFEST_DIR}/{doc['lock_format']}"
            listed = [e for e in listing if e.path == path and e.kind == "f"]
            if not listed or blake3(doc["lock"].encode()).hexdigest() != listed[0].digest:
                why = "the lock text in its manifest is not the lock file its listing records"
            else:
                return doc["lock"], doc["lock_format"]
    except (OSError, ValueError) as exc:
        why = str(exc)
    raise IntegrityError(f"the lock {name} was built from cannot be proved ({why}); "
                         f"`llmgw-store verify {name}` says what changed")
