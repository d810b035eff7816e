#!/usr/bin/env bash
# A session's routine GPU work in one or two device calls: install, the gpu tests, the decode
# kernels' compiled-code stats, a quick kernel benchmark, `pdmux-triton run` on the real model.
# Each step has its own time limit and a failing step does not stop the others; name steps to
# run a subset (a device call allows 600 s). All logs go to $OUT/session.log (the device
# returns at most 8 files), results beside it.
#
#   bash bench/gpu_session.sh readme tests                # the README's command, the gpu tests
#   TESTS_FILES='tests/test_[h-z]*.py' bash bench/gpu_session.sh tests   # a part of the gpu tests
#   bash bench/gpu_session.sh tests host                  # gpu tests, host costs per round
#   bash bench/gpu_session.sh hostprof    # an eager layer's host time by function (cProfile)
#   STRATEGIES=pdmux_grid_cap RATES=6.5,7.1 bash bench/gpu_session.sh capacity   # measured
#       capacity at those rates, 1000 ShareGPT requests a point (steady state), into bench/results
#   CAPACITY_OUT=bench/results/capacity-conv STRATEGIES=prefill_first RATES=9.5 CAPACITY_ARGS=\
#       "--trace bench/data/azure-llm-2023/AzureLLMInferenceTrace_conv.csv --trace-start 2000 \
#       --trace-count 1000" bash bench/gpu_session.sh capacity   # the conversation trace
#   SLO_ARGS="--traffic sharegpt:12,16:10,12,14,16,18 --policies default,slo" \
#       bash bench/gpu_session.sh slo                 # SGLang's levels against SLO-driven ones
#   SLO_OUT=bench/results/long-300 SLO_ARGS="--count 300 --traffic sharegpt:7:6,7,8 \
#       --policies default,slo" bash bench/gpu_session.sh slo     # the same on longer streams
#   FLOOR_TURNS="1,3,served,1 tagged,3 tagged,served tagged" bash bench/gpu_session.sh \
#       tagged anatomy floor   # the tagged pinned gates: their gpu tests, cost, decode step
#   bash bench/gpu_session.sh steps batches    # served decode steps against the cost model's
#       price (bench/step_errors.py); decode steps at other batches by SMs (calibrate
#       --decode-batches, into a copy of the calibration; BATCHES=48: that batch and the own one)
#   FIDELITY_ARGS="--traces conv" bash bench/gpu_session.sh fidelity   # the simulator against
#       the GPU on Azure trace windows (resumes its points when cut short)
#   PREFIX_RATES=1.5,2 bash bench/gpu_session.sh prefix   # prefix cache on and off, Mooncake
#       conversation rows 3000-3199 (bench/prefix_cache.py; measured capacity, points resume)
#   PREFIX_RATES=0.6 PREFIX_WARM=40 PREFIX_STRATEGIES=prefill_first PREFIX_ARGS="--cache on" \
#       bash bench/gpu_session.sh prefix   # one slow point a device call (~450 s)
#   bash bench/gpu_session.sh gemm_rows   # decode GEMM tiles for 65-128 rows on 20-132 SMs
#   bash bench/gpu_session.sh mixed   # a chunked step's layers by decode rows against their price
#   bash bench/gpu_session.sh sustained   # a level's prefill sustained beside decode, with clocks
#   SUSTAINED_ARGS="--batches 12288x9 --seconds 4 --busy-shares 0.3,0.6,0.8" bash \
#       bench/gpu_session.sh sustained    # and busy part of the time: where the clocks fall
#   bash bench/gpu_session.sh pinned floor   # pinned partitions: gpu tests, decode-floor figures
#   bash bench/gpu_session.sh pinned anatomy sites floor   # and what the pinned gate costs
#   FLOOR_TURNS="1,1 claiming" bash bench/gpu_session.sh floor   # only those pinned turns
#   bash bench/gpu_session.sh tests kernels run occupancy   # ~5 min
#   bash bench/gpu_session.sh calibrate run advised         # ~3.5 min: after a decode-kernel change,
#       re-measures the decode workloads (CTAs 1) into a copy of the committed calibration, then
#       serves the chapter's scenario at SGLang's default levels and at levels the calibration
#       advises for a decode step of ADVISE_ITL_MS (default 12) ms
#   bash bench/gpu_session.sh contexts   # decode steps at 4096 and 8192 tokens a request by
#       SMs, alone and co-run (CONTEXTS=..., into $OUT/contexts: what a step's KV costs by context)
#   bash bench/gpu_session.sh calibrate batches   # the whole decode price after a
#       decode-kernel change: `calibrate` re-measures the own batch at its default budgets only;
#       served steps of other batches, and PD-mux's 20-60 SM budgets, are priced from the rows
#       `batches` measures (every batch the calibration holds), so both are needed
set -u
export OUT=${OUT:-out}
mkdir -p "$OUT"
LOG="$OUT/session.log"
export PYTHONUNBUFFERED=1
STEPS=${*:-"tests profile occupancy ncu kernels run"}

