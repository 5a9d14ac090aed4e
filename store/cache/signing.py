"""Signing keys and signatures of binary-cache metadata (ed25519, as Nix's binary caches).

Keys are `name:base64` (as Nix writes them): `<name>.secret` holds the 32-byte ed25519 seed,
`<name>.public` the verify key. A signature covers the canonical JSON of the metadata without its
`signatures` field. A metadata document is at most METADATA_MAX_BYTES: a reader takes no more of
one before it is checked (push writes a few KiB).
"""

from __future__ import annotations

import base64
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmgw_store.core.errors import IntegrityError, UsageError
from llmgw_store.core.files import write_outside
from llmgw_store.core.keys import canonical_json
from llmgw_store.core.names import check_signing_key_name
from llmgw_store.core.results import Result

METADATA_MAX_BYTES = 1 << 20


@dataclass(frozen=True)
class KeyPair(Result):
    secret: str  # the secret key's file (0600)
    public: str  # the public key's file
    public_key: str  # name:base64, to pass as --trusted-key


def keygen(name: str, out_dir: str | Path) -> dict[str, str]:
    from nacl.signing import SigningKey

    check_signing_key_name(name)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sk = SigningKey.generate()
    secret, public = out / f"{name}.secret", out / f"{name}.public"
    public_text = f"{name}:{base64.b64encode(bytes(sk.verify_key)).decode()}"
    # Both files outside the root the safe way (core/files.write_outside: a checked directory, a
    # random O_EXCL name, renamed over); the secret never replaces anything, a link included.
    try:
        write_outside(secret, f"{name}:{base64.b64encode(bytes(sk)).decode()}\n".encode(), mode=0o600, exclusive=True)
    except FileExistsError:
        raise UsageError(f"{secret} exists; refusing to overwrite a secret key") from None
    write_outside(public, (public_text + "\n").encode(), mode=0o644)
    return KeyPair(str(secret), str(public), public_text)


def key_text(value: str) -> str:
    """A key given inline (`name:base64`) or as a file holding it."""
    if os.path.isfile(value):
        return Path(value).read_text().strip()
    return value.strip()


def parse_key(text: str, what: str) -> tuple[str, bytes]:
    name, _, b64 = text.partition(":")
    try:
        raw = base64.b64decode(b64, validate=True)
    except ValueError:
        raw = b""
    if not name or len(raw) != 32:
        raise UsageError(f"{what} is not a key of the form name:base64 (32 bytes)")
    return name, raw


def trusted_keys(values: list[str] | tuple[str, ...]) -> dict[str, bytes]:
    keys = dict(parse_key(key_text(v), f"trusted key {v!r}") for v in values)
    for v in os.environ.get("LLMGW_STORE_TRUSTED_KEYS", "").split():
        name, raw = parse_key(key_text(v), f"trusted key {v!r} (LLMGW_STORE_TRUSTED_KEYS)")
        keys[name] = raw
    return keys


def signed_part(meta: dict[str, Any]) -> bytes:
    return canonical_json({k: v for k, v in meta.items() if k != "signatures"})


def sign(meta: dict[str, Any], secret: str) -> None:
    from nacl.signing import SigningKey

    name, seed = parse_key(key_text(secret), "the secret key")
    sig = SigningKey(seed).sign(signed_part(meta)).signature
    meta.setdefault("signatures", []).append({"key": name, "sig": base64.b64encode(sig).decode()})


MAX_SIGNATURES = 16
_SHOWN_SIGNER_RE = re.compile(r"[A-Za-z0-9._@+-]{1,64}")


def _signatures(meta: object, label: str) -> list[dict[str, str]]:
    """The metadata's signatures, if they have the one shape a signer writes: a short list of
    {key: str, sig: str}. Anything else is refused before a signature is looked at."""
    sigs = meta.get("signatures") if isinstance(meta, dict) else None
    if (not isinstance(sigs, list) or len(sigs) > MAX_SIGNATURES
            or not all(isinstance(s, dict) and isinstance(s.get("key"), str) and isinstance(s.get("sig"), str)
                       for s in sigs)):
        raise IntegrityError(f"{label}: its signatures are not a list of at most {MAX_SIGNATURES} "
                             "{key, sig} objects; refusing it")
    return sigs


def check_signature(meta: dict[str, Any], trusted: dict[str, bytes], label: str) -> str:
    """The name of the trusted key that signed `meta`; IntegrityError when none did. `label` (the
    object asked for) names it in messages: nothing unsigned is printed but signer names that look
    like key names."""
    from nacl.exceptions import BadSignatureError
    from nacl.signing import VerifyKey

    if not trusted:
        raise UsageError("no trusted public keys: pass --trusted-key (name:base64 or a .public file)")
    sigs = _signatures(meta, label)
    body = signed_part(meta)
    for s in sigs:
        key = trusted.get(s["key"])
        if key is None:
            continue
        try:
            sig = base64.b64decode(s["sig"], validate=True)
            if len(sig) == 64:
                VerifyKey(key).verify(body, sig)
                return s["key"]
        except (BadSignatureError, ValueError):
            continue
    signers = ", ".join(s["key"] if _SHOWN_SIGNER_RE.fullmatch(s["key"]) else "?" for s in sigs) or "nobody"
    raise IntegrityError(f"{label}: not signed by a trusted key (signed by: {signers}); refusing it")
