"""The tiny recipe the tests and the benches' quick modes build (tests/conftest.py's index serves
its packages; bench/common.py's too). Importable without pytest: the benches run from a regular
install, which has none."""

TINY_RECIPE = """
[engine]
name = "tinyengine"
pypi = "tinyengine"
binary = "tinyengine"

[[build]]
variant = "cpu"
python = "{python}"
requirements = ["tinyengine=={{version}}"]
verify = ["tinyengine"]
{extra}
"""