step() {  # step NAME SECONDS COMMAND...
    local name=$1 limit=$2
    shift 2
    case " $STEPS " in *" $name "*) ;; *) return ;; esac
    echo "== $name (limit ${limit}s)" | tee -a "$LOG"
    local t0=$SECONDS
    # (KILL 15 s after the TERM: a process waiting on a kernel that never ends ignores TERM)
    timeout -k 15 "$limit" "$@" >> "$LOG" 2>&1
    echo "   $name: exit $? after $((SECONDS - t0))s" | tee -a "$LOG"
}

python3 -m pip install -q --no-deps --no-build-isolation -e . >> "$LOG" 2>&1
# the card this call runs on (h200, h100-sxm, ...): the steps that calibrate and serve name it,
# so a call that lands on an H100 measures the H100's files (the H200's preset is refused there)
CARD=$(python3 -c "from pdmux_triton.spec.gpus import detect_gpu; print(detect_gpu().name)" \
    2>> "$LOG") || CARD=h200
export CARD
echo "card: $CARD" | tee -a "$LOG"
# the README's main command for a GPU machine, verbatim (its output is the step's log)
step readme 240 bash -c 'python3 -m pip install --no-build-isolation -e . && pdmux-triton run --gpu h200'
# TESTS_FILES splits the suite between calls (it outlasts one: 'tests/test_[a-g]*.py', then h-z)
step tests ${TESTS_S:-420} python3 -m pytest -q -rsP --durations=20 -m gpu ${TESTS_FILES:-tests} \
    ${TESTS_K:+-k "$TESTS_K"}
# the tagged pinned gates' gpu tests, one group at a time under its own short limit, so a
# launch that never ends costs one group, not the call (issue 26; session 44's second call
# never answered)
step tagged ${TAGGED_S:-240} bash -c 'for k in "grid_ids" \
    "stream_read_stays_on_its_sms and tagged" "decode_kernels_equal_the_capped_launch and tagged" \
    "one_a_site_sides and tagged"; do echo "-- $k"; timeout -k 5 60 python3 -m pytest -x -q -rsP \
    -m gpu tests/test_pinned.py -k "$k" || echo "-- exit $? ($k)"; done'
step host 90 pdmux-triton calibrate --host-costs --out "$OUT"
# where an eager layer's host time goes (cProfile): what makes chunked rounds launch-bound
step hostprof ${HOSTPROF_S:-150} python3 bench/host_profile.py --out "$OUT"
step profile 60 python3 bench/profile_decode.py --budget 16
step kernels 110 python3 bench/bench_kernels.py --quick --out "$OUT"
step calibrate 150 bash -c 'cp bench/results/calibrate-points-$CARD.jsonl \
    bench/results/calibrate-settings-$CARD.json "$OUT"/ && pdmux-triton calibrate --out "$OUT" \
    --workloads decode_attention,decode_linear,decode_step --ctas 1 --remeasure;
    rm -f "$OUT/calibrate-$CARD.png" "$OUT/calibrate-settings-$CARD.json"'
