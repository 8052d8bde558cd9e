#!/usr/bin/env bash
# Regenerates fixtures/tools/ (quantized fixtures made by the real tools). See README, "Fixtures made by
# the real tools". Needs the oracle venv (torch + moshi; `$ORACLE_VENV`, default `venv-oracle` next to the
# checkout), the MLX venv (mlx, moshi_mlx, gguf; `$MLX_VENV`, default `venv-mlx`) and cargo (builds benches/candle-gguf, candle's quantizer and GGUF writer, outside the product workspace).
set -euo pipefail
cd "$(dirname "$0")"
SEED=${SEED:-5113}
TORCH=${TORCH_PY:-${ORACLE_VENV:-$(realpath -m ../../../venv-oracle)}/bin/python}
MLX=${MLX_PY:-${MLX_VENV:-$(realpath -m ../../../venv-mlx)}/bin/python}
WORK=../../target/oracle-work
export NO_TORCH_COMPILE=1
"$TORCH" gen_tools_torch.py base "$SEED"
"$MLX" gen_tools_mlx.py write "$SEED"
(cd ../../benches/candle-gguf && cargo build --release --quiet)
mkdir -p ../../fixtures/tools/candle_q8_0
../../benches/candle-gguf/target/release/candle-gguf-fixture "$WORK/seed$SEED/candle_bf16.safetensors" \
    ../../fixtures/tools/candle_q8_0/model.q8.gguf "$WORK/candle_q8_0.dequant.safetensors"
"$TORCH" gen_tools_torch.py trace ../../fixtures/tools/candle_q8_0 "$WORK/candle_q8_0.dequant.safetensors"
"$TORCH" gen_tools_torch.py trace ../../fixtures/tools/ggufpy_q4_0 "$WORK/ggufpy_q4_0.dequant.safetensors"
"$TORCH" gen_tools_torch.py sample ../../fixtures/tools/candle_q8_0 "$WORK/candle_q8_0.dequant.safetensors"
"$TORCH" gen_tools_torch.py sample ../../fixtures/tools/ggufpy_q4_0 "$WORK/ggufpy_q4_0.dequant.safetensors"
