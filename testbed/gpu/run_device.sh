#!/bin/bash
# The GPU test bed on the device (copied into the kit as run.sh by testbed/gpu/build_kit.py):
# installs the kit, then testbed/gpu/runner.py starts the servers and runs every check.
# Results: $OUT/results.json, $OUT/pytest.log, $OUT/artifacts.tgz (traces/, logs/). Arguments go to
# the runner (e.g. --skip throughput).
set -u
KIT=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/gpu-testbed-out}
WORK=/tmp/gpu-testbed-work SITE=/tmp/gpu-testbed-site TRACER=/tmp/gpu-testbed-tracer
mkdir -p "$OUT"; rm -rf "$WORK" "$TRACER"; mkdir -p "$WORK"
T0=$(date +%s)
if [ ! -d "$SITE/sglang" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$KIT"/wheels/*.whl || exit 1
  tar -xJf "$KIT/sglang.tar.xz" -C "$SITE" || exit 1
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$TRACER" "$KIT"/draftscope-*.whl || exit 1
echo "[run.sh] kit installed in $(( $(date +%s) - T0 )) s"
export SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1 TORCHDYNAMO_DISABLE=1 PYTHONUNBUFFERED=1 \
  SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python SGLANG_FORCE_FUSED_OP_BACKEND=torch \
  SGLANG_GPU_TESTBED_NO_JIT=1 SGLANG_GPU_TESTBED_COUNT_REPLAYS=1
export PYTHONPATH="$KIT/standins:$TRACER:$SITE:$KIT/src"
cd "$KIT/src" || exit 1
# the runner ends its phases by their deadlines; this limit is the net under them, so that what was saved still
# comes back inside one device call (600 s)
timeout -k 10 "${RUNNER_LIMIT_S:-560}" python3 -m testbed.gpu.runner --kit "$KIT" --work "$WORK" --tracer-site "$TRACER" \
  --server-path "$KIT/standins:$SITE:$KIT/src" "$@"
rc=$?
cp "$WORK/results.json" "$WORK/pytest.log" "$OUT/" 2>/dev/null
# a file comes back under 16 MiB: traces of 16 MiB or more stay behind (named in left_behind.txt; the checks read them here)
(cd "$WORK" && find traces logs -type f -size +15M > left_behind.txt && find traces logs -type f -size -16M \
  | tar -czf "$OUT/artifacts.tgz" -T - left_behind.txt) 2>/dev/null
echo "[run.sh] done in $(( $(date +%s) - T0 )) s, runner rc=$rc"
exit $rc
