#!/usr/bin/env bash
# A real vLLM environment from PyPI against the same uv commands by hand, cold then warm, and a
# second environment a week newer in the same store. Needs PyPI and ~25 GB free; takes ~5 minutes.
#   bash bench/bench_vllm.sh [VERSION] [VARIANT]      (defaults: 0.33.0 cu130)
# On a machine where uv cannot find a Python 3.12, put one first on PATH.
set -euo pipefail
VERSION=${1:-0.33.0}; VARIANT=${2:-cu130}
REPO=$(cd "$(dirname "$0")/.." && pwd)
CLI=${CLI:-$REPO/.venv/bin/llmgw-store}; UV=${UV:-$REPO/.venv/bin/uv}
W=$(mktemp -d /tmp/llmgw-bench-vllm-XXXX); trap 'chmod -R u+w "$W"; rm -rf "$W"' EXIT
unset PYTHONDONTWRITEBYTECODE
export LLMGW_STORE_PYTHON_PREFERENCE=${LLMGW_STORE_PYTHON_PREFERENCE:-only-system}
t() { local s=$(date +%s.%N); "$@"; elapsed=$(python3 -c "print(round($(date +%s.%N) - $s, 1))"); }
raw() {  # the three uv commands by hand, with cache $1 into env $2
  UV_NO_CONFIG=1 UV_PYTHON_DOWNLOADS=never UV_CACHE_DIR=$1 bash -c "
    $UV venv -q --relocatable --python $PY $2 &&
    $UV pip compile -q $W/req.in -o $2.lock --generate-hashes --exclude-newer $ASOF --python $2/bin/python --no-header &&
    $UV pip install -q --require-hashes --no-deps -r $2.lock --python $2/bin/python --link-mode hardlink --compile-bytecode"
}
t "$CLI" --root "$W/s1" --json build "$REPO/examples/vllm.toml" --variant "$VARIANT" --version "$VERSION" --uv "$UV" >"$W/s1.json" 2>"$W/s1.err"
ours_cold=$elapsed
P=$(python3 -c "import json;print(json.load(open('$W/s1.json'))['path'])")
ASOF=$(python3 -c "import json;print(json.load(open('$W/s1.json'))['as_of'])")
PY=$(python3 -c "import json;print(json.load(open('$P/.llmgw/manifest.json'))['python']['path'])")
cp "$P/.llmgw/requirements.in" "$W/req.in"
t raw "$W/raw1-cache" "$W/raw1"; raw_cold=$elapsed
mkdir -p "$W/s2/cache" && cp -al "$W/s1/cache/uv" "$W/s2/cache/uv" && cp -al "$W/s1/cache/uv" "$W/raw2-cache"
t "$CLI" --root "$W/s2" build "$REPO/examples/vllm.toml" --variant "$VARIANT" --version "$VERSION" --uv "$UV" >/dev/null 2>&1
ours_warm=$elapsed
t raw "$W/raw2-cache" "$W/raw2"; raw_warm=$elapsed
LATER=$(python3 -c "import datetime as d;print((d.datetime.fromisoformat('$ASOF'.replace('Z','+00:00'))+d.timedelta(days=7)).strftime('%Y-%m-%dT%H:%M:%SZ'))")
t "$CLI" --root "$W/s1" build "$REPO/examples/vllm.toml" --variant "$VARIANT" --version "$VERSION" --uv "$UV" --as-of "$LATER" >/dev/null 2>&1
second=$elapsed
python3 - "$P" <<PY
import json, sys
m = json.load(open(sys.argv[1] + "/.llmgw/manifest.json"))
print(f"vLLM $VERSION ($VARIANT): {m['size']/1e9:.2f} GB, {m['files']} entries")
print(f"cold (empty caches): llmgw-store $ours_cold s, uv by hand $raw_cold s, ratio {float('$ours_cold')/float('$raw_cold'):.2f}")
print(f"warm (uv cache):     llmgw-store $ours_warm s, uv by hand $raw_warm s, ratio {float('$ours_warm')/float('$raw_warm'):.2f}")
print(f"second environment, a week newer, same store: $second s")
PY
