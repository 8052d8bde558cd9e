#!/usr/bin/env bash
# Prepares benches/baselines/patched/moshi-0.6.4: an unmodified copy of Kyutai's `moshi` 0.6.4 from the
# cargo registry, plus three small `impl` blocks appended at the end of three of its modules. They give
# the baseline write access to candle's KV caches, which the crate keeps private:
#   transformer.rs            StreamingTransformer::bench_set_kv_caches / bench_kv_len
#   lm.rs                     LmModel::bench_temporal_mut  (the temporal transformer)
#   lm_generate_multistream.rs State::bench_model_mut
# No line of Kyutai's code is changed. Cargo.toml's [patch.crates-io] points `moshi` at the copy, so run
# this once before `cargo build --release` (it is idempotent; ./build.sh runs it for you). The copy is
# ignored by git (it is the registry's code, regenerated on each machine).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
ver=0.6.4
dst="$here/patched/moshi-$ver"
stamp="$dst/.moshi-native-bench-hooks"
if [[ -f "$stamp" ]]; then exit 0; fi
reg="${CARGO_HOME:-$HOME/.cargo}/registry/src"
src="$(ls -d "$reg"/*/moshi-$ver 2>/dev/null | head -n1 || true)"
if [[ -z "$src" ]]; then
  # Not downloaded yet: let cargo fetch it through a throwaway manifest (no [patch] there).
  tmp="$(mktemp -d)"
  mkdir -p "$tmp/src"
  printf '[package]\nname = "fetch-moshi"\nversion = "0.0.0"\nedition = "2021"\n[dependencies]\nmoshi = "=%s"\n[workspace]\n' "$ver" >"$tmp/Cargo.toml"
  echo 'fn main() {}' >"$tmp/src/main.rs"
  cargo fetch --manifest-path "$tmp/Cargo.toml"
  rm -rf "$tmp"
  src="$(ls -d "$reg"/*/moshi-$ver | head -n1)"
fi
rm -rf "$dst"
mkdir -p "$here/patched"
cp -R "$src" "$dst"
chmod -R u+w "$dst"

cat >>"$dst/src/transformer.rs" <<'RS'

// ---- appended by moshi-native benches/baselines/patch-moshi.sh (benchmark hooks, not Kyutai's code) ----
impl StreamingTransformer {
    /// Benchmarks: replace the self-attention KV cache of every layer by `make(layer_index)` and
    /// forget the reset positions (a fresh stream whose caches already hold entries).
    pub fn bench_set_kv_caches(
        &mut self,
        mut make: impl FnMut(usize) -> candle::Result<KvCache>,
    ) -> candle::Result<()> {
        self.last_reset_pos.clear();
        for (i, layer) in self.layers.iter_mut().enumerate() {
            layer.set_kv_cache(make(i)?);
        }
        Ok(())
    }

    /// Benchmarks: number of entries appended to the KV caches so far (the next RoPE position).
    pub fn bench_kv_len(&self) -> usize {
        self.current_seq_len()
    }

    /// Benchmarks: (layers, heads, context) of the self-attention.
    pub fn bench_dims(&self) -> (usize, usize, usize) {
        (self.layers.len(), self.num_heads, self.context)
    }
}
RS

cat >>"$dst/src/lm.rs" <<'RS'

// ---- appended by moshi-native benches/baselines/patch-moshi.sh (benchmark hooks, not Kyutai's code) ----
impl LmModel {
    /// Benchmarks: the temporal transformer (`None` for the batched variant).
    pub fn bench_temporal_mut(&mut self) -> Option<&mut transformer::StreamingTransformer> {
        match &mut self.transformer {
            StreamingTransformer::Normal(t) => Some(t),
            StreamingTransformer::Batched(_) => None,
        }
    }
}
RS

cat >>"$dst/src/lm_generate_multistream.rs" <<'RS'

// ---- appended by moshi-native benches/baselines/patch-moshi.sh (benchmark hooks, not Kyutai's code) ----
impl State {
    /// Benchmarks: the model being stepped.
    pub fn bench_model_mut(&mut self) -> &mut crate::lm::LmModel {
        &mut self.model
    }
}
RS
date -u >"$stamp"
echo "patch-moshi.sh: $dst ready (from $src)"
