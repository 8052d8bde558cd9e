#!/usr/bin/env bash
# Runs every cargo-fuzz target for a fixed number of executions and reports execs and crashes.
#   tools/fuzz/run.sh [RUNS]      (default 1000000; CI smoke: tools/fuzz/run.sh 2000)
# Needs `cargo install cargo-fuzz`. cargo-fuzz needs nightly flags (-Zsanitizer); on the stable
# toolchain RUSTC_BOOTSTRAP=1 enables them. Seed corpora are built from the committed fixtures.
set -uo pipefail
cd "$(dirname "$0")/../../fuzz"
RUNS=${1:-1000000}
export RUSTC_BOOTSTRAP=1
fx=../fixtures
seed() { # seed <target> <files...>
  local d=corpus/$1; shift; mkdir -p "$d"
  for f in "$@"; do [ -f "$f" ] && cp -L "$f" "$d/$(basename "$f")"; done
}
seed safetensors_header $fx/mimi/mimi.safetensors $fx/lm/model.safetensors $fx/lm/CODES.safetensors $fx/quant/*.safetensors
seed gguf_header $fx/quant/*.gguf $fx/lm_gguf_q8/*.gguf $fx/*/*.gguf
seed mlx_triplets $fx/lm_mlx_q4/*.safetensors $fx/lm_mlx_q8/*.safetensors
seed spm_model $fx/spm/*.model $fx/lm/tokenizer_spm_32k_3.model
seed wav_read $fx/audio/hello.wav $fx/mimi/input.wav $fx/duplex/*.wav
seed ogg_opus_input $fx/ogg/*.ogg ../crates/server/tests/data/*.ogg
seed ws_message
printf '\x00\x00\x00\x00\x00' > corpus/ws_message/handshake
printf 'text_temperature=0.7&text_topk=25&audio_temperature=0.8&audio_topk=250&pad_mult=0&repetition_penalty=1.0&repetition_penalty_context=64&text_seed=1&audio_seed=2&max_steps=100' > corpus/ws_message/query
# Build every target once (release + ASan + coverage), then run the binaries directly, so that a
# source change in the middle of a long campaign cannot trigger rebuilds between targets.
[ -n "${NO_BUILD:-}" ] || cargo fuzz build -O >/dev/null 2>&1 || { cargo fuzz build -O; exit 2; }
bindir=target/x86_64-unknown-linux-gnu/release
status=0
printf '%-20s %12s %8s %s\n' target execs crashes seconds
for t in ${TARGETS:-$(cargo fuzz list)}; do
  start=$(date +%s)
  log=$(mktemp)
  mkdir -p "artifacts/$t"
  "$bindir/$t" "corpus/$t" -artifact_prefix="artifacts/$t/" -runs="$RUNS" -max_len="${MAX_LEN:-65536}" \
    -rss_limit_mb=2048 -timeout=10 >"$log" 2>&1
  rc=$?
  execs=$(grep -o 'Done [0-9]* runs' "$log" | grep -o '[0-9]*' | tail -1)
  crashes=$(ls artifacts/"$t" 2>/dev/null | grep -c -E '^(crash|oom|timeout|leak)-' || true)
  printf '%-20s %12s %8s %s\n' "$t" "${execs:-?}" "$crashes" "$(( $(date +%s) - start ))"
  if [ $rc -ne 0 ]; then status=1; tail -30 "$log"; fi
  rm -f "$log"
done
exit $status
