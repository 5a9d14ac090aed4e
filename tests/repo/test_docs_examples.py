"""Docs that run (issue 16): every ```sh block of README.md and docs/*.md that calls `llmgw-store` is
executed, so a documented command can never break unnoticed.

How a block runs: `bash -e`, the blocks of one page in order in one working directory and one
store (a page's later examples use what its earlier ones built), with
    PATH                        the installed `llmgw-store` first
    LLMGW_STORE_ROOT            a fresh store root (examples that pass --root keep theirs)
    LLMGW_STORE_INDEX_URL       a package index on 127.0.0.1 serving stand-ins of the engines the
                                docs name (black, vllm, sglang, uvicorn: small wheels whose console
                                script prints its name and version), with dated releases
    LLMGW_STORE_UV              the uv of the test environment (nothing is fetched from PyPI)
    examples/*.toml             stand-in recipes under the same names as the repository's, for
                                those engines, CPU-only, pointing at nothing but that index
A block whose first line is `# not run: <reason>` is skipped (it needs a GPU, the real PyPI, a
real S3 bucket, systemd); keep those few. To add an example: write it as a ```sh block; it must
run as written against the stand-ins, and a failure names the page and line.

Sample output: a ```output block right after a ```sh block is what that block prints on stdout,
produced by this test: it must equal the block's real output once both sides have the parts that
differ from run to run written as placeholders (`normal`): the store root (written
/var/lib/llmgw-store), the installed command's directory (/opt/llmgw-store/bin), the working
directory (.), the package index (https://pypi.org/simple), keys (written `5x…`), sha256
digests, ISO times, seconds, sizes and byte counts. So a sample can never drift from what the command prints.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import PYTHON, REPO, real_uv
from tests.support.index_server import PackageIndex
from tests.support.wheels import build_wheel

NOT_RUN = re.compile(r"# not run: \S.*")
FENCE = re.compile(r"^```sh\n(.*?)^```", re.DOTALL | re.MULTILINE)

# Stand-in engines: (name, version, release date). The newest release of each is what a recipe
# without a fixed version builds; older ones are there for examples that pin or diff versions.
RELEASES = [
    ("black", "24.4.2", "2024-04-25T00:00:00Z"),
    ("vllm", "0.6.2", "2024-09-25T00:00:00Z"),
    ("vllm", "0.6.3", "2024-10-14T00:00:00Z"),
    ("sglang", "0.4.0", "2024-12-01T00:00:00Z"),
    ("uvicorn", "0.30.0", "2024-06-01T00:00:00Z"),
    ("tinyengine", "1.0", "2024-02-01T00:00:00Z"),
    ("tinyengine", "1.1", "2024-07-01T00:00:00Z"),
]
DEPENDENCY = ("tinydep", "1.0", "2024-01-01T00:00:00Z")


def recipe(engine: str, variants: tuple[str, ...] = ("cpu",), version: str | None = None) -> str:
    """A stand-in recipe: one [[build]] per variant, the first for any GPU (and for none)."""
    text = f'[engine]\nname = "{engine}"\nbinary = "{engine}"\n'
    for variant in variants:
        text += (f'\n[[build]]\nvariant = "{variant}"\npython = "{PYTHON}"\n'
                 + (f'version = "{version}"\n' if version else "")
                 + f'requirements = ["{engine}=={{version}}"]\nverify = ["{engine}", "--version"]\n')
    return text


# The repository's examples/ by file name, as stand-ins.
RECIPES = {
    "black.toml": recipe("black", version="24.4.2"),
    "tiny-cpu.toml": recipe("uvicorn"),
    "vllm.toml": recipe("vllm", ("cu130", "cu128")),
    "sglang.toml": recipe("sglang"),
    "tiny.toml": recipe("tinyengine", version="1.0"),
}


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def blocks(page: Path) -> list[tuple[int, str]]:
    """(line, text) of each ```sh block of `page` that calls llmgw-store."""
    text = page.read_text()
    return [(text[: m.start()].count("\n") + 1, m.group(1)) for m in FENCE.finditer(text)
            if "llmgw-store" in m.group(1)]


# A walk-through that needs a setup of its own (store paths of given versions, a profile's history)
# is run by the test named on its first line, `# run by tests/<layer>/test_<name>.py`, against that setup.
RUN_BY = re.compile(r"# run by (tests/(?:\w+/)*test_\w+\.py)\b.*")


