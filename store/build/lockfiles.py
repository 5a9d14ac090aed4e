"""The two lock formats a store path can hold, and the pyproject that routes packages to indexes.

- `requirements.lock`: `uv pip compile --generate-hashes` output, one `name==version` per package
  with its `--hash=sha256:` lines (builds with one index).
- `pylock.toml`: PEP 751, from a pyproject that names a second index as explicit and maps exactly
  the recipe's `index_packages` to it (builds with PyTorch's index). Each package records the URL
  it resolved from, so where every wheel comes from is part of the lock.
"""

from __future__ import annotations

import json
import re
import tomllib

PIN_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;\\]+)")
EXTRA_INDEX_NAME = "extra"


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pyproject_with_index(requirements: list[str], index_url: str, packages: list[str], python_version: str) -> str:
    """A pyproject whose dependencies are `requirements`, with `index_url` explicit (used only by
    the packages mapped to it in [tool.uv.sources]). uv applies sources to direct dependencies only,
    so each index package is also made a direct dependency (unconstrained unless the requirements
    constrain it): the index packages are always installed."""
    major_minor = ".".join(python_version.split(".")[:2])
    named = {normalize(re.split(r"[\s\[<>=!~;@]", r, maxsplit=1)[0]) for r in requirements}
    requirements = requirements + [p for p in packages if normalize(p) not in named]
    lines = [
        "[project]",
        'name = "llmgw-environment"',
        'version = "0"',
        f'requires-python = ">={major_minor}"',
        "dependencies = [" + ", ".join(json.dumps(r) for r in requirements) + "]",
        "",
        "[[tool.uv.index]]",
        f'name = "{EXTRA_INDEX_NAME}"',
        f"url = {json.dumps(index_url)}",
        "explicit = true",
        "",
        "[tool.uv.sources]",
    ]
    lines += [f'{json.dumps(normalize(p))} = {{ index = "{EXTRA_INDEX_NAME}" }}' for p in packages]
    return "\n".join(lines) + "\n"


def pins(lock_text: str, lock_name: str) -> dict[str, str]:
    """Package -> version, from either lock format (names normalised)."""
    if lock_name.endswith(".toml"):
        doc = tomllib.loads(lock_text)
        return {normalize(p["name"]): str(p.get("version", "")) for p in doc.get("packages", [])}
    out = {}
    for line in lock_text.splitlines():
        m = PIN_RE.match(line)
        if m:
            out[normalize(m.group(1))] = m.group(2)
    return out


def sources(lock_text: str) -> dict[str, list[str]]:
    """Package -> the URLs of its files, from a pylock.toml (where each package comes from)."""
    doc = tomllib.loads(lock_text)
    out = {}
    for p in doc.get("packages", []):
        urls = [w.get("url", "") for w in p.get("wheels", [])]
        if "sdist" in p:
            urls.append(p["sdist"].get("url", ""))
        out[normalize(p["name"])] = urls
    return out
