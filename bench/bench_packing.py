"""How much of a format-2 object a minor upgrade fetches, per packing: the plan push makes
(cache/objects.make_plan) of two versions of an environment's files, with the blobs compressed as
push compresses them (zstd level 3).

Each side is a store path (its files as listed: bytecode and all), or a directory of wheels (e.g. `pip download 'transformers==4.46.3' tokenizers
safetensors 'numpy<2' -d OLD`, the same with 4.47.0 into NEW), unpacked into
`lib/python3.11/site-packages/` as an installer lays them out (no bytecode, no scripts: what the
wheels hold). For the new side it prints the object's compressed size, the compressed bytes of the
blobs a node holding the old side fetches (a blob any of whose files it lacks), and the changed
files' compressed size two ways: each file alone, and all of them as one zstd stream per package
(the least a pull of those bytes can fetch). `--before` also prints the packing of 4 MiB packs in
listing order (the plan before issue 31), for the comparison in docs/design-notes.md.

    python bench/bench_packing.py OLD NEW [--before] [--avg BYTES ...]
"""

from __future__ import annotations

import argparse
import sys
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import zstandard
from blake3 import blake3

from llmgw_store.cache import objects
from llmgw_store.cache.objects import Blob, make_plan, pack_digest
from llmgw_store.core.manifest import Entry

SITE = "lib/python3.11/site-packages"
LEVEL = 3


def files_of(wheels: Path) -> dict[str, bytes]:
    """path -> bytes of the files of a store path (its listing's), or of a directory of wheels."""
    out: dict[str, bytes] = {}
    if (wheels / ".llmgw" / "contents").is_file():
        from llmgw_store.cache.objects import read_listing

        for e in read_listing((wheels / ".llmgw" / "contents").read_bytes()):
            if e.kind in "fx":
                out[e.path] = (wheels / e.path).read_bytes()
        return out
    for whl in sorted(wheels.glob("*.whl")):
        with zipfile.ZipFile(whl) as z:
            for info in z.infolist():
                if not info.is_dir():
                    out[f"{SITE}/{info.filename}"] = z.read(info)
    return out


def entries_of(files: dict[str, bytes]) -> list[Entry]:
    return [Entry(p, "f", len(b), blake3(b).hexdigest()) for p, b in sorted(files.items())]


def plan_before(entries: list[Entry]) -> list[Blob]:
    """The plan of 4 MiB packs closed in listing order (before issue 31)."""
    seen, alone, groups = set(), [], {}
    for e in entries:
        if e.size == 0 or e.digest in seen:
            continue
        seen.add(e.digest)
        if e.size >= objects.BLOB_ALONE:
            alone.append(Blob(e.digest, (e.digest,), e.size))
        else:
            groups.setdefault(objects._group(e.path), []).append(e)
    packs = []
    for members in groups.values():
        chunk, total = [], 0
        for e in members + [None]:
            if e is None or (chunk and total + e.size > 4 << 20):
                if len(chunk) == 1:
                    packs.append(Blob(chunk[0].digest, (chunk[0].digest,), chunk[0].size))
                elif chunk:
                    ds = tuple(m.digest for m in chunk)
                    packs.append(Blob(pack_digest(list(ds)), ds, total))
                chunk, total = [], 0
            if e is not None:
                chunk.append(e)
                total += e.size
    return alone + packs


def measure(label: str, plan, old: list[Entry], new: list[Entry], data: dict[str, bytes]) -> None:
    zc = zstandard.ZstdCompressor(level=LEVEL)
    by_digest = {e.digest: data[e.path] for e in new}
    held = {e.digest for e in old}
    blobs = plan(new)
    csize = {b.digest: len(zc.compress(b"".join(by_digest[m] for m in b.members))) for b in blobs}
    whole = sum(csize.values())
    fetched = sum(csize[b.digest] for b in blobs if not all(m in held for m in b.members))
    changed = [e for e in new if e.size and e.digest not in held]
    alone = sum(len(zc.compress(by_digest[e.digest])) for e in {e.digest: e for e in changed}.values())
    groups: dict[str, list[bytes]] = {}
    for e in {e.digest: e for e in changed}.values():
        groups.setdefault(objects._group(e.path), []).append(by_digest[e.digest])
    together = sum(len(zc.compress(b"".join(g))) for g in groups.values())
    mib = 1 << 20
    print(f"{label}: {len(blobs)} blobs, object {whole / mib:.2f} MiB compressed; fetched {fetched / mib:.2f} MiB "
          f"= {100 * fetched / whole:.1f} % of the object; changed files {len(changed)} "
          f"({sum(e.size for e in changed) / mib:.2f} MiB raw), compressed alone {alone / mib:.2f} MiB "
          f"(fetched = {fetched / alone:.2f}x), per package {together / mib:.2f} MiB (fetched = {fetched / together:.2f}x)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--avg", type=int, action="append", help="PACK_AVG values to compare (bytes; default the store's)")
    ap.add_argument("--before", action="store_true", help="also the plan of 4 MiB packs (before issue 31)")
    args = ap.parse_args()
    old_files, new_files = files_of(args.old), files_of(args.new)
    old, new = entries_of(old_files), entries_of(new_files)
    if args.before:
        measure("before (4 MiB packs in listing order)", plan_before, old, new, new_files)
    for avg in args.avg or [objects.PACK_AVG]:
        objects.PACK_AVG = avg
        measure(f"content-defined packs of {avg >> 10} KiB on average", make_plan, old, new, new_files)


if __name__ == "__main__":
    main()
