"""Making an environment from a plan: venv, resolve (or a recorded lock), install, bytecode, the
binary check, then (once frozen) the recipe's verify command and the GPU check. Called by realise
under the key's lock, into the `.partial` it hands over.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from llmgw_store.app import credentials, debug, network
from llmgw_store.app.units import human_size
from llmgw_store.base.errors import CommandError, RecipeError, StoreError
from llmgw_store.base.report import say
from llmgw_store.build import bytecode, cacheuse, canonical, indexpins, lockfiles, wheelhome
from llmgw_store.build import uv as uvmod
from llmgw_store.build.plan import BuildPlan, check_requirements
from llmgw_store.build.realise import HANDOFF
from llmgw_store.build.recipe import parse_time
from llmgw_store.core.local_store import Store
from llmgw_store.system.trees import force_rmtree, free_bytes

DEFAULT_TIMEOUT_S = 3600.0


class Deadline:
    """The build's time limit (the recipe's `timeout`), shared by install and verify."""

    def __init__(self, plan: BuildPlan):
        self.seconds = float(plan.fields.get("timeout", DEFAULT_TIMEOUT_S))
        self.at = time.monotonic() + self.seconds
        self.name = plan.name

    def remaining(self) -> float:
        left = self.at - time.monotonic()
        if left <= 0:
            raise StoreError(f"the build of {self.name} ran past its timeout of {self.seconds:.0f}s")
        return left


def make_env(store: Store, plan: BuildPlan, partial: Path, deadline: Deadline,
             steps: dict[str, float] | None = None) -> dict[str, Any]:
    """venv, resolve (or take `plan.lock_text` as it is, for a repair), install, check the binary.
    Each step's seconds go into `steps` (the build's result shows them)."""
    fields, uv, interp = plan.fields, plan.uv, plan.interpreter
    steps = {} if steps is None else steps
    mark = [time.monotonic()]

    def step(name: str) -> None:
        now = time.monotonic()
        steps[name] = round(steps.get(name, 0.0) + now - mark[0], 3)
        mark[0] = now
    requirements = check_requirements(plan)
    layout = store.layout
    remaining = deadline.remaining

    if "free_gb" in fields:
        free = free_bytes(layout.store)
        if free < fields["free_gb"] * 1e9:
            raise StoreError(
                f"only {human_size(free)} free under {layout.store}, the build needs {fields['free_gb']} GB "
                f"(free_gb, 10^9 bytes each); "
                "run `llmgw-store gc` or free space"
            )
    env = uvmod.clean_env(
        UV_NO_CONFIG="1",
        UV_CACHE_DIR=str(plan.uv_cache or layout.uv_cache),
        UV_PYTHON_INSTALL_DIR=str(layout.python_installs),
        UV_PYTHON_DOWNLOADS="never",
        TMPDIR=str(layout.tmp),
        **({"UV_OFFLINE": "1"} if plan.offline or network.is_offline() else {}),
    )
    # uv alone learns the index, and its credentials, from its environment: never from its argv
    # (/proc/<pid>/cmdline is world-readable), never in a log or a line shown (app/credentials.py).
    uv_env = {**env, "UV_INDEX_URL": credentials.with_auth(plan.index_url, plan.index_auth)}
    python = partial / "bin" / "python"
    meta_dir = partial / ".llmgw"
    meta_dir.mkdir()

    def uv_run(args: list, what: str, cwd: Path = layout.tmp) -> str:
        return uvmod.run([uv.path, *args], what=what, env=uv_env, log_dir=layout.logs, cwd=cwd,
                         timeout=remaining(), show=say)

    say(f"creating the environment ({interp.implementation} {interp.version}, {interp.path})")
    uv_run(["venv", "--relocatable", "--allow-existing", "--python", interp.path, partial], "uv venv")
    step("venv")
    debug.pause("BUILD_PAUSE")  # a .partial with a venv exists: concurrent builders meet here
    mark[0] = time.monotonic()
    requirements = requirements + _fetch_extras(store, plan, partial)
    step("fetch")
    extra_index = fields.get("extra_index")
    lock = meta_dir / ("pylock.toml" if extra_index else "requirements.lock")
    index_pins = _index_pins(store, plan, requirements, python, uv_run)
    if extra_index:
        # PEP 751 with an explicit second index: only `index_packages` may come from it; every
        # other package, even one the second index also offers (the 2022 torchtriton confusion),
        # resolves from the main index.
        source = meta_dir / "pyproject.toml"
        source.write_text(lockfiles.pyproject_with_index(indexpins.requirements_with_pins(requirements, index_pins),
                                                         extra_index, fields["index_packages"], interp.version))
    else:
        source = meta_dir / "requirements.in"
        source.write_text("".join(r + "\n" for r in requirements))

    as_of = plan.inputs["as_of"]
    if plan.lock_text is not None:
        lock.write_text(plan.lock_text)
    else:
        where = plan.index_url + (f" (and {extra_index} for {', '.join(fields['index_packages'])})" if extra_index else "")
        say(f"resolving {len(requirements)} requirement(s) as {where} stood at {as_of}")
        fmt = ["--format", "pylock.toml"] if extra_index else ["--generate-hashes"]
        if extra_index:
            indexpins.check_index(extra_index, fields, index_pins, plan.origin, f"build[{plan.build_index}]")
            fmt += indexpins.exempt_args(index_pins)  # pinned: the pin, not a date, decides
        # Run in .llmgw/ with relative names: uv's `# via -r requirements.in` then names no
        # directory, so the lock (a file of the tree) is the same in every root (reproducible).
        uv_run(
            ["pip", "compile", source.name, "-o", lock.name, *fmt, "--exclude-newer", as_of,
             "--python", python, "--no-header", "--quiet"],
            "uv pip compile", cwd=meta_dir,
        )
        indexpins.check_lock(lock.read_text(), index_pins)
    step("resolve")
    lock_text = lock.read_text()
    pinned = lockfiles.pins(lock_text, lock.name)
    _check_engine_version(plan, pinned)
    pins = len(pinned)
    # Linked from the wheel home (uv's archive bucket is the store's, see wheelhome.py): the tree
    # shares inodes only with sealed, checked store files. A private cache (a repair, a check) is
    # copied from, never linked: it is deleted after the build. Not `clone` either: uv 0.13 falls
    # back from a failed reflink to a HARDLINK (ext4, tmpfs).
    linking = plan.uv_cache is None and wheelhome.attach(layout)
    say(f"installing {pins} pinned package(s) with --require-hashes --no-deps"
        + (" (linked from the wheel home)" if linking else " (copied)"))
    uv_run(
        ["pip", "install", "--require-hashes", "--no-deps", "-r", lock,
         "--python", python, "--link-mode", "hardlink" if linking else "copy"],  # not --quiet: progress detail
        "uv pip install",
    )
    debug.pause("WHEELS_LINKED")  # uv has linked the wheel home's files into the .partial
    handoff = wheelhome.adopt(layout, partial) if linking else None
    # what gc keeps for repair and cold rollback
    cacheuse.record(store, plan.name, partial, plan.uv_cache, set(handoff.entries) if handoff else None)
    step("install")
    say("compiling bytecode")
    pyc_cache = plan.pyc_cache or layout.pyc_cache
    # A repair's private cache gets a secret of its own, kept nowhere: nothing outside it is used.
    secret = os.urandom(bytecode.SECRET_BYTES) if plan.pyc_cache else bytecode.cache_secret(layout.pyc_secret)
    compile_env = {**env, **debug.passed_on("COMPILE_PAUSE"), bytecode.SECRET_ENV: secret.hex()}
    # the store's cache only: its entries become links to this path's pycs once it is registered
    links = None if plan.pyc_cache else bytecode.links_file(layout.tmp, plan.key)
    modules, failed, reused = bytecode.compile_tree(python, partial, pyc_cache, lambda argv, what: uvmod.run(
        argv, what=what, env=compile_env, log_dir=layout.logs, cwd=layout.tmp, timeout=remaining(), show=say),
        links=links)
    step("bytecode")
    say(f"{modules} module(s): {modules - reused - failed} compiled, {reused} from the bytecode cache"
             + (f", {failed} left as source (they do not compile)" if failed else ""))
    name = plan.inputs["binary"]
    binary = partial / "bin" / name
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        raise StoreError(f"the environment has no executable bin/{name} (engine.binary in {plan.origin})")
    # modes and times: not the builder's (the wheel home's files are canonical already, and shared)
    canonical.normalise(partial, parse_time(as_of).timestamp(), keep=handoff.inodes if handoff else frozenset())
    return {
        **({HANDOFF: handoff} if handoff else {}),
        "requirements": requirements,
        "exclude_newer": as_of,
        "index_url": plan.index_url,
        "uv_version": uv.version,
        "python": asdict(interp),
        "lock": lock_text,
        "lock_format": lock.name,
    }


def _index_pins(store: Store, plan: BuildPlan, requirements: list[str], python: Path,
                uv_run) -> dict[str, indexpins.Pin]:
    """The exact pins of the extra index's packages (indexpins.py); none without an extra index.
    A `from-main-index` pin is resolved first: the build's requirements on the main index alone,
    date-bound, in a scratch directory (nothing of it enters the tree); a rebuild from a recorded
    lock reads it from that lock instead."""
    if not plan.fields.get("extra_index"):
        return {}
    where = f"build[{plan.build_index}]"
    names = indexpins.to_derive(plan.fields)
    versions: dict[str, str] = {}
    if names and plan.lock_text is not None:
        versions = indexpins.derived(plan.lock_text, "pylock.toml", names, plan.origin, where)
    elif names:
        scratch = store.layout.tmp / f"derive-{os.getpid()}-{time.monotonic_ns()}"
        scratch.mkdir(mode=0o700)
        try:
            (scratch / "requirements.in").write_text("".join(r + "\n" for r in requirements))
            say(f"resolving on {plan.index_url} alone for the versions of {', '.join(names)} (index_pins)")
            uv_run(["pip", "compile", "requirements.in", "-o", "requirements.lock", "--exclude-newer",
                    plan.inputs["as_of"], "--python", python,
                    "--no-header", "--quiet"], "uv pip compile (main index, for index_pins)", scratch)
            versions = indexpins.derived((scratch / "requirements.lock").read_text(), "requirements.lock", names,
                                         plan.origin, where)
        finally:
            force_rmtree(scratch)
    return indexpins.pinned(plan.fields, requirements, plan.origin, where, versions)


def _fetch_extras(store: Store, plan: BuildPlan, partial: Path) -> list[str]:
    """The build's source archive, release assets and release wheel, each checked against its
    digest; returns the requirements they add (the source's requirements file, the pinned wheel).
    Its paths were checked by `check_requirements`; every write into `partial` goes through fetch's
    no-follow helpers, so nothing lands outside it or on what uv venv made there."""
    from llmgw_store.build import fetch

    fields, origin, where = plan.fields, plan.origin, f"build[{plan.build_index}]"
    downloads = store.layout.downloads
    added: list[str] = []
    if "source" in fields:
        src = fields["source"]
        archive = fetch.cached_download(src["url"], src["sha256"], downloads)
        say(f"unpacking {archive.name} (checked against its sha256)")
        scratch = store.layout.tmp / f"unpack-{os.getpid()}-{time.monotonic_ns()}"
        try:
            # What the recipe says the whole build needs bounds what its source may unpack to.
            bound = int(fields["free_gb"] * 1e9) if fields.get("free_gb") else fetch.SOURCE_MAX_BYTES
            top = fetch.unpack_source(archive, scratch, src.get("top"), origin, f"{where}.source", max_bytes=bound)
            top_rel = top.relative_to(scratch).as_posix()
            if "requirements" in src:
                added += fetch.source_requirements(scratch, f"{top_rel}/{src['requirements']}", origin,
                                                   f"{where}.source")
            fetch.move_tree(scratch, top_rel, partial, src.get("dir", "src"), origin, f"{where}.source")
        finally:
            force_rmtree(scratch)
    if "assets" in fields:
        repo, tag = plan.inputs["repo"], fields["asset_tag"]
        listed = fetch.release(repo, tag)
        asset_dir = fields.get("asset_dir", "bin")
        dir_fd = fetch.env_dir(partial, asset_dir, origin, f"{where}.asset_dir")
        try:
            for name in fields["assets"]:
                asset = fetch.pick(listed, repo, tag, name=name)
                got = fetch.cached_download(asset["url"], asset["sha256"], downloads)
                fetch.install_file(got, dir_fd, name, 0o755 if asset_dir == "bin" else 0o644, f"{asset_dir}/{name}",
                                   origin, f"{where}.assets")
                say(f"asset {name} from release {tag} of {repo} (sha256 {asset['sha256'][:12]}…)")
        finally:
            os.close(dir_fd)
    if "wheel" in fields:
        w = fields["wheel"]
        repo = w.get("repo", plan.inputs["repo"])
        asset = fetch.pick(fetch.release(repo, w["tag"]), repo, w["tag"], prefix=w.get("prefix", ""),
                           suffix=w.get("suffix", ".whl"))
        # Pinned to the digest the release publishes: uv checks the fragment when it downloads.
        added.append(f"{w['project']} @ {asset['url']}#sha256={asset['sha256']}")
        say(f"release wheel {asset['name']} from {repo} {w['tag']} (sha256 {asset['sha256'][:12]}…)")
    return added


def _check_engine_version(plan: BuildPlan, pinned: dict[str, str]) -> None:
    """The store path is named after `plan.version`: the engine's project, where the lock installs
    it, must be at that version (a recipe whose requirements do not say `{version}` could otherwise
    resolve to another release and carry the wrong name)."""
    from packaging.version import InvalidVersion, Version

    project = plan.inputs.get("pypi") or plan.meta.get("engine")
    got = pinned.get(lockfiles.normalize(project)) if project else None
    if got is None:
        return
    try:
        same = Version(got) == Version(plan.version)
    except InvalidVersion:
        same = got == plan.version
    if not same:
        raise RecipeError(
            plan.origin, f"build[{plan.build_index}].requirements",
            f"they resolve {project} to {got} as of {plan.inputs.get('as_of')}, but the store path would be named "
            f"{plan.version}: pass --version {got}, or require {project}=={{version}}")


def verify_env(store: Store, plan: BuildPlan, env_dir: Path, deadline: Deadline) -> None:
    """Run the recipe's verify command, then the GPU check, in the (already frozen) environment."""
    fields = plan.fields
    env = uvmod.clean_env(VIRTUAL_ENV=str(env_dir), TMPDIR=str(store.layout.tmp))
    env["PATH"] = f"{env_dir / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    command = fields.get("verify")
    if command:
        argv = list(command)
        if (env_dir / "bin" / argv[0]).exists():
            argv[0] = str(env_dir / "bin" / argv[0])
        say(f"verifying: {' '.join(command)}")
        uvmod.run(argv, what=f"verify command `{' '.join(command)}`", env=env, log_dir=store.layout.logs,
                  cwd=store.layout.tmp, timeout=deadline.remaining(), show=say)
    if fields.get("gpu_check"):
        _gpu_probe(store, env_dir, env, deadline)


def _gpu_probe(store: Store, env_dir: Path, env: dict[str, str], deadline: Deadline) -> None:
    """Where an NVIDIA driver is present, torch in the new environment must see the GPU and run a
    kernel on it; the seed's hint is added when the build has no kernels for the card."""
    from llmgw_store.build import gpu

    host = gpu.probe_host()
    if host.driver is None:
        say("no NVIDIA driver on this host: GPU check skipped")
        return
    say(f"GPU check ({host.driver}; {', '.join(f'{g.name} sm {g.capability:g}' for g in host.gpus) or 'no GPU listed'})")
    try:
        out = uvmod.run([env_dir / "bin" / "python", "-c", gpu.PROBE], what="GPU check", env=env,
                        log_dir=store.layout.logs, cwd=store.layout.tmp,
                        timeout=min(600.0, deadline.remaining()), show=say)
    except CommandError as exc:
        raise CommandError(f"GPU check failed{gpu.kernel_hint(exc.output_tail, host)}", output_tail=exc.output_tail,
                           log=exc.log) from None
    say(out.strip().splitlines()[-1] if out.strip() else "GPU check passed")
