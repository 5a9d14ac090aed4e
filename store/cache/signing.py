"""Signing keys and signatures of binary-cache metadata (ed25519, as Nix's binary caches).

Key files are `name:base64(bytes)`, as Nix writes them, and the two kinds cannot be confused:

    NAME.secret   name:base64(64 bytes)   the ed25519 seed followed by its public key (libsodium's
                                          and Nix's secret key), written 0600, exclusively
    NAME.public   name:base64(32 bytes)   the public key, to pass as --trusted-key

A secret key's trailing 32 bytes must be the public key its seed derives, so a damaged or spliced
file is refused before anything is signed. Secret files written before this format (`keygen` of
0.1.0 wrote the bare 32-byte seed, the same shape as a public key) are still read, but only from a
file named `*.secret`: 32 bytes anywhere else — a `.public` file, an inline key — are a public key,
and signing with one is refused (exit 2) before any object is looked at. `llmgw-store key public
SECRET` prints the public key of either format.

A signature covers the canonical JSON of the metadata without its `signatures` field. A metadata
document is at most METADATA_MAX_BYTES: a reader takes no more of one before it is checked (push
writes a few KiB).
"""

from __future__ import annotations

import base64
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmgw_store.app.results import Result
from llmgw_store.base.errors import IntegrityError, UsageError
from llmgw_store.base.text import shown
from llmgw_store.cache.signatures import (
    MAX_SIGNATURES,
    check_signature,  # noqa: F401  (re-exported; checking is lean there)
    key_file_text,
)
from llmgw_store.cache.signatures import signatures_of as _signatures
from llmgw_store.core.keys import canonical_json
from llmgw_store.core.names import check_signing_key_name, inline_key
from llmgw_store.system.files import FileRefused, open_trusted, write_outside

METADATA_MAX_BYTES = 1 << 20
PUBLIC_BYTES = 32  # an ed25519 verify key
SECRET_BYTES = 64  # seed + verify key, as libsodium's crypto_sign secret key and Nix's key files


@dataclass(frozen=True)
class KeyPair(Result):
    secret: str  # the secret key's file (0600)
    public: str  # the public key's file
    public_key: str  # name:base64, to pass as --trusted-key


@dataclass(frozen=True)
class SecretKey:
    """A signing key read from its file (never printed: its repr shows the name only)."""

    name: str
    seed: bytes = field(repr=False)

    @property
    def public_key(self) -> str:
        """`name:base64(32-byte public key)`, the text of NAME.public."""
        from nacl.signing import SigningKey

        return f"{self.name}:{base64.b64encode(bytes(SigningKey(self.seed).verify_key)).decode()}"


def _where(path: str | Path) -> str:
    return shown(str(path), 240)  # long enough for the file's name to show, bounded all the same


def _encoded(name: str, raw: bytes) -> str:
    return f"{name}:{base64.b64encode(raw).decode()}\n"


def keygen(name: str, out_dir: str | Path) -> KeyPair:
    """Write NAME.secret (0600) and NAME.public into `out_dir`, which must be root's or this user's
    and open to no one else (sticky excepted; system/files.write_outside, UnsafePathError otherwise).
    Both are created exclusively and never through a link: an existing file, or a link planted where
    one goes, is refused and nothing is overwritten; if the second cannot be made, the first is
    removed."""
    from nacl.signing import SigningKey

    check_signing_key_name(name)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sk = SigningKey.generate()
    public_raw = bytes(sk.verify_key)
    secret, public = out / f"{name}.secret", out / f"{name}.public"
    for path in (secret, public):
        if os.path.lexists(path):
            raise UsageError(f"{path} exists; refusing to overwrite a key file (choose another NAME or --out)")
    # Both files outside the root the safe way (system/files.write_outside: a checked directory, a
    # random O_EXCL|O_NOFOLLOW name, then link(2), which replaces nothing — a link planted since
    # the check included).
    try:
        write_outside(secret, _encoded(name, bytes(sk) + public_raw).encode(), mode=0o600, exclusive=True)
    except FileExistsError:
        raise UsageError(f"{secret} exists; refusing to overwrite a key file") from None
    try:
        write_outside(public, _encoded(name, public_raw).encode(), mode=0o644, exclusive=True)
    except BaseException as exc:
        os.unlink(secret)
        if isinstance(exc, FileExistsError):
            raise UsageError(f"{public} exists; refusing to overwrite a key file") from None
        raise
    return KeyPair(str(secret), str(public), _encoded(name, public_raw).strip())


