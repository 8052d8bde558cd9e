#!/usr/bin/env bash
# Side-by-side: moshi-native vs Kyutai's candle `moshi` 0.6.4 (and optionally Kyutai's PyTorch Mimi),
# interleaved process by process for several rounds, on the same synthetic bundle. Prints a
# markdown summary (medians over rounds, min–max, ours/theirs ratios) and keeps the raw log.
#
#   tools/bench/compare.sh --bundle DIR [--rounds 3] [--threads 1,2] [--what lm,mimi] \
#                          [--lm-frames 2] [--mimi-frames 20] [--torch] [--ours-formats q4_0,mlx-q4] [--log FILE] \
#                          [--positions 0,375,3000] [--kv f32] [--probe] [--ours-lm-args "--ab-avx512"]
#
# --positions: LM KV positions, on both sides (ours: `LmGen::seek_for_bench`; candle: its per-layer
# `RotatingKvCache`s refilled with that many entries before each frame, see benches/baselines/src/main.rs).
# Default 0. --kv: our temporal KV element type(s) (default f32, the runtime default and the type
# candle's cache holds on CPU; `f32,bf16` times both). --probe: run `moshi-native bench probe` right
# before each candle LM process, so candle's rows also get a ratio to a roofline measured next to them
# (weight bytes and f32 KV bytes per frame taken from our q8 bundle rows of the same position).
# --ours-lm-args: extra arguments for our `bench lm` processes (word-split), e.g. "--ab-avx512".
#
# --ours-formats also times our LM on synthetic in-memory weights of those formats each round (for
# "q4 vs candle q8"). DIR must hold model.q8.gguf and the Mimi safetensors (`moshi-native synth --format q8-gguf --out DIR`).
# Environment:
#   OURS    command for our bench (default: target/release/moshi-native bench)
#   THEIRS  candle baseline binary (default: benches/baselines/target/release/moshi-native-baselines;
#           build it with `cd benches/baselines && cargo build --release`, ~12 min cold)
#   VENV    Python env with moshi 0.2.13 + torch for --torch (default: venv-oracle next to the checkout)
#   LOCK    if set, every process that holds a full-size LM runs as `flock $LOCK ...` (one process at a
#           time, so on a shared machine the lock is held for one process, ~1 min, not the whole run)
# Rounds alternate which side goes first, so slow drift of the machine's load hits both sides.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=3; THREADS=1,2; WHAT=lm,mimi; LMF=2; MIF=20; TORCH=0; BUNDLE=""; LOG=""; OFMT=""; POS=0; KV=f32; PROBE=0; OLMA=""
while [ $# -gt 0 ]; do
  case "$1" in
    --bundle) BUNDLE=$2; shift 2;;
    --rounds) ROUNDS=$2; shift 2;;
    --threads) THREADS=$2; shift 2;;
    --what) WHAT=$2; shift 2;;
    --lm-frames) LMF=$2; shift 2;;
    --mimi-frames) MIF=$2; shift 2;;
    --torch) TORCH=1; shift;;
    --ours-formats) OFMT=$2; shift 2;;
    --log) LOG=$2; shift 2;;
    --positions) POS=$2; shift 2;;
    --kv) KV=$2; shift 2;;
    --probe) PROBE=1; shift;;
    --ours-lm-args) OLMA=$2; shift 2;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0;;
    *) echo "unknown argument $1" >&2; exit 2;;
  esac
done
[ -n "$BUNDLE" ] || { echo "--bundle DIR is required" >&2; exit 2; }
OURS=${OURS:-target/release/moshi-native bench}
THEIRS=${THEIRS:-benches/baselines/target/release/moshi-native-baselines}
VENV=${VENV:-$(realpath -m ../venv-oracle)}
L=(); [ -n "${LOCK:-}" ] && L=(flock "$LOCK")
GGUF="$BUNDLE/model.q8.gguf"
MIMI=$(ls "$BUNDLE"/tokenizer-*.safetensors | head -1)
LOG=${LOG:-$(mktemp /tmp/moshi-bench-compare.XXXXXX.log)}
: > "$LOG"
echo "# $(date -u +%FT%TZ) $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs, loadavg $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$LOG"

# Runs one side, tagging every result/median line with the round.
tag() { local r=$1; shift; "$@" 2>>"$LOG.stderr" | sed -u "s/^\(result\|median\) /\1 round_tag=$r /" | tee -a "$LOG" | grep -E '^(result|median)' || true; }

ours_mimi()   { tag "$1" $OURS mimi --bundle "$BUNDLE" --rounds 1 --mimi-frames "$MIF" --threads "$THREADS"; }
theirs_mimi() { tag "$1" "$THEIRS" mimi --weights "$MIMI" --rounds 1 --frames "$MIF" --threads "$THREADS"; }
torch_mimi()  { tag "$1" env NO_TORCH_COMPILE=1 "$VENV/bin/python" tools/bench/torch_mimi.py --weights "$MIMI" --rounds 1 --frames "$MIF" --threads "$THREADS"; }
ours_lm()     { tag "$1" "${L[@]}" $OURS lm --bundle "$BUNDLE" --rounds 1 --lm-frames "$LMF" --positions "$POS" --kv "$KV" --batch 0 --threads "$THREADS" $OLMA; }
ours_lm_fmt() { tag "$1" "${L[@]}" $OURS lm --formats "$OFMT" --rounds 1 --lm-frames "$LMF" --positions "$POS" --kv "$KV" --batch 0 --threads "$THREADS" $OLMA; }
# The probe lines are re-tagged `impl=candle_probe` so that summarize.py pairs them with candle's rows.
theirs_probe() { $OURS probe --threads "$THREADS" 2>>"$LOG.stderr" \
                   | sed -u -n "s/^result impl=ours what=read_probe /result round_tag=$1 impl=candle_probe what=read_probe /p" | tee -a "$LOG" || true; }
theirs_lm()   { if [ "$PROBE" = 1 ]; then theirs_probe "$1"; fi
                tag "$1" "${L[@]}" "$THEIRS" lm --gguf "$GGUF" --rounds 1 --frames "$LMF" --positions "$POS" --threads "$THREADS"; }

for r in $(seq 0 $((ROUNDS - 1))); do
  echo "## round $r" | tee -a "$LOG"
  if [[ ",$WHAT," == *",mimi,"* ]]; then
    if [ $((r % 2)) -eq 0 ]; then ours_mimi "$r"; theirs_mimi "$r"; else theirs_mimi "$r"; ours_mimi "$r"; fi
    [ "$TORCH" = 1 ] && torch_mimi "$r"
  fi
  if [[ ",$WHAT," == *",lm,"* ]]; then
    if [ $((r % 2)) -eq 0 ]; then ours_lm "$r"; theirs_lm "$r"; else theirs_lm "$r"; ours_lm "$r"; fi
    if [ -n "$OFMT" ]; then ours_lm_fmt "$r"; fi
  fi
done
echo
echo "raw log: $LOG"
python3 tools/bench/summarize.py "$LOG"
