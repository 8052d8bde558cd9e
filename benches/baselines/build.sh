#!/usr/bin/env bash
# Builds the candle baseline: prepares the hooked copy of `moshi` 0.6.4 (patch-moshi.sh), then
# `cargo build --release` with -C target-cpu=native (.cargo/config.toml). Extra arguments go to cargo.
set -euo pipefail
cd "$(dirname "$0")"
./patch-moshi.sh
cargo build --release "$@"
