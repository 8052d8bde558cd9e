#!/usr/bin/env bash
# One command that reruns every table of the "Current figures" part of BENCHMARKS.md, on one release
# build of the checked-out commit, in priority order, inside a time budget.
#
#   tools/bench/full-run.sh LOG [--quick] [--budget-min 35] [--data DIR] [--parts 1,2,...] [--prepare]
#
# LOG      file the whole run is written to (also echoed); it starts with the commit (and whether the
#          tree is clean), the last commit that changed measured code, lscpu's model/family/flags, the
#          load average and the date; every command is printed before its output, with the time and the
#          load average, and followed by its exit status and wall time.
# --quick  smoke run (one round, few frames): checks that every command works and times each part;
#          figures from it are not to be quoted. Each part loads full-size weights (15-25 s per load), so
#          all parts take ~6-10 min; `--quick --parts 1,2` about 1 min.
# --budget-min N  hard time budget in minutes (default 35): a part whose estimate no longer fits is
#          skipped (said in the log), and every command is killed at the deadline.
# --data DIR      the bundles (default $BENCH_DATA): moshiko-q8 (`synth --format q8-gguf`), moshiko-q4
#          (q4-gguf), moshiko-mlx-q4 (mlx-q4). A part that needs a missing bundle is skipped.
# --prepare       write missing bundles first (untimed, one at a time, ~1-2.5 min each; ~18 GB in all).
# --parts LIST    run only these parts (default all, in the order below).
#
# Environment: THEIRS (candle baseline binary, default benches/baselines/target/release/moshi-native-baselines;
# build it with benches/baselines/build.sh), VENV (PyTorch env for the Mimi side by side, see
# tools/oracle/README.md; default ../venv-oracle; skipped when missing), PY_VENV (part 10), LOCK (default /tmp/moshi-bench.lock:
# held for the whole run, so nothing else full-size runs meanwhile).
#
# Parts, in priority order, and the BENCHMARKS.md tables each one fills (full-mode rounds chosen so that
# the whole run fits 35 min on the 2-vCPU machine it was written for; see the estimates in `part`):
#   1 lm       "LM frame": q8_0, q4_0, MLX q4, bf16 weights; 1 and 2 threads; KV positions 0 and 3000;
#              f32 and bf16 KV (bf16 weights: bf16 KV); ratio to the same-round read probe. The 4-session
#              LmBatchGen ratio of "Batched step" comes from the q8_0/q4_0/MLX q4 processes (--batch 4).
#   2 mimi     "Mimi": streaming encode + decode, AVX-512 allowed/forbidden interleaved.
#   3 compare  "Side by side": candle's LM on the same q8 GGUF (ours from the bundle and in-memory q4_0)
#              at positions 0 and 3000, and Mimi against candle and PyTorch (tools/bench/compare.sh).
#   4 duplex   "The product frame pass": bench duplex overhead, q8 and q4 bundles.
#   5 batch    "Batched step" (runtime BatchRunner LM tick at 0 and 3000) and "Mimi across slots"
#              (bench batch, Mimi only: the server-tick half does not fit 24 GiB, see part 5).
#   6 kernels  "Kernels": compute ceiling per kernel (hot) and attention over a 3000-entry window.
#   7 load     "Load memory and start-up": peak RSS of a bundle load + one frame (q8 GGUF, MLX q4, Mimi
#              only); warm start-up of `duplex` (to first audio) and `serve` (to its listening line).
#   8 server   "Server": the loopback load test on the tiny fixture bundle (release build).
#   9 drift    "Quantized fast path vs exact mode" (accuracy, not speed; full-size test, ~2 min).
#  10 rustymimi "Mimi through the Python package vs rustymimi" (needs PY_VENV, see part 10).
set -uo pipefail
cd "$(dirname "$0")/../.."

LOG=""; QUICK=0; BUDGET=35; DATA=${BENCH_DATA:-}; PARTS=1,2,3,4,5,6,7,8,9,10; PREPARE=0
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1; shift;;
    --budget-min) BUDGET=$2; shift 2;;
    --data) DATA=$2; shift 2;;
    --parts) PARTS=$2; shift 2;;
    --prepare) PREPARE=1; shift;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0;;
    -*) echo "unknown argument $1" >&2; exit 2;;
    *) LOG=$1; shift;;
  esac
