#!/bin/bash
# The vLLM GPU kit on the device (copied into the kit as run.sh by testbed/gpu/vllm_kit.py): installs the
# kit, then testbed/gpu/vllm_serve.py imports vLLM's CUDA path and serves the tiny target and EAGLE-3 draft
# with CUDA graphs on, then eager. Results: $OUT/results.json, $OUT/artifacts.tgz (traces/, logs/).
# Arguments go to the runner (e.g. --modes eager). KIT_INSTALL_ONLY=1 stops after installing (dry run).
set -u
KIT=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/vllm-gpu-testbed-out}
ROOT=${KIT_ROOT:-/tmp/vllm-gpu-testbed}
PY=${PYTHON:-python3}
WORK=$ROOT/work SITE=$ROOT/site TRACER=$ROOT/tracer
mkdir -p "$OUT"; rm -rf "$WORK" "$TRACER"; mkdir -p "$WORK"
T0=$(date +%s)
if [ ! -d "$SITE/vllm" ]; then
  # --python-version/--platform: the wheels are cp312 manylinux, whatever Python runs pip (a dry run here)
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --only-binary=:all: --python-version 3.12 \
    --implementation cp $(for t in 1 2014 _2_17 _2_24 _2_26 _2_27 _2_28 _2_31 _2_34; do printf -- "--platform manylinux%s_x86_64 " $t; done) \
    --target "$SITE" "$KIT"/wheels/*.whl || exit 1
  tar -xJf "$KIT/vllm.tar.xz" -C "$SITE" || exit 1
fi
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$TRACER" "$KIT"/draftscope-*.whl || exit 1
echo "[run.sh] kit installed in $(( $(date +%s) - T0 )) s into $ROOT"
[ "${KIT_INSTALL_ONLY:-0}" = 1 ] && exit 0
export PYTHONUNBUFFERED=1 PYTHONPATH="$KIT/standins:$TRACER:$SITE:$KIT/src"
cd "$KIT/src" || exit 1
timeout -k 10 "${RUNNER_LIMIT_S:-560}" "$PY" -m testbed.gpu.vllm_serve --kit "$KIT" --work "$WORK" "$@"
rc=$?
cp "$WORK/results.json" "$WORK/imports.json" "$OUT/" 2>/dev/null
(cd "$WORK" && find traces logs -type f -size -16M | tar -czf "$OUT/artifacts.tgz" -T -) 2>/dev/null
echo "[run.sh] done in $(( $(date +%s) - T0 )) s, runner rc=$rc"
exit $rc
