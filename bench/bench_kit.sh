#!/usr/bin/env bash
# The GPU benches of this checkout's tracer, on the lent device, without the SGLang kit (docs/benchmarks.md).
#
# Here:   bash bench/bench_kit.sh build [COMMIT]     # .cache/bench-kit: orjson for the device's Python 3.12, and
#                                                    # COMMIT's tracer (a git archive) to compare against
# There:  bash bench/bench_kit.sh tests|ab|stages|hooks [ARGS...]    # run(carry=[".cache/bench-kit"])
#
#   tests   pytest -m gpu tests/gpu/test_hooks_path.py tests/gpu/test_softmax_topk.py (ARGS: more pytest arguments)
#   ab      bench/gpu_hooks_ab.py: the hooks' host time of this checkout's tracer (a) and COMMIT's (b), in turns
#           (PAIRS, default 3; the pairs' table, then each tracer's runs); JSON under $OUT/ab
#   stages  bench/gpu_summary_stages.py ARGS (e.g. --tuning "" --tuning warps=8); JSON in $OUT
#   hooks   bench/gpu_hooks.py ARGS (records checked against the CPU path, host time, cProfile); JSON in $OUT
#
# On the device the image's torch and Triton run the checkout's tracer, copied as the package draftscope_tracer
# beside orjson into /tmp/pn (COMMIT's into /tmp/po).
set -euo pipefail
cd "$(dirname "$0")/.."
KIT=${BENCH_KIT:-.cache/bench-kit}  # (a test points it elsewhere)
cmd=${1:?"usage: bash bench/bench_kit.sh build [COMMIT] | tests | ab | stages | hooks [ARGS...]"}
shift

site() {  # site DIR TRACER: orjson and TRACER as draftscope_tracer in DIR
  rm -rf "$1"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$1" "$KIT"/whl/*.whl
  cp -r "$2" "$1/draftscope_tracer"
}

case "$cmd" in
  build)
    commit=${1:-HEAD}
    rm -rf "$KIT" && mkdir -p "$KIT/whl" "$KIT/old"
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$KIT/whl" \
      "$(grep -o '"orjson==[^"]*"' pyproject.toml | head -1 | tr -d '"')"
    git archive "$commit" tracer | tar -x -C "$KIT/old"
    git rev-parse --short "$commit" > "$KIT/old/commit"
    echo "[bench-kit] $KIT: $(ls "$KIT/whl"), the tracer of $(cat "$KIT/old/commit") ($(du -sh "$KIT" | cut -f1))"
    ;;
  tests|ab|stages|hooks)
    [ -d "$KIT/whl" ] || { echo "[bench-kit] no $KIT: run 'bash bench/bench_kit.sh build' here first" >&2; exit 2; }
    export PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/bench-kit-out}
    mkdir -p "$OUT"
    site /tmp/pn tracer
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
    case "$cmd" in
      tests)
        PYTHONPATH=/tmp/pn:. python3 -m pytest --noconftest -m gpu -q -p no:cacheprovider \
          tests/gpu/test_hooks_path.py tests/gpu/test_softmax_topk.py "$@" 2>&1 | tee "$OUT/pytest.log" | tail -30 ;;
      ab)
        site /tmp/po "$KIT/old/tracer"
        echo "[bench-kit] a: this checkout's tracer, b: $(cat "$KIT/old/commit")'s"
        python3 bench/gpu_hooks_ab.py /tmp/pn /tmp/po --out "$OUT/ab" --pairs "${PAIRS:-3}" "$@"
        python3 bench/gpu_hooks_ab.py --table "$OUT/ab"
        (cd "$OUT/ab" && python3 "$OLDPWD/bench/gpu_hooks_ab.py" --runs a* && python3 "$OLDPWD/bench/gpu_hooks_ab.py" --runs b*) ;;
      stages)
        PYTHONPATH=/tmp/pn:. python3 bench/gpu_summary_stages.py "$@" 2>&1 | tee "$OUT/stages.log" | grep -v '^{' ;;
      hooks)
        PYTHONPATH=/tmp/pn:. python3 bench/gpu_hooks.py "$@" ;;
    esac
    ;;
  *)
    echo "[bench-kit] unknown command $cmd: build, tests, ab, stages or hooks" >&2
    exit 2 ;;
esac