done
[ -n "$LOG" ] || { echo "usage: $0 LOG [--quick] [--budget-min N] [--data DIR] [--parts LIST] [--prepare]" >&2; exit 2; }
[ -n "$DATA" ] || { echo "--data DIR (or BENCH_DATA) is required" >&2; exit 2; }
mkdir -p "$(dirname "$LOG")"
: > "$LOG"
exec > >(tee -a "$LOG") 2>&1

B=target/release/moshi-native
EX=target/release/examples
THEIRS=${THEIRS:-benches/baselines/target/release/moshi-native-baselines}
VENV=${VENV:-$(realpath -m ../venv-oracle)}
LOCK=${LOCK:-/tmp/moshi-bench.lock}
Q8=$DATA/moshiko-q8; Q4=$DATA/moshiko-q4; MLX4=$DATA/moshiko-mlx-q4
WORK=$(mktemp -d /tmp/moshi-full-run.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

now() { date +%s; }
stamp() { echo "$(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"; }

# --- build (before the clock starts; a no-op when the binaries are up to date) ------------------------
echo "# build"
for c in "cargo build --release -p moshi-native" \
         "cargo build --release -p moshi-kernels --features bench --example kernel_bench" \
         "cargo build --release -p moshi-bench --example batch_tick" \
         "cargo build --release -p moshi-server-native --example load" \
         "cargo test --release -p moshi-model --test fast_path_drift --no-run"; do
  echo "\$ $c"; $c 2>&1 | grep -v '^ *Compiling' || { echo "build failed: $c"; exit 1; }
done

# --- bundles -----------------------------------------------------------------------------------------
have() { [ -d "$1" ] && ls "$1"/tokenizer-*.safetensors >/dev/null 2>&1; }
if [ "$PREPARE" = 1 ]; then
  for spec in "$Q8 q8-gguf" "$Q4 q4-gguf" "$MLX4 mlx-q4"; do
    set -- $spec
    if ! have "$1"; then
      echo "\$ $B synth --variant moshiko --format $2 --out $1"
      flock "$LOCK" $B synth --variant moshiko --format "$2" --out "$1" || exit 1
    fi
  done
fi

# --- provenance --------------------------------------------------------------------------------------
exec 9>"$LOCK"
echo "# waiting for $LOCK"; flock 9
START=$(now); DEADLINE=$((START + BUDGET * 60))
echo "# full-run $( [ $QUICK = 1 ] && echo '--quick (smoke: do not quote)' ) started $(date -u +%FT%TZ), budget $BUDGET min (deadline $(date -u -d @$DEADLINE +%T) UTC)"
dirty=$(git status --porcelain --untracked-files=no | wc -l)
echo "# commit $(git rev-parse --short HEAD) ($( [ "$dirty" = 0 ] && echo clean || echo "DIRTY: $dirty files changed" )); last commit changing measured code: $(git log -1 --format='%h %cd' --date=iso -- crates Cargo.toml Cargo.lock benches/baselines)"
echo "# binary $B built $(date -u -r $B +%FT%TZ)"
echo "# cpu: $(lscpu | sed -n 's/^Model name: *//p'), family $(lscpu | sed -n 's/^CPU family: *//p') model $(lscpu | sed -n 's/^Model: *//p'), $(nproc) CPUs, $(lscpu | sed -n 's/^Thread(s) per core: *//p') thread(s)/core, L2 $(lscpu | sed -n 's/^L2 cache: *//p'), L3 $(lscpu | sed -n 's/^L3 cache: *//p'), hypervisor $(lscpu | sed -n 's/^Hypervisor vendor: *//p')"
flags=$(grep -m1 '^flags' /proc/cpuinfo)
echo "# simd: $(for f in avx2 fma f16c avx_vnni avx512f avx512bw avx512vl avx512_vnni avx512_bf16 amx_int8; do [[ " $flags " == *" $f "* ]] && printf '%s ' $f; done)"
echo "# memory: $(free -g | awk '/^Mem:/ {print $2 " GiB total, " $7 " GiB available"}'), THP $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null)"
echo "# load average at start: $(cat /proc/loadavg)"
echo "# other processes above 5 % CPU: $(ps -eo pcpu=,comm= --sort=-pcpu | awk '$1 > 5 {printf "%s(%s%%) ", $2, $1}')"

# run CMD...: prints the command, runs it killed at the deadline, prints its status and wall time.
run() {
  local left=$((DEADLINE - $(now)))
  if [ "$left" -lt 15 ]; then echo "## SKIPPED (time budget): $*"; return 0; fi
  echo; echo "\$ $*"; echo "# at $(stamp)"
  local t0; t0=$(date +%s.%N)
  timeout --signal=INT --kill-after=15 "$left" "$@"
  local rc=$?
  echo "# rc=$rc wall=$(echo "$(date +%s.%N) - $t0" | bc) s, at $(stamp)"
}
# part N NAME EST_MIN: whether part N is selected and its estimate still fits the budget.
part() {
  [[ ",$PARTS," == *",$1,"* ]] || return 1
  local left=$((DEADLINE - $(now)))
  echo; echo "################ part $1: $2 (estimate $3 min, $((left / 60)) min left) at $(stamp)"
  if [ $((left / 60)) -lt "$3" ] && [ "$QUICK" = 0 ]; then echo "## SKIPPED part $1 (estimate $3 min > $((left / 60)) min left)"; return 1; fi
  PART_T0=$(now); return 0
}
done_part() { echo "################ part $1 took $(( $(now) - PART_T0 )) s"; }

if [ "$QUICK" = 1 ]; then
  R=1; LMF=1; POS=0,3000; MIF=3; DR=1; DLF=1; DMF=2; DDF=2; BR=1; BMF=3; BT_R=1; KR_HOT=1; KR_ATTN=1; CR=1; CLF=1; CMF=5
  SRV_S=5; SRV2_S=3; RM_F=3; RM_R=1; DRIFT=1; DRIFT_F=q8_0; LM_FORMATS="q4_0"; LM_BF16=0; STARTS=1
else
  # Rounds chosen from a smoke run's per-part wall times (2 vCPUs, Intel Xeon, loaded machine): part 1
  # ~45 s per format and round-1 process there, i.e. ~1-1.5 min per format at 5 rounds on a quiet machine;
  # compare ~95 s per LM round (the model loads dominate: ours, candle, our q4_0); duplex ~20 s of load per
  # bundle + ~8 s per round; kernel hot ~35 s per round. Sum of the estimates in `part` below: ~30 min.
  R=5; LMF=1; POS=0,3000; MIF=20; DR=6; DLF=3; DMF=10; DDF=6; BR=5; BMF=20; BT_R=3; KR_HOT=3; KR_ATTN=5; CR=3; CLF=2; CMF=20
  SRV_S=30; SRV2_S=15; RM_F=30; RM_R=3; DRIFT=6; DRIFT_F=q8_0,mlx-q4; LM_FORMATS="q8_0 q4_0 mlx-q4"; LM_BF16=1; STARTS=2
fi

if part 1 lm 7; then
  for f in $LM_FORMATS; do
    run $B bench lm --formats $f --positions $POS --kv f32,bf16 --threads 1,2 --rounds $R --lm-frames $LMF --batch 4
  done
  [ "$LM_BF16" = 1 ] && run $B bench lm --formats bf16 --positions $POS --kv bf16 --threads 1,2 --rounds $R --lm-frames $LMF --batch 0
  done_part 1
fi

if part 2 mimi 1; then
  run $B bench mimi --threads 1,2 --rounds $R --mimi-frames $MIF --ab-avx512
  done_part 2
fi

if part 3 compare 7; then
  if [ -x "$THEIRS" ] && have "$Q8"; then
    run env OURS="$B bench" THEIRS="$THEIRS" tools/bench/compare.sh --bundle "$Q8" --what lm --positions $POS \
      --threads 1,2 --rounds $CR --lm-frames $CLF --kv f32 --probe --ours-formats q4_0 --log "$WORK/compare-lm.log"
    T=(); [ -x "$VENV/bin/python" ] && T=(--torch) || echo "## no PyTorch env at $VENV: Mimi side by side without torch"
    run env OURS="$B bench" THEIRS="$THEIRS" VENV="$VENV" tools/bench/compare.sh --bundle "$Q8" --what mimi \
      --threads 1,2 --rounds $CR --mimi-frames $CMF "${T[@]}" --log "$WORK/compare-mimi.log"
  else
    echo "## SKIPPED part 3: candle baseline ($THEIRS) or bundle $Q8 missing"
  fi
  done_part 3
fi

if part 4 duplex 3; then
  for d in "$Q8" "$Q4"; do
    if have "$d"; then
      run $B bench duplex --bundle "$d" --threads 1,2 --rounds $DR --lm-frames $DLF --mimi-frames $DMF \
        --duplex-frames $DDF --kv f32 --probe-mb 16
    else echo "## SKIPPED: bundle $d missing"; fi
  done
  done_part 4
fi

if part 5 batch 2; then
  # Mimi slots only (synthetic in-memory Mimi): with --bundle, `bench batch` adds the whole server tick,
  # whose 4-slot runner and 4 single sessions hold 8 f32 KV caches (8 x 3.1 GB) next to the weights:
  # killed for memory on a 24 GiB machine (crates/bench/src/drivers/batch.rs, bench_server_tick).
  run $B bench batch --slots 4 --threads 1,2 --rounds $BR --mimi-frames $BMF
  run $EX/batch_tick --formats q4_0 --threads 1,2 --positions $POS --context 3000 --rounds $BT_R --frames 2 --slots 4
  done_part 5
fi

if part 6 kernels 3; then
  run $EX/kernel_bench $KR_HOT 384 hot
  run $EX/kernel_bench $KR_ATTN 384 attn
  run $EX/kernel_bench $KR_ATTN 384 pool
  done_part 6
fi

if part 7 load 4; then
  # Peak RSS (bundle load + one frame, includes the bench's 512 MiB read probe); the page cache is warm
  # from the parts above.
  for d in "$Q8" "$MLX4"; do
    if have "$d"; then
      run /usr/bin/time -v $B bench lm --bundle "$d" --rounds 1 --lm-frames 1 --positions 0 --threads 1 --batch 0
    else echo "## SKIPPED: bundle $d missing"; fi
  done
  if have "$Q8"; then
    run /usr/bin/time -v $B bench mimi --bundle "$Q8" --rounds 1 --mimi-frames 5 --threads 1
    # Warm start-up: time to first audio of `duplex` on a two-frame input, twice.
    python3 -c "import wave; w=wave.open('$WORK/two_frames.wav','wb'); w.setnchannels(1); w.setsampwidth(2); w.setframerate(24000); w.writeframes(bytes(2*3840)); w.close()"
    for i in $(seq $STARTS); do
      run /usr/bin/time -v $B duplex --model-dir "$Q8" --in "$WORK/two_frames.wav" --out "$WORK/out.wav" --threads 2
    done
    # `serve` start-up: process start to its listening line, peak RSS; stopped with SIGTERM there.
    for i in $(seq $STARTS); do
      echo; echo "\$ /usr/bin/time -v $B serve --model-dir $Q8 --threads 2 --port 18999   (SIGTERM at its URL line)"; echo "# at $(stamp)"
      t0=$(date +%s.%N)
      /usr/bin/time -v -o "$WORK/serve.time" $B serve --model-dir "$Q8" --threads 2 --port 18999 > "$WORK/serve.log" 2>&1 &
      sp=$!
      while kill -0 $sp 2>/dev/null && ! grep -q -E 'listening on|serve: https?://' "$WORK/serve.log"; do
        sleep 0.05; [ $(now) -ge $DEADLINE ] && break
      done
      echo "# listening after $(echo "$(date +%s.%N) - $t0" | bc) s"
      pkill -TERM -P $sp 2>/dev/null; wait $sp
      grep -v '^\s*$' "$WORK/serve.log" | tail -n 20
      grep -E 'Maximum resident|Elapsed' "$WORK/serve.time"
    done
  else echo "## SKIPPED start-up: bundle $Q8 missing"; fi
  done_part 7
fi

if part 8 server 1; then
  run $EX/load --clients 8 --seconds $SRV_S
  run $EX/load --clients 32 --seconds $SRV2_S
  done_part 8
fi

if part 9 drift 3; then
  run env MOSHI_DRIFT_STEPS=$DRIFT MOSHI_DRIFT_FORMATS=$DRIFT_F cargo test --release -p moshi-model --test fast_path_drift -- --ignored --nocapture
  done_part 9
fi

if part 10 rustymimi 1; then
  # Needs a Python env with the package and rustymimi: python3.11 -m venv $PY_VENV &&
  # $PY_VENV/bin/pip install numpy rustymimi ./crates/python (a release build of the package, ~5-10 min).
  if [ -x "${PY_VENV:-/nonexistent}/bin/python" ] && have "$Q8"; then
    run "$PY_VENV/bin/python" crates/python/bench/mimi_vs_rustymimi.py --mimi "$(ls "$Q8"/tokenizer-*.safetensors | head -1)" \
      --frames $RM_F --rounds $RM_R --threads 1 2
  else echo "## SKIPPED part 10: no PY_VENV with moshi_native + rustymimi, or bundle $Q8 missing"; fi
  done_part 10
fi

echo; echo "# full-run ended $(date -u +%FT%TZ) after $(( $(now) - START )) s; load $(cat /proc/loadavg)"
