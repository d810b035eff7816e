#!/usr/bin/env bash
# One device call that does a session's routine GPU work: install, the gpu tests, the decode
# kernels' compiled-code stats, a quick kernel benchmark, and `pdmux-triton run` on the real
# model. Each step has its own time limit; a failing step does not stop the others. All logs
# go to $OUT/session.log (the device returns at most 8 files), results beside it.
#
#   bash bench/gpu_session.sh            # on the GPU machine; OUT defaults to ./out
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
LOG="$OUT/session.log"
export PYTHONUNBUFFERED=1

step() {  # step NAME SECONDS COMMAND...
    local name=$1 limit=$2
    shift 2
    echo "== $name (limit ${limit}s)" | tee -a "$LOG"
    local t0=$SECONDS
    timeout "$limit" "$@" >> "$LOG" 2>&1
    echo "   $name: exit $? after $((SECONDS - t0))s" | tee -a "$LOG"
}

step install 120 python3 -m pip install -q --no-deps --no-build-isolation -e .
step gpu-tests 240 python3 -m pytest -q -m gpu tests
step profile 90 python3 bench/profile_decode.py --budget 16
step kernels 180 python3 bench/kernels.py --quick --out "$OUT"
step run 240 pdmux-triton run --out "$OUT" --calibration bench/results/calibrate-h200.json \
    --compare bench/results/compare-h200.json
grep -E "^(== |   )|passed|failed|MISS|  ok" "$LOG" | tail -40