OUTPUT = re.compile(r"^```sh\n((?:(?!```).)*?)^```\n\n?```output\n((?:(?!```).)*?)^```", re.DOTALL | re.MULTILINE)


def sample_outputs(page: Path) -> dict[str, str]:
    """sh block text -> the ```output block that follows it."""
    return {m.group(1): m.group(2) for m in OUTPUT.finditer(page.read_text())}


_NIX32 = "0-9a-df-np-sv-z"
PLACEHOLDERS = [
    (re.compile(rf"\b[{_NIX32}]{{32}}\b"), "<key>"),  # a key, in a name or alone
    (re.compile(r"\b[0-9a-z]{1,4}…"), "<key>"),  # a key as the docs abbreviate it: 5x…
    (re.compile(r"\b[0-9a-f]{64}\b"), "<sha256>"),
    (re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z"), "<time>"),
    (re.compile(r"\b\d+(?:\.\d+)? (?:B|KiB|MiB|GiB|TiB|PiB)\b"), "<size>"),
    (re.compile(r"\b\d+(?:\.\d+)?s\b"), "<seconds>"),
    (re.compile(r'("(?:seconds|[a-z_]*bytes[a-z_]*|free_[a-z]+|size|[a-z_]*_timestamp_seconds)"\s*:\s*)[0-9.e+]+'),
     r"\1<n>"),
    (re.compile(r"(_bytes(?:\{[^}]*\})?|_seconds\{[^}]*\}) [0-9.e+]+"), r"\1 <n>"),
]


def normal(text: str, root: Path | None = None, cwd: Path | None = None, index_url: str | None = None) -> str:
    """`text` with what differs between runs as placeholders (see the module's docstring)."""
    if root is not None:
        text = text.replace(str(root), "/var/lib/llmgw-store")
        text = text.replace(str(Path(sys.executable).parent), "/opt/llmgw-store/bin")  # the installed command
    if index_url is not None:
        text = text.replace(index_url, "https://pypi.org/simple")
    if cwd is not None:
        text = text.replace(str(cwd), ".")
    for pattern, placeholder in PLACEHOLDERS:
        text = pattern.sub(placeholder, text)
    return text.rstrip("\n")


def runnable(page: Path) -> list[tuple[int, str]]:
    return [(line, text) for line, text in blocks(page)
            if not NOT_RUN.match(text.lstrip()) and not RUN_BY.match(text.lstrip())]


def test_examples_run_elsewhere_name_a_test_that_runs_their_page():
    for page in pages():
        for line, text in blocks(page):
            m = RUN_BY.match(text.lstrip())
            if m:
                test = REPO / m.group(1)
                assert test.is_file() and page.name in test.read_text(), f"{page.relative_to(REPO)}:{line}"


@pytest.fixture(scope="module")
def docs_index(tmp_path_factory):
    d = tmp_path_factory.mktemp("docs-wheels")
    idx = PackageIndex()
    idx.add(DEPENDENCY[0], build_wheel(d, DEPENDENCY[0], DEPENDENCY[1]), DEPENDENCY[2])
    for name, version, date in RELEASES:
        wheel = build_wheel(d, name, version, requires=(DEPENDENCY[0],), scripts={name: f"{name}:main"})
        idx.add(name, wheel, date)
    idx.start()
    yield idx
    idx.stop()


def workdir(tmp_path: Path) -> Path:
    (tmp_path / "examples").mkdir()
    for name, text in RECIPES.items():
        (tmp_path / "examples" / name).write_text(text)
    return tmp_path


def block_env(tmp_path: Path, index: PackageIndex) -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)
    return {
        **os.environ,
        "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
        "LLMGW_STORE_ROOT": str(tmp_path / "root"),
        "LLMGW_STORE_INDEX_URL": index.url,
        "LLMGW_STORE_UV": str(real_uv()),
        "LLMGW_STORE_PYTHON_PREFERENCE": "only-system",
        "LLMGW_STORE_PROGRESS": "plain",
    }


PAGES_WITH_EXAMPLES = [p for p in pages() if runnable(p)]


