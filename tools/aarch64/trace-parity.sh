#!/usr/bin/env bash
# `moshi-native trace mimi|lm|duplex` on x86_64 and under qemu (aarch64, -cpu $AARCH64_QEMU_CPU,
# default max): codes/tokens identical, floats within 1e-4 (tools/aarch64/compare_traces.py).
# Needs ../shared/tools/aarch64/setup-aarch64.sh to have run, and both release binaries:
#   cargo build --release -p moshi-native
#   bash ../shared/tools/aarch64/test-aarch64.sh build --release -p moshi-native
set -euo pipefail
cd "$(dirname "$0")/../.."
x86=target/release/moshi-native
a64=${CARGO_TARGET_DIR_AARCH64:-target/aarch64-qemu}/aarch64-unknown-linux-gnu/release/moshi-native
run_a64() { qemu-aarch64-static -cpu "${AARCH64_QEMU_CPU:-max}" "$a64" "$@"; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for side in x86 a64; do
  run=$x86; [ $side = a64 ] && run=run_a64
  $run trace mimi --model-dir fixtures/lm --input fixtures/mimi/input.wav --out "$out/mimi.$side.safetensors"
  $run trace lm --model-dir fixtures/lm --user-codes fixtures/lm/CODES.safetensors --out "$out/lm.$side.safetensors" --greedy
  $run trace duplex --model-dir fixtures/lm --input fixtures/duplex/input.wav --out "$out/duplex.$side.safetensors" --greedy
done
for t in mimi lm duplex; do
  python3 tools/aarch64/compare_traces.py "$out/$t.x86.safetensors" "$out/$t.a64.safetensors" 1e-4
done
