"""Why a key came from no binary cache, for a --substitute-only command: the one typed error
(base/errors.py's NotSubstituted family) whose line says the cause and the action.

    untrusted    a cache has the key, signed by no trusted key          add the builder's key
    damaged      a cache has the key, and it failed a check             push it again from the builder
    unreachable  a cache could not be asked (after its retries)         bring the cache back, run again
    miss         every cache answered that it lacks the key             push it, or align the key's inputs

A finding about the key itself outranks one about a cache that could not be asked, which outranks
a plain miss (a cache that was down might have had it). On a miss, the caches that answered are
listed (at most MAX_NEIGHBOURS of their newest objects) for objects of the same engine, version
and variant, and the key inputs in which they differ from this node's are named: a builder and a
node that disagree on an input (the interpreter, uv, the index, the platform, as_of) ask for two
keys. Only metadata a trusted key signed is read past its signature; what it says is printed
bounded (`_short`).
"""

from __future__ import annotations

import json
from typing import Any

from llmgw_store.base.errors import (
    CacheDamaged,
    CacheMiss,
    CacheUnreachable,
    CacheUntrusted,
    IntegrityError,
    NetworkError,
    NotSubstituted,
    StoreError,
    UntrustedSignature,
)
from llmgw_store.cache.caches import Caches, shown
from llmgw_store.cache.signing import METADATA_MAX_BYTES, check_signature
from llmgw_store.core.keys import is_store_name

MAX_NEIGHBOURS = 64  # objects' metadata read per cache to explain a miss (newest first)
MAX_SHOWN = 3  # neighbours named in the line (the JSON has them all)
_RANK = {"untrusted": 0, "damaged": 1, "unreachable": 2, "miss": 3}
ERRORS: dict[str, type[NotSubstituted]] = {"untrusted": CacheUntrusted, "damaged": CacheDamaged,
                                            "unreachable": CacheUnreachable, "miss": CacheMiss}
# The key inputs a person sets, with the words a message uses for them.
_WORDS = {"python": "interpreter", "uv": "uv", "platform": "platform", "index_url": "index", "as_of": "as-of",
          "build": "recipe's build", "schema": "key schema", "pypi": "package", "binary": "binary", "repo": "repo"}


def cause_of(exc: BaseException | None) -> str:
    """The cause a cache's failure stands for."""
    if isinstance(exc, UntrustedSignature):
        return "untrusted"
    if isinstance(exc, IntegrityError):
        return "damaged"
    if isinstance(exc, NetworkError):
        return "unreachable"
    return "miss"


def refusal(caches: Caches, trusted: dict[str, bytes], key: str, name: str, inputs: dict[str, Any] | None,
            failure: BaseException | None = None) -> NotSubstituted:
    """The error a --substitute-only command ends with when `key` (`name`) came from no cache in
    `caches`; `failure`: what stopped the last attempt outside a cache's own passing over (a
    check of the whole object), `inputs`: this node's key inputs."""
    failed = caches.failed
    outcomes = {url: cause_of(failed.get(url)) for url in caches.urls}
    if failure is not None and isinstance(failure, (NetworkError, IntegrityError)):
        url = getattr(failure, "cache", None)
        hit = next((u for u in caches.urls if shown(u) == url), None) if url else None
        for u in ([hit] if hit else [u for u, c in outcomes.items() if c == "miss"][:1]):
            outcomes[u] = cause_of(failure)
            failed.setdefault(u, failure)
    cause = min(outcomes.values(), key=_RANK.__getitem__)
    details: dict[str, Any] = {
        "cause": cause, "key": key, "name": name,
        "caches": [{"url": shown(u), "outcome": c, **({"problem": str(failed[u])} if u in failed else {})}
                   for u, c in outcomes.items()],
    }
    if inputs:
        details["inputs"] = inputs
    where = [u for u, c in outcomes.items() if c == cause]
    first = failed.get(where[0]) if where else None
    asked = ", ".join(shown(u) for u in caches.urls)
    head = "--substitute-only: "
    if cause == "untrusted":
        text = (f"{head}{shown(where[0])} has {name}, but signed only by keys this node does not trust ({first}); "
                "nothing was built: add the builder's public key to trusted_keys (--trusted-key), or push it "
                "signed by a key this node trusts")
    elif cause == "damaged":
        text = (f"{head}{shown(where[0])} serves {name} damaged ({first}); nothing was built: push it again from "
                "the builder (the cache's copy is bad), then run this again")
    elif cause == "unreachable":
        text = (f"{head}{name} (key {key}) could not be asked of {', '.join(shown(u) for u in where)} ({first}; "
                "after its retries); nothing was built: bring the cache back or fix this node's route to it, "
                "then run this again")
    else:
        found = neighbours(caches, trusted, name, inputs or {}, [u for u, c in outcomes.items() if c == "miss"])
        details["candidates"] = found
        text = f"{head}no binary cache has {name} (key {key}; asked: {asked}); nothing was built: "
        if found:
            text += ("the caches hold " + "; ".join(_said(c) for c in found[:MAX_SHOWN])
                     + (f" (and {len(found) - MAX_SHOWN} more)" if len(found) > MAX_SHOWN else "")
                     + ": give this node the builder's settings for those key inputs, or push it from a builder")
        else:
            text += "push it from a builder, or drop --substitute-only to build here"
    return ERRORS[cause](text, details=details)