def _read_key_file(path: str | Path, what: str) -> str:
    """A key file's one line: a regular file (a link to one is followed: secrets are often mounted
    that way), read by signatures.key_file_text. UsageError naming the file otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise UsageError(f"{what} {_where(path)}: no such file") from None
    except OSError as exc:
        raise UsageError(f"{what} {_where(path)}: {exc.strerror}") from None
    try:
        return key_file_text(fd, os.fstat(fd), f"{what} {_where(path)}")
    finally:
        os.close(fd)


def _decode(text: str) -> tuple[str, bytes] | None:
    """(name, bytes) of `name:base64`, or None when it is not of that form."""
    name, sep, b64 = text.partition(":")
    if not sep or not name:
        return None
    try:
        return name, base64.b64decode(b64, validate=True)
    except ValueError:
        return None


def load_secret(path: SecretKey | str | Path) -> SecretKey:
    """The signing key in the file `path` (see the module docstring for the formats). A missing
    file, a public key, a key of any other shape, or a secret key whose two halves do not belong
    together is a UsageError (exit 2) naming the file, never showing its bytes."""
    from nacl.signing import SigningKey

    what = "the secret key"
    if isinstance(path, SecretKey):
        return path
    text = _read_key_file(path, what)
    decoded = _decode(text)
    where = _where(path)
    if decoded is None:
        raise UsageError(f"{what} {where} is not a key file (name:base64)")
    name, raw = decoded
    if len(raw) == SECRET_BYTES:
        seed, public = raw[:32], raw[32:]
        if bytes(SigningKey(seed).verify_key) != public:
            raise UsageError(f"{what} {where} is damaged: its public half is not its seed's")
    elif len(raw) == PUBLIC_BYTES and str(path).endswith(".secret"):
        seed = raw  # the 0.1.0 format: the bare seed, in a file keygen named NAME.secret
    elif len(raw) == PUBLIC_BYTES:
        raise UsageError(f"{what} {where} is a public key (32 bytes); sign with its .secret file (64 bytes)")
    else:
        raise UsageError(f"{what} {where} holds {len(raw)} bytes, not an ed25519 secret key ({SECRET_BYTES})")
    try:
        check_signing_key_name(name)
    except UsageError as exc:
        raise UsageError(f"{what} {where}: {exc}") from None
    return SecretKey(name, seed)


def public_key_of(path: str | Path) -> str:
    """`llmgw-store key public SECRET`: the public key (name:base64) of the secret key file."""
    return load_secret(path).public_key


def key_text(value: str, what: str | None = None) -> str:
    """A public key given inline (`name:base64`, see `inline_key`), else the text of the key file
    `value` names: an absolute path (a relative one would be looked up wherever the command runs),
    to a file no other user could have written (system/files.open_trusted, the config file's rule:
    the file, every directory above it and every link on the way root's or this user's and closed
    to others). UsageError naming the value (`what`: how, by default as a key file) otherwise."""
    what = what or f"the key file {_where(value)}"
    if inline_key(value) is not None:
        return value.strip()
    if not value.startswith("/"):
        raise UsageError(f"{what} is neither a key (name:base64 of {PUBLIC_BYTES} bytes) nor a key file's absolute "
                         "path; name a key file by its absolute path")
    try:
        fd, st = open_trusted(value)
    except FileRefused as exc:
        raise UsageError(f"refusing {what}: it {exc.reason}; only root or you may be able to write "
                         "it, the directories above it and the links on the way") from None
    except FileNotFoundError:
        raise UsageError(f"{what}: no such file") from None
    except OSError as exc:
        raise UsageError(f"{what}: {exc.strerror or exc}") from None
    try:
        return key_file_text(fd, st, what)
    finally:
        os.close(fd)


def parse_key(text: str, what: str) -> tuple[str, bytes]:
    """A public key (`name:base64` of 32 bytes). A secret key is refused by its shape (64 bytes)."""
    decoded = _decode(text)
    if decoded is not None and len(decoded[1]) == SECRET_BYTES:
        raise UsageError(f"{what} is a secret key; trust its public key instead (`llmgw-store key public FILE`)")
    if decoded is None or len(decoded[1]) != PUBLIC_BYTES:
        raise UsageError(f"{what} is not a key of the form name:base64 (32 bytes)")
    return decoded


def trusted_keys(values: list[str] | tuple[str, ...]) -> dict[str, bytes]:
    keys = dict(_trusted(v, f"trusted key {shown(v, 240)}") for v in values)
    for v in os.environ.get("LLMGW_STORE_TRUSTED_KEYS", "").split():
        name, raw = _trusted(v, f"trusted key {shown(v, 240)} (LLMGW_STORE_TRUSTED_KEYS)")
        keys[name] = raw
    return keys


def _trusted(value: str, what: str) -> tuple[str, bytes]:
    text = key_text(value, what)
    if value.endswith(".secret") and inline_key(value) is None:
        raise UsageError(f"{what} is a secret key file; trust its .public (`llmgw-store key public {_where(value)}`)")
    return parse_key(text, what)


def signed_part(meta: dict[str, Any]) -> bytes:
    return canonical_json({k: v for k, v in meta.items() if k != "signatures"})


def sign(meta: dict[str, Any], secret: SecretKey | str | Path) -> None:
    """Sign `meta` with `secret` (a SecretKey, or the file holding one)."""
    from nacl.signing import SigningKey

    key = load_secret(secret)
    sig = SigningKey(key.seed).sign(signed_part(meta)).signature
    meta.setdefault("signatures", []).append({"key": key.name, "sig": base64.b64encode(sig).decode()})


_SHOWN_SIGNER_RE = re.compile(r"[A-Za-z0-9._@+-]{1,64}")


def _parsed(data: bytes | None) -> dict[str, Any] | None:
    import json

    try:
        doc = json.loads(data) if data else None
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def carry_signatures(meta: dict[str, Any], current: bytes | None, label: str, drop: tuple[str, ...] = ()) -> None:
    """Key rotation with overlap: `meta`, just signed by one key, also keeps the signatures of the
    cache's metadata `current` by other keys — when `current` signs exactly the bytes `meta` does
    (else they are over other bytes, and go) — in their order, this key's own in its place or last;
    but none by a key named in `drop` (`push --drop-signature`, the end of a rotation). More than
    MAX_SIGNATURES (a node reads no more) is a UsageError naming the way out."""
    mine = meta["signatures"][-1]
    if mine["key"] in drop:
        raise UsageError(f"--drop-signature {mine['key']}: that is the key this push signs with; sign with the new "
                         "key and drop the old one")
    doc = _parsed(current)
    try:
        theirs = _signatures(doc, label) if doc is not None and signed_part(doc) == signed_part(meta) else []
    except IntegrityError:
        theirs = []  # not the shape a signer writes: replaced
    out, placed = [], False
    for s in theirs:
        if s["key"] == mine["key"]:
            if not placed:
                out.append(mine)
                placed = True
        elif s["key"] not in drop:
            out.append({"key": s["key"], "sig": s["sig"]})
    if not placed:
        out.append(mine)
    if len(out) > MAX_SIGNATURES:
        raise UsageError(f"{label}: already signed by {len(out) - 1} keys, the most a node reads is {MAX_SIGNATURES}; "
                         "end a rotation first (push --drop-signature NAME with the old key's name)")
    meta["signatures"] = out


def signature_change(current: bytes | None, written: bytes) -> str:
    """What a push changed of the signatures alone (`current` and `written` signing the same bytes),
    in words; "" when the signed bytes differ or the signatures are the same."""
    old, new = _parsed(current), _parsed(written)
    if old is None or new is None or signed_part(old) != signed_part(new):
        return ""
    keys = [[s.get("key") for s in d.get("signatures") or [] if isinstance(s, dict)] for d in (old, new)]
    added = [k for k in keys[1] if k not in keys[0]]
    dropped = [k for k in keys[0] if k not in keys[1]]
    words = [f"signature of {k} {how}" for how, ks in (("added", added), ("dropped", dropped)) for k in
             (k if isinstance(k, str) and _SHOWN_SIGNER_RE.fullmatch(k) else "?" for k in ks)]
    return ", ".join(words) or ("signatures rewritten" if old != new else "")


def signs_same(written: bytes, current: bytes | None, key_name: str) -> bool:
    """Whether `current` signs the very bytes `written` does and holds `written`'s signature by
    `key_name`: ed25519 is deterministic, so only that key wrote those bytes there."""
    new, old = _parsed(written), _parsed(current)
    if new is None or old is None or signed_part(new) != signed_part(old):
        return False
    mine = [s for s in new.get("signatures") or [] if isinstance(s, dict) and s.get("key") == key_name]
    sigs = old.get("signatures")
    return len(mine) == 1 and isinstance(sigs, list) and mine[0] in sigs
