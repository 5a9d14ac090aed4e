#!/usr/bin/env bash
# A real vLLM environment (~10 GB) built by the store against the seed's uv commands by hand, doing
# the same work, alternating for --rounds (default 2) rounds, warm and cold cache; then the disk the
# store keeps for it after the default gc, and a neighbouring build a week newer in the same store
# (the disk it adds, its bytecode step). This is bench/bench_build.py on examples/vllm.toml: its
# docstring says what each row measures. Needs PyPI and ~60 GB free on the disk --work is on.
#
#   PYTHON=reg/bin/python bash bench/bench_vllm.sh [--version 0.33.0] [--variant cu130] [--work DIR] [--out DIR]
#   bash bench/bench_vllm.sh --quick --out DIR       # the test suite's: the tiny recipe, loopback index
#
# PYTHON is the interpreter of the llmgw-store install to measure (default: the checkout's .venv):
# a regular install (`python3 -m venv reg && reg/bin/pip install .`), as a node has. On a machine
# where uv cannot find a Python 3.12, put one first on PATH.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-$REPO/.venv/bin/python}
quick=0
for a in "$@"; do [ "$a" = --quick ] && quick=1; done
if [ $quick = 1 ]; then
    # the vLLM-only rows on the tiny recipe: warm-cache cold build, disk after gc, the neighbour
    exec "$PYTHON" "$REPO/bench/bench_build.py" --name vllm --skip-hit --skip-cold-cache \
        --neighbour-as-of 2024-06-02 "$@"
fi
exec "$PYTHON" "$REPO/bench/bench_build.py" --name vllm --recipe "$REPO/examples/vllm.toml" --variant cu130 \
    --version 0.33.0 --rounds 2 --skip-hit --neighbour-as-of +7d "$@"