export CALIBRATION=bench/results/calibrate-$CARD.json
[ -f "$OUT/calibrate-$CARD.json" ] && CALIBRATION="$OUT/calibrate-$CARD.json"
export ADVISE_ITL_MS=${ADVISE_ITL_MS:-12} FLOOR_TURNS=${FLOOR_TURNS:-}
# the README's main command with --out, on this card: bench/results/run-<card>.json (the
# card's shipped measurements price its estimate)
step run ${RUN_S:-150} pdmux-triton run --gpu "$CARD" --out "$OUT" ${RUN_ARGS:-}
step advised 90 bash -c 'pdmux-triton levels --gpu $CARD --calibration "$CALIBRATION" --kind grid_cap \
    --itl-ms "$ADVISE_ITL_MS" --write-config /tmp/advised.yaml && cat /tmp/advised.yaml &&
    pdmux-triton run --out "$OUT/advised" --config /tmp/advised.yaml --kinds grid_cap \
    --calibration "$CALIBRATION" --compare bench/results/compare-$CARD.json;
    rm -f "$OUT/advised/run-$CARD.png"'
step occupancy 40 python3 bench/decode_occupancy.py --out "$OUT" --sections attention \
    --budgets 16,132 --cases 32x8192,ragged32_100_16000
step ncu 50 ncu --clock-control none -k regex:decode_kernel -c 1 --section SpeedOfLight \
    --section MemoryWorkloadAnalysis --section WarpStateStats python3 bench/profile_decode.py --budget 16
# the skinny GEMM (gate-up, M = 32, whole GPU) beside a streaming read of the same bytes: what
# holds the decode step's kernels below streaming reads of their bytes
step ncu_gemm 90 ncu --clock-control none -k 'regex:skinny_kernel|_stream_read_kernel' -c 2 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
    --section Occupancy --section LaunchStats python3 bench/profile_decode.py
# the decode GEMM's tile variants at batches past 64 rows on few SMs (GEMM_MS: 72, 96, 128)
step gemm_rows ${GEMM_ROWS_S:-200} python3 bench/decode_occupancy.py --out "$OUT" --sections gemm \
    --budgets ${GEMM_BUDGETS:-20,28,44,60,132} --shapes qkv,o,gate_up,down --ms ${GEMM_MS:-72,128}