def _said(candidate: dict[str, Any]) -> str:
    differs = candidate["differs"]
    parts = [f"{_WORDS.get(d['input'].split('.')[0], d['input'])} ({d['input']} {d['cache']} there, "
             f"{d['here']} here)" for d in differs[:4]]
    return f"{candidate['name']}, whose key differs in " + (", ".join(parts) if parts else "nothing recorded")


def neighbours(caches: Caches, trusted: dict[str, bytes], name: str, inputs: dict[str, Any],
               urls: list[str]) -> list[dict[str, Any]]:
    """The objects of the same engine, version and variant as `name` the caches `urls` hold (each
    `name`, `key`, `cache`, `differs`: the key inputs that differ from `inputs`), those that differ
    in fewest inputs first."""
    suffix = name[33:]
    found: list[dict[str, Any]] = []
    for url in urls:
        try:
            backend = caches.backend(url)
            listing = sorted((i for i in backend.list("") if i.regular and i.name.endswith(".json")),
                             key=lambda i: -i.mtime)[:MAX_NEIGHBOURS]
            for item in listing:
                doc = _signed(backend, item.name, trusted)
                if doc is None or doc["name"][33:] != suffix or doc["name"] == name:
                    continue
                signed = doc.get("inputs")
                other = signed if isinstance(signed, dict) else {}
                found.append({"name": doc["name"], "key": doc["key"], "cache": shown(url),
                              "differs": differences(other, inputs)})
        except StoreError:
            continue  # an explanation only: a cache that cannot be listed explains nothing
    found.sort(key=lambda c: len(c["differs"]))  # the closest first (stable: newest first among equals)
    return found


def _signed(backend, label: str, trusted: dict[str, bytes]) -> dict[str, Any] | None:
    """An object's metadata, only if a trusted key signed it and its name is a store path name."""
    try:
        data = backend.get(label, max_bytes=METADATA_MAX_BYTES)
        doc = json.loads(data) if data is not None else None
        if not isinstance(doc, dict) or not isinstance(doc.get("signatures"), list):
            return None
        check_signature(doc, trusted, label)
    except (StoreError, ValueError, RecursionError):
        return None
    if not isinstance(doc.get("name"), str) or not is_store_name(doc["name"]) or not isinstance(doc.get("key"), str):
        return None
    return doc


def differences(cache: dict[str, Any], here: dict[str, Any], prefix: str = "") -> list[dict[str, str]]:
    """The key inputs (dotted: `python.version`) whose values differ, each `input`, `cache`, `here`."""
    out: list[dict[str, str]] = []
    for k in sorted(set(cache) | set(here), key=str)[:64]:
        a, b = cache.get(k), here.get(k)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict) and not prefix:
            out += differences(a, b, f"{k}.")
        else:
            out.append({"input": _short(f"{prefix}{k}"), "cache": _short(a), "here": _short(b)})
    return out


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 80 else text[:79] + "…"
