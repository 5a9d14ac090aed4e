"""Checking a signed document, without what signing and writing need (cache/signing.py re-exports
`check_signature`): the one check every signed thing a reader takes from a cache goes through, and
on the no-op follow's path (roots/follow.py), so it loads only os, binascii, _json (system/jsontext)
and, when it verifies, PyNaCl: no re, json, pathlib or dataclasses.

A signature covers the canonical JSON of the document without its `signatures` field
(system/jsontext.canonical: the bytes keys.canonical_json gives).
"""

from __future__ import annotations

import binascii
import os
import stat

from llmgw_store.base.errors import IntegrityError, UntrustedSignature, UsageError
from llmgw_store.system import jsontext

MAX_SIGNATURES = 16
PUBLIC_BYTES = 32  # an ed25519 verify key
KEY_FILE_MAX = 4096  # a key file is one short line: more is not a key file
_SHOWN_SIGNER = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._@+-")


def signed_part(meta: dict[str, object]) -> bytes:
    return jsontext.canonical({k: v for k, v in meta.items() if k != "signatures"})


def signatures_of(meta: object, label: str) -> list[dict[str, str]]:
    """The metadata's signatures, if they have the one shape a signer writes: a short list of
    {key: str, sig: str}. Anything else is refused before a signature is looked at."""
    sigs = meta.get("signatures") if isinstance(meta, dict) else None
    if (not isinstance(sigs, list) or len(sigs) > MAX_SIGNATURES
            or not all(isinstance(s, dict) and isinstance(s.get("key"), str) and isinstance(s.get("sig"), str)
                       for s in sigs)):
        raise IntegrityError(f"{label}: its signatures are not a list of at most {MAX_SIGNATURES} "
                             "{key, sig} objects; refusing it")
    return sigs


def _shown_signer(name: str) -> str:
    return name if 1 <= len(name) <= 64 and set(name) <= _SHOWN_SIGNER else "?"


def check_signature(meta: dict[str, object], trusted: dict[str, bytes], label: str) -> str:
    """The name of the trusted key that signed `meta`; IntegrityError when none did. `label` (the
    object asked for) names it in messages: nothing unsigned is printed but signer names that look
    like key names."""
    if not trusted:
        raise UsageError("no trusted public keys: pass --trusted-key (name:base64 or a .public file)")
    sigs = signatures_of(meta, label)
    body = signed_part(meta)
    forged = False  # a signature naming a trusted key that does not verify: damaged, not untrusted
    for s in sigs:
        key = trusted.get(s["key"])
        if key is None:
            continue
        from nacl.exceptions import BadSignatureError
        from nacl.signing import VerifyKey

        try:
            sig = binascii.a2b_base64(s["sig"], strict_mode=True)  # what base64.b64decode(validate=True) is
            if len(sig) == 64:
                VerifyKey(key).verify(body, sig)
                return s["key"]
        except (BadSignatureError, ValueError):
            pass
        forged = True
    signers = ", ".join(_shown_signer(s["key"]) for s in sigs) or "nobody"
    if forged:
        raise IntegrityError(f"{label}: not signed by a trusted key: a signature naming one does not verify, "
                             f"the metadata was changed after signing (signed by: {signers}); refusing it")
    raise UntrustedSignature(f"{label}: not signed by a trusted key (signed by: {signers}); refusing it")


def _public(text: str) -> tuple[str, bytes] | None:
    """(name, 32 bytes) of `name:base64`, else None."""
    name, sep, b64 = text.strip().partition(":")
    if not sep or not name or len(b64) > 128:
        return None
    try:
        raw = binascii.a2b_base64(b64, strict_mode=True)
    except ValueError:
        return None
    return (name, raw) if len(raw) == PUBLIC_BYTES else None


def key_file_text(fd: int, st: os.stat_result, label: str) -> str:
    """The one line of the key file open at `fd` (`st`: its fstat): a regular file of at most
    KEY_FILE_MAX ASCII bytes, stripped. UsageError starting with `label` (what the file is, and
    which) otherwise. The one reader of key files (cache/signing.py's two ways of naming one, and
    `plain_trusted_keys`); the caller opened `fd` and closes it."""
    if not stat.S_ISREG(st.st_mode):
        raise UsageError(f"{label} is not a regular file")
    data = os.read(fd, KEY_FILE_MAX + 1)
    if len(data) > KEY_FILE_MAX:
        raise UsageError(f"{label} is larger than a key file ({KEY_FILE_MAX} bytes)")
    try:
        return data.decode("ascii").strip()
    except UnicodeDecodeError:
        raise UsageError(f"{label} is not a key file (name:base64)") from None


def plain_trusted_keys(values: tuple[str, ...] | list[str], environ) -> dict[str, bytes] | None:
    """signing.trusted_keys where every value is plain — a public key inline (name:base64 of 32
    bytes) or the absolute path of a public key file that system/files.open_trusted takes — else None,
    and the caller leaves the command to the full function, which says what is wrong. The same keys
    when both answer: the variable's (LLMGW_STORE_TRUSTED_KEYS) after the values, a later name
    replacing an earlier one."""
    from llmgw_store.system.files import open_trusted

    out: dict[str, bytes] = {}
    for value in [*values, *environ.get("LLMGW_STORE_TRUSTED_KEYS", "").split()]:
        key = _public(value)
        if key is None:
            if not value.startswith("/") or value.endswith(".secret"):
                return None
            try:
                fd, st = open_trusted(value)
            except OSError:  # FileRefused among them
                return None
            try:
                text = key_file_text(fd, st, value)
            except UsageError:
                return None
            finally:
                os.close(fd)
            key = _public(text)
            if key is None:
                return None
        out[key[0]] = key[1]
    return out