step steps ${STEPS_S:-240} python3 bench/step_errors.py --out "$OUT" ${STEP_ARGS:-}
# the decode step by SMs, alone and beside a prefill, at other batches than the calibration's,
# into a copy of the committed calibration (what its rows cost beyond their bytes)
step batches ${BATCHES_S:-360} bash -c 'mkdir -p "$OUT/batches" && cp "$(dirname "$CALIBRATION")"/calibrate-points-$CARD.jsonl \
    bench/results/calibrate-settings-$CARD.json "$OUT/batches"/ && pdmux-triton calibrate \
    --out "$OUT/batches" --workloads decode_step --kinds grid_cap --ctas 1 --remeasure \
    --budgets ${BATCH_BUDGETS:-20,28,36,44,52,60,132} \
    --decode-batches ${BATCHES:-1,8,16,40,48,56,64,72,96,128};
    rm -f "$OUT"/batches/*.png "$OUT/batches/calibrate-settings-$CARD.json"'
# the decode step by SMs, alone and beside a prefill, at longer contexts a request than the
# calibration's (its batch), into a copy of the committed calibration: a step's KV read as
# contexts grow (decode steps of the prefix trace's long contexts ran 0.93-1.06 of their price
# by level, the trace windows' short ones 1.04-1.08 at every level: bench/NOTES.md session 61)
step contexts ${CONTEXTS_S:-300} bash -c 'mkdir -p "$OUT/contexts" && cp "$(dirname "$CALIBRATION")"/calibrate-points-$CARD.jsonl \
    bench/results/calibrate-settings-$CARD.json "$OUT/contexts"/ && pdmux-triton calibrate \
    --out "$OUT/contexts" --workloads decode_step --kinds grid_cap --ctas 1 --remeasure \
    --budgets ${CONTEXT_BUDGETS:-20,28,36,44,52,60,132} --decode-contexts ${CONTEXTS:-4096,8192};
    rm -f "$OUT"/contexts/*.png "$OUT/contexts/calibrate-settings-$CARD.json"'
# pinned partitions (issue 26): their gpu tests, then the decode step against its floor and
# pinned SMs against green contexts at every level and 1-3 CTAs per SM (bench/decode_floor.py;
# the kernel benchmark's and the chapter run's figures from this call's files when it made them)
step pinned ${PINNED_S:-240} python3 -m pytest -q -rP -m gpu tests -k pinned
# what the pinned gate costs: its pieces one at a time on the skinny GEMM (bench/gate_anatomy.py),
# then the whole step pinned against plain, green and capped (bench/pinned_sites.py)
step anatomy ${ANATOMY_S:-120} python3 bench/gate_anatomy.py --out "$OUT"
step sites ${SITES_S:-150} python3 bench/pinned_sites.py --out "$OUT"
# a prefill's MFU by prompt length on the whole GPU, and its GEMMs against cuBLAS (issue 27:
# what the simulator's one whole-GPU MFU misses on short prompts); long prompts and prompts
# after a cached prefix, on the whole GPU and on PREFILL_SMS (grid-capped): linear and
# attention FLOPs' rates apart (NOTES 000d: attention over long contexts is priced short)
step prefill ${PREFILL_S:-240} python3 bench/prefill_rate.py --out "$OUT" --sms ${PREFILL_SMS:-80,112}
# a chunked-prefill step's layers by their decode rows against the simulator's price, with its
# GEMMs and the rows' decode attention apart (bench/mixed_layers.py; issue 27: against their
# price, served chunked rounds with decode rows sit above those without, NOTES session 59)
step mixed ${MIXED_S:-240} python3 bench/mixed_layers.py --out "$OUT" ${MIXED_ARGS:-}
# a level's prefill beside its decode for seconds on end against the comparison's ~60 ms burst,
# with NVML's SM clock and power (bench/sustained_corun.py; issue 27: served PD-mux batches run
# slower than the burst prices them)
step sustained ${SUSTAINED_S:-240} python3 bench/sustained_corun.py --out "$OUT" ${SUSTAINED_ARGS:-}
# (the kernel benchmark's and a run's files of this card only: this call's, else the committed
# kernel benchmark's)
step floor ${FLOOR_S:-300} bash -c 'k=$OUT/kernels-$CARD.json
    [ -f "$k" ] || k=bench/results/kernels-$CARD.json
    python3 bench/decode_floor.py --out "$OUT" $( [ -f "$k" ] && echo --kernels "$k" ) \
    $( [ -f "$OUT/run-$CARD.json" ] && echo --run "$OUT/run-$CARD.json" ) \
    ${FLOOR_TURNS:+--turns "$FLOOR_TURNS"}'
# the simulator against the GPU on windows of the Azure traces (bench/trace_fidelity.py); its
# points go to bench/results/trace-fidelity (carried back in $OUT), so a call cut short by its
# limit resumes there on the next call once they are copied back into the tree
step fidelity ${FIDELITY_S:-540} python3 bench/trace_fidelity.py --out bench/results ${FIDELITY_ARGS:-}
case " $STEPS " in *" fidelity "*)
    mkdir -p "$OUT/trace-fidelity" && cp bench/results/trace-fidelity/points-*.jsonl "$OUT/trace-fidelity/"
    cp bench/results/trace-fidelity-*.json "$OUT/" 2>/dev/null ;; esac
# capacity points go to CAPACITY_OUT (bench/results unless named: ShareGPT at 1000 requests a
# point; bench/results/capacity-burst-100 holds the 100-request bursts), which travels with the
# tree: a call cut short by its time limit resumes there on the next call (copy the points
# back between calls); CAPACITY_ARGS adds flags (a trace: --trace FILE --trace-start N ...)
export RATES=${RATES:-}
export STRATEGIES=${STRATEGIES:-prefill_first,chunked_512,chunked_2048,pdmux_grid_cap}
CAPACITY_OUT=${CAPACITY_OUT:-bench/results}
# a stream's length (bench/results holds 1000-request points); a trace's is its --trace-count
case "${CAPACITY_ARGS:-}" in *--trace*) COUNT_FLAG=() ;; *) COUNT_FLAG=(--count "${COUNT:-1000}") ;; esac
step capacity ${CAPACITY_S:-540} pdmux-triton capacity --out "$CAPACITY_OUT" \
    "${COUNT_FLAG[@]}" --strategies "$STRATEGIES" ${RATES:+--rates "$RATES"} \
    --calibration "$CALIBRATION" --compare bench/results/compare-$CARD.json \
    --host-costs bench/results/host-costs-$CARD.json ${CAPACITY_ARGS:-}
# as one tarball: the device returns at most 8 files, and two capacity calls in one device call
# would lose the second's points (session 21 lost one that way)
case " $STEPS " in *" capacity "*) tar czf "$OUT/capacity-$(basename "$CAPACITY_OUT").tgz" \
    -C "$CAPACITY_OUT" $(cd "$CAPACITY_OUT" && ls capacity-*"$CARD"*) ;; esac
# SGLang's level rule against SLO-driven levels (bench/slo_levels.py; its points resume too),
# into SLO_OUT (another folder for other settings: --count, --itl-ms), returned as a tarball
SLO_OUT=${SLO_OUT:-bench/results}
step slo ${SLO_S:-540} python3 bench/slo_levels.py --out "$SLO_OUT" ${SLO_ARGS:-}
case " $STEPS " in *" slo "*) [ -d "$SLO_OUT/slo-levels" ] && tar czf "$OUT/$(basename "$SLO_OUT")-slo-levels.tgz" \
    "$SLO_OUT/slo-levels" "$SLO_OUT"/slo-levels-"$CARD"*.json 2>/dev/null;; esac
# prefix caching on Mooncake's conversation trace (issue 28, bench/prefix_cache.py): each
# strategy's capacity measured with the cache on and off at PREFIX_RATES, the simulation beside;
# its points resume under bench/results/prefix-cache/ (copy them back between calls); a point
# takes its untimed PREFIX_WARM requests, then 200/rate s of arrivals and the drain: at 0.6
# req/s with 100 warm it outlasts one call (~570 s), so slow points take PREFIX_WARM=40
step prefix ${PREFIX_S:-540} python3 bench/prefix_cache.py --out bench/results \
    --traces ${PREFIX_TRACES:-conv} --window ${PREFIX_WINDOW:-3000:200} \
    --strategies ${PREFIX_STRATEGIES:-pdmux_grid_cap,chunked_512} --rates ${PREFIX_RATES:-1.5,2} \
    --warm-requests ${PREFIX_WARM:-100} ${PREFIX_ARGS:-}
case " $STEPS " in *" prefix "*) tar czf "$OUT/prefix-cache.tgz" -C bench/results prefix-cache \
    $(cd bench/results && ls prefix-cache-"$CARD"*.json 2>/dev/null) ;; esac
grep -E "^(== |   )|passed|failed|MISS|  ok|capacity req/s|pdmux_|chunked_|prefill_first|^sharegpt|^arxiv" \
    "$LOG" | tail -40
