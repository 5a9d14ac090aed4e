"""The one bounded TOML loader (system/boundedtoml) the config file and recipes are read through:
hostile texts are refused before tomllib sees them, and every honest file still loads."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from llmgw_store.system.boundedtoml import Limits, TomlRefused, loads, shape_problem

LIMITS = Limits(1 << 16, 8, 8, "the file")
REPO = Path(__file__).resolve().parents[2]
DOTTED = "a" + ".a" * 29_999


@pytest.mark.parametrize("text", [
    # A multi-line string closed by a run of 4 or 5 quotes (its first ones content) must not
    # desynchronise the pass: the dotted key after it is seen.
    f'y = """x""""\n{DOTTED} = 1\n',
    f'y = """x"""""\n{DOTTED} = 1\n',
    f"y = '''x''''\n{DOTTED} = 1\n",
    f"y = '''x'''''\n{DOTTED} = 1\n",
    f'y = """a\\"""\nb"""\n{DOTTED} = 1\n',  # an escaped quote inside a multi-line basic string
    f'y = "x\\""\n{DOTTED} = 1\n',
    f"y = 'x\\'\n{DOTTED} = 1\n",  # a literal string has no escapes: it ends at the second quote
    f'# a comment with a " quote\n{DOTTED} = 1\n',
    f'"quoted"."key".{DOTTED} = 1\n',
    f"[x]\n{DOTTED[:20_000]} = 1\n",
    "x = " + "[" * 3000 + "]" * 3000 + "\n",
    "x = " + "{a = " * 3000 + "1" + "}" * 3000 + "\n",
], ids=["ml-basic-4", "ml-basic-5", "ml-literal-4", "ml-literal-5", "ml-escape", "basic-escape",
        "literal-backslash", "comment", "quoted-parts", "table", "arrays", "inline-tables"])
def test_a_hostile_text_is_refused_before_the_parser(text):
    with pytest.raises(TomlRefused, match="dotted key of more than 8 parts|nested deeper than 8 levels"):
        loads(text.encode(), LIMITS)


@pytest.mark.parametrize("text", [
    'y = """x""""""\na = 1\n',  # a run of 6 quotes: tomllib does not close the string there
    'y = "x\na = 1\n',  # a newline in a one-line string
    "y = 'x",  # the end of the text
    'y = """x',
])
def test_what_cannot_be_lexed_is_refused_not_guessed_past(text):
    with pytest.raises(TomlRefused, match="not valid TOML"):
        loads(text.encode(), LIMITS)


def test_size_encoding_and_syntax_are_refused():
    with pytest.raises(TomlRefused, match="larger than 64 KiB"):
        loads(b"# " + b"x" * (1 << 16) + b"\n", LIMITS)
    with pytest.raises(TomlRefused, match="not UTF-8"):
        loads(b"a = '\xff'\n", LIMITS)
    with pytest.raises(TomlRefused, match="not valid TOML"):
        loads(b"a = = 1\n", LIMITS)


def test_depth_without_brackets_is_refused_after_parsing():
    text = "".join(f"[{'.'.join(['t'] * 7)}]\n" for _ in range(1)) + "[[t.t.t.t.t.t.t.t]]\n"
    assert shape_problem(text, Limits(1 << 16, 8, 9, "the file")) is None
    with pytest.raises(TomlRefused, match="nested deeper than 8 levels"):
        loads(text.encode(), Limits(1 << 16, 8, 9, "the file"))


@pytest.mark.parametrize("text", [
    'y = """x""""\nb.c = 1\n',
    "y = '''x''''\nb.c = 1\n",
    'y = """a "" b ""\nc"""\nz = \'\'\'it\'s\'\'\'\n',
    'x = 1.5\nt = 1979-05-27T07:32:00.999\nv = [1.1, 2.2]\n"a.b".c = 1\n',
    'a = "#not a comment" # a comment with \'\'\' and """\nb = 2\n',
    "[gc]\nkeep = 3\n[[build]]\nx = [[1, 2], [3]]\n",
])
def test_ordinary_texts_load_as_tomllib_loads_them(text):
    assert loads(text.encode(), LIMITS) == tomllib.loads(text)


def _honest_files() -> list[tuple[str, str]]:
    found = [(str(p.relative_to(REPO)), p.read_text()) for p in sorted((REPO / "examples").glob("*.toml"))]
    for doc in sorted((REPO / "docs").glob("*.md")) + [REPO / "README.md"]:
        for n, m in enumerate(re.finditer(r"```toml\n(.*?)```", doc.read_text(), re.S)):
            found.append((f"{doc.name}#{n}", m.group(1)))
    return found


def test_every_example_and_every_toml_block_of_the_docs_loads():
    files = _honest_files()
    assert len([f for f, _ in files if f.startswith("examples")]) >= 4
    loaded = 0
    for name, text in files:
        try:
            expected = tomllib.loads(text)
        except tomllib.TOMLDecodeError:
            continue  # a fragment (`...`), not a file
        assert loads(text.encode(), LIMITS) == expected, name
        loaded += 1
    assert loaded >= 10