@pytest.mark.parametrize("page", PAGES_WITH_EXAMPLES, ids=lambda p: str(p.relative_to(REPO)))
def test_the_examples_of_a_page_run(page, docs_index, tmp_path):
    cwd = workdir(tmp_path)
    env = block_env(tmp_path, docs_index)
    outputs = sample_outputs(page)
    for line, text in runnable(page):
        proc = subprocess.run(["bash", "-e", "-c", text], cwd=cwd, env=env, capture_output=True, text=True, check=False,
                              timeout=600)
        assert proc.returncode == 0, (
            f"{page.relative_to(REPO)}:{line}: the example exits {proc.returncode}\n--- block\n{text}"
            f"--- stdout\n{proc.stdout}--- stderr\n{proc.stderr}")
        if text in outputs:
            got = normal(proc.stdout, Path(env["LLMGW_STORE_ROOT"]), cwd, env["LLMGW_STORE_INDEX_URL"])
            shown_ = normal(outputs[text])
            assert got == shown_, (f"{page.relative_to(REPO)}:{line}: the sample output differs from the real one\n"
                                   f"--- real (normalised)\n{got}\n--- sample (normalised)\n{shown_}")


def test_every_sample_output_follows_a_block_that_runs():
    """An ```output block belongs to the ```sh block just before it, which must be one that runs."""
    for page in pages():
        text = page.read_text()
        owned = set(sample_outputs(page).values())
        for m in re.finditer(r"^```output\n(.*?)^```", text, re.DOTALL | re.MULTILINE):
            line = text[: m.start()].count("\n") + 1
            assert m.group(1) in owned, f"{page.relative_to(REPO)}:{line}: an output block with no sh block before it"
        runs = {t for _, t in runnable(page)}
        for block in sample_outputs(page):
            assert block in runs, f"{page.relative_to(REPO)}: a sample output of a block that is not run"


def test_placeholders_keep_what_matters():
    assert normal("x 5x…-vllm-0.6.3-cu128 12.5 MiB in 3.2s") == normal(
        "x 0123456789abcdfghijklmnpqrsvwxyz-vllm-0.6.3-cu128 7.0 KiB in 0.1s")
    assert normal("vllm 0.6.3") != normal("vllm 0.6.2")  # versions are not placeholders


def test_skipped_examples_say_why_and_stay_few():
    skipped = [(p, line, text.lstrip().splitlines()[0]) for p in pages() for line, text in blocks(p)
               if text.lstrip().startswith("# not run")]
    for page, line, first in skipped:
        assert NOT_RUN.fullmatch(first), f"{page.relative_to(REPO)}:{line}: write `# not run: <reason>`"
    total = sum(len(blocks(p)) for p in pages())
    assert len(skipped) <= max(4, total // 3), [f"{p.relative_to(REPO)}:{line}" for p, line, _ in skipped]


def test_the_readme_quick_start_runs_as_documented(docs_index, tmp_path):
    """The quick start's first command (the first a new operator types), as written but for the
    venv it sets up (this test runs installed): its build, and the environment's black."""
    quick = next(text for _, text in blocks(REPO / "README.md") if "build examples/black.toml" in text)
    first = next(line for line in quick.splitlines() if "build examples/black.toml" in line)
    run = first[first.index('"$('):].replace(".venv/bin/llmgw-store", "llmgw-store")
    assert run.startswith('"$(llmgw-store --root .llmgw-store build examples/black.toml)/bin/black"'), run
    proc = subprocess.run(["bash", "-e", "-c", run], cwd=workdir(tmp_path), env=block_env(tmp_path, docs_index),
                          capture_output=True, text=True, check=False, timeout=600)
    assert proc.returncode == 0 and proc.stdout.startswith("black"), proc.stderr
    # the second command is the one .ci/run runs
    assert "python3 -m venv .venv && .venv/bin/pip install -q -e '.[test]' && .venv/bin/python -m pytest" in quick
    assert "python3 -m venv .venv && .venv/bin/pip install -q -e '.[test]'" in (REPO / ".ci" / "run").read_text()


def test_a_failing_example_is_caught(docs_index, tmp_path):
    """The runner itself: a block whose command fails makes the page fail (bash -e)."""
    cwd = workdir(tmp_path)
    proc = subprocess.run(["bash", "-e", "-c", "llmgw-store info no-such-profile\necho not reached"], cwd=cwd,
                          env=block_env(tmp_path, docs_index), capture_output=True, text=True, check=False, timeout=60)
    assert proc.returncode == 2 and "not reached" not in proc.stdout
