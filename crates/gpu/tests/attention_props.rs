//! The LM's split-K attention ([`gpu::GpuAttention`]: KV store, one workgroup per key chunk and
//! head, merge) against an f64 attention written here, at Moshi's shapes (32 heads × 128, a ring
//! of 3000 wrapped, positions 0, 1, around the chunk boundaries) and at odd ones (16 heads × 64 in
//! the Depformer's fixed-slot mode, 2 heads × 16, 1–3 keys, chunks of 1 to 64 keys, several rows
//! active), with f32 and bf16 rings; and the whole LM with the merge running (short chunks) and
//! with bf16 KV against the oracle fixture.

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use gpu::{AttentionRow, AttentionShape, GpuAttention, GpuContext, GpuLm, GpuLmOptions};
use kernels::Pool;
use model::lm::{CpuLm, Generator, KvDtype, LmBackend, LmFrame, LmModel, LmRecorder};
use model::sampling::{Sampler, SamplerConfig};
use testkit::compare::max_abs_diff;
use testkit::TensorFile;

/// Largest difference allowed between the device (f32 arithmetic) and the f64 reference on the
/// same ring contents: outputs are convex combinations of values in [-1, 1], so this is ~100×
/// the f32 rounding of a 3000-term softmax-weighted sum.
const KERNEL_BOUND: f32 = 2e-5;

/// bf16 rounding as the CPU's `KvDtype::Bf16` ring does it.
fn bf16_round(x: &[f32]) -> Vec<f32> {
    let mut h = vec![0u16; x.len()];
    kernels::attention::to_bf16_reference(x, &mut h);
    h.iter()
        .map(|&b| f32::from_bits(u32::from(b) << 16))
        .collect()
}

/// One ring as the test holds it: `context × d` keys and values.
struct Ring {
    k: Vec<f32>,
    v: Vec<f32>,
}

/// The f64 attention of query `q` (`heads × hd`) over the `count` entries of `ring` ending at
/// slot `newest` (oldest first, wrapping at `ctx`).
fn reference(
    q: &[f32],
    ring: &Ring,
    heads: usize,
    hd: usize,
    ctx: usize,
    newest: usize,
    count: usize,
) -> Vec<f32> {
    let d = heads * hd;
    let first = (newest + ctx + 1 - count) % ctx;
    let mut out = vec![0f32; d];
    for h in 0..heads {
        let cols = |s: usize| s * d + h * hd..s * d + (h + 1) * hd;
        let slots = (0..count).map(|e| (first + e) % ctx);
        let keys: Vec<&[f32]> = slots.clone().map(|s| &ring.k[cols(s)]).collect();
        let values: Vec<&[f32]> = slots.map(|s| &ring.v[cols(s)]).collect();
        let head = testkit::naive_attention(&q[h * hd..(h + 1) * hd], &keys, &values);
        for (o, x) in out[h * hd..(h + 1) * hd].iter_mut().zip(head) {
            *o = x as f32;
        }
    }
    out
}

/// A kernel under test with its rings mirrored on the host (rounded as the device stores them).
struct Case {
    att: GpuAttention,
    shape: AttentionShape,
    rings: Vec<Ring>,
    seed: u64,
}

impl Case {
    /// Random rings (values in [-1, 1]) for every session of `shape`.
    fn new(ctx: &GpuContext, shape: AttentionShape, seed: u64) -> Case {
        let att = GpuAttention::new(ctx, shape).unwrap();
        let n = shape.context * shape.heads * shape.head_dim;
        let rings = (0..shape.sessions)
            .map(|s| {
                let k = common::values(seed + 2 * s as u64, n);
                let v = common::values(seed + 2 * s as u64 + 1, n);
                att.fill(s, &k, &v).unwrap();
                Ring {
                    k: self::stored(shape, &k),
                    v: self::stored(shape, &v),
                }
            })
            .collect();
        Case {
            att,
            shape,
            rings,
            seed: seed + 1000,
        }
    }

    /// One step of `rows` (fresh q, k, v per row; q scaled by `q_scale` to sharpen the softmax):
    /// the device's output and the f64 reference's, after the host rings took the new entries.
    fn step(&mut self, rows: &[AttentionRow], q_scale: f32) -> (Vec<f32>, Vec<f32>) {
        let s = self.shape;
        let d = s.heads * s.head_dim;
        self.seed += 1;
        let mut qkv = common::values(self.seed, rows.len() * 3 * d);
        for row in qkv.chunks_exact_mut(3 * d) {
            row[..d].iter_mut().for_each(|x| *x *= q_scale);
        }
        let mut out = vec![0f32; rows.len() * d];
        self.att.step(rows, &qkv, &mut out).unwrap();
        let mut want = Vec::with_capacity(out.len());
        for (i, r) in rows.iter().enumerate() {
            let row = &qkv[i * 3 * d..(i + 1) * 3 * d];
            let slot = s.fixed_slot.unwrap_or(r.slot);
            let count = s.fixed_slot.map_or(r.count, |k| k + 1);
            let ring = &mut self.rings[r.session];
            ring.k[slot * d..(slot + 1) * d].copy_from_slice(&stored(s, &row[d..2 * d]));
            ring.v[slot * d..(slot + 1) * d].copy_from_slice(&stored(s, &row[2 * d..]));
            want.extend(reference(
                &row[..d],
                ring,
                s.heads,
                s.head_dim,
                s.context,
                slot,
                count,
            ));
        }
        assert!(out.iter().all(|x| x.is_finite()), "non-finite output");
        (out, want)
    }

    /// [`Case::step`], asserting the device within [`KERNEL_BOUND`] of the reference.
    fn check(&mut self, rows: &[AttentionRow], what: &str) -> f32 {
        let (got, want) = self.step(rows, 4.0);
        let diff = max_abs_diff(&got, &want);
        eprintln!("{what}: max |gpu - f64| {diff:e}");
        assert!(diff < KERNEL_BOUND, "{what}: {diff} from the f64 reference");
        diff
    }
}

/// The values as a ring of `shape`'s type holds them.
fn stored(shape: AttentionShape, x: &[f32]) -> Vec<f32> {
    match shape.kv_dtype {
        KvDtype::F32 => x.to_vec(),
        KvDtype::Bf16 => bf16_round(x),
    }
}

fn row(session: usize, slot: usize, count: usize) -> AttentionRow {
    AttentionRow {
        session,
        slot,
        count,
    }
}

/// Moshi's temporal attention (32 heads × 128, a ring of 3000, chunks of 64): positions 0 and 1,
/// either side of the first chunk boundaries, the full ring wrapped at an arbitrary slot, and
/// two rows of different lengths in one step; f32 and bf16 rings.
#[test]
fn moshi_temporal_shape_matches_f64_reference() {
    let Some(ctx) = common::context() else { return };
    for kv_dtype in [KvDtype::F32, KvDtype::Bf16] {
        let shape = AttentionShape {
            heads: 32,
            head_dim: 128,
            context: 3000,
            sessions: 2,
            kv_dtype,
            chunk: 64,
            fixed_slot: None,
        };
        let mut c = Case::new(&ctx, shape, 11);
        assert_eq!((c.att.chunks(), c.att.dispatches()), (47, 2));
        for count in [1, 2, 63, 64, 65, 128, 129, 2999] {
            c.check(
                &[row(0, count - 1, count)],
                &format!("{kv_dtype:?} position {}", count - 1),
            );
        }
        // Full rings: the newest entry at slot 1234 (the oldest at 1235, wrapped), and at the
        // ring's last slot (no wrap).
        c.check(&[row(1, 1234, 3000)], &format!("{kv_dtype:?} 3000 wrapped"));
        c.check(
            &[row(1, 2999, 3000)],
            &format!("{kv_dtype:?} 3000 unwrapped"),
        );
        c.check(
            &[row(1, 17, 3000), row(0, 64, 65)],
            &format!("{kv_dtype:?} two rows"),
        );
    }
}

/// Odd shapes: the Depformer's 16 heads × 64 in fixed-slot mode (slot k attends to 0..=k),
/// 2 heads × 16 over rings of 1 to 3 entries, chunk lengths that do and do not divide the ring,
/// up to 8 rows in one step, both ring types.
#[test]
fn odd_shapes_match_f64_reference() {
    let Some(ctx) = common::context() else { return };
    for kv_dtype in [KvDtype::F32, KvDtype::Bf16] {
        for chunk in [64, 3] {
            let shape = AttentionShape {
                heads: 16,
                head_dim: 64,
                context: 8,
                sessions: 8,
                kv_dtype,
                chunk,
                fixed_slot: None,
            };
            for k in 0..8 {
                let mut c = Case::new(
                    &ctx,
                    AttentionShape {
                        fixed_slot: Some(k),
                        ..shape
                    },
                    20 + k as u64,
                );
                let rows: Vec<_> = (0..8).map(|b| row(7 - b, 0, 1)).collect();
                c.check(
                    &rows,
                    &format!("{kv_dtype:?} depformer k={k} chunk {chunk}"),
                );
            }
        }
        for context in 1..=3 {
            for chunk in [1, 2, 64] {
                let shape = AttentionShape {
                    heads: 2,
                    head_dim: 16,
                    context,
                    sessions: 3,
                    kv_dtype,
                    chunk,
                    fixed_slot: None,
                };
                let mut c = Case::new(&ctx, shape, 40 + context as u64);
                for pos in 0..2 * context + 1 {
                    let rows: Vec<_> = (0..3)
                        .map(|s| {
                            let p = pos + s;
                            row(s, p % context, (p + 1).min(context))
                        })
                        .collect();
                    c.check(
                        &rows,
                        &format!("{kv_dtype:?} 2x16 ctx {context} chunk {chunk} pos {pos}"),
                    );
                }
            }
        }
        // Chunks of 5 over a ring of 23 (a short last chunk), every wrap position.
        let shape = AttentionShape {
            heads: 3,
            head_dim: 32,
            context: 23,
            sessions: 1,
            kv_dtype,
            chunk: 5,
            fixed_slot: None,
        };
        let mut c = Case::new(&ctx, shape, 60);
        for newest in 0..23 {
            c.check(
                &[row(0, newest, 23)],
                &format!("{kv_dtype:?} 3x32 wrap at {newest}"),
            );
        }
    }
}

/// A row's output does not depend on the other rows of its step (bit for bit): the same rings
/// and queries stepped alone and with other rows.
#[test]
fn rows_are_independent_bitwise() {
    let Some(ctx) = common::context() else { return };
    let shape = AttentionShape {
        heads: 4,
        head_dim: 32,
        context: 200,
        sessions: 3,
        kv_dtype: KvDtype::F32,
        chunk: 16,
        fixed_slot: None,
    };
    let d = shape.heads * shape.head_dim;
    let mk = || {
        let a = GpuAttention::new(&ctx, shape).unwrap();
        for s in 0..3 {
            let n = shape.context * d;
            a.fill(
                s,
                &common::values(70 + s as u64, n),
                &common::values(80 + s as u64, n),
            )
            .unwrap();
        }
        a
    };
    let (mut alone, mut batch) = (mk(), mk());
    let qkv: Vec<f32> = common::values(90, 3 * 3 * d);
    let rows = [row(2, 150, 151), row(0, 9, 200), row(1, 199, 200)];
    let mut all = vec![0f32; 3 * d];
    batch.step(&rows, &qkv, &mut all).unwrap();
    for (i, r) in rows.iter().enumerate() {
        let mut one = vec![0f32; d];
        alone
            .step(&[*r], &qkv[i * 3 * d..(i + 1) * 3 * d], &mut one)
            .unwrap();
        assert_eq!(one, all[i * d..(i + 1) * d], "row {i}");
    }
}

/// Bad shapes and rows are typed errors, never a panic or a dispatch.
#[test]
fn bad_shapes_and_rows_are_refused() {
    let Some(ctx) = common::context() else { return };
    let shape = AttentionShape {
        heads: 2,
        head_dim: 16,
        context: 4,
        sessions: 1,
        kv_dtype: KvDtype::F32,
        chunk: 64,
        fixed_slot: None,
    };
    for bad in [
        AttentionShape { chunk: 0, ..shape },
        AttentionShape { chunk: 65, ..shape },
        AttentionShape {
            head_dim: 15,
            ..shape
        },
        AttentionShape {
            head_dim: 258,
            ..shape
        },
        AttentionShape {
            sessions: 0,
            ..shape
        },
        AttentionShape {
            fixed_slot: Some(4),
            ..shape
        },
    ] {
        assert!(GpuAttention::new(&ctx, bad).is_err(), "{bad:?}");
    }
    let mut a = GpuAttention::new(&ctx, shape).unwrap();
    let d = 32;
    let qkv = vec![0f32; 3 * d];
    let mut out = vec![0f32; d];
    for r in [row(1, 0, 1), row(0, 4, 1), row(0, 0, 0), row(0, 0, 5)] {
        assert!(a.step(&[r], &qkv, &mut out).is_err(), "{r:?}");
    }
    assert!(a.step(&[row(0, 0, 1)], &qkv[1..], &mut out).is_err());
}

// The whole LM.

fn fixtures() -> PathBuf {
    testkit::fixtures_dir("")
}

fn load(dir: &str) -> LmModel {
    model::MoshiModel::open(&fixtures().join(dir)).unwrap().lm
}

/// `steps` greedy calls of one session on the fixture's user codes, every tensor recorded.
fn run(backend: Box<dyn LmBackend>, steps: usize) -> LmRecorder {
    run_gen(&mut Generator::new(backend).unwrap(), steps)
}

/// [`run`] through a generator the caller keeps.
fn run_gen<B: LmBackend + ?Sized>(gen: &mut Generator<B>, steps: usize) -> LmRecorder {
    let (codes, shape) = TensorFile::open(fixtures().join("lm/CODES.safetensors")).i64("codes");
    let t_total = shape[1];
    let spec = gen.backend().spec().clone();
    let mut samplers = [Sampler::new(SamplerConfig::greedy(), spec.text_card, spec.card).unwrap()];
    let mut rec = LmRecorder::default();
    for t in 0..steps {
        let user: Vec<u32> = (0..8)
            .map(|k| codes[k * t_total + t % t_total] as u32)
            .collect();
        let mut o: [Result<Option<LmFrame>, model::lm::LmError>; 1] = [Ok(None)];
        gen.step(&[0], &user, &mut samplers, None, &mut o, &mut rec)
            .unwrap();
        let [o] = o;
        if let Some(f) = o.unwrap() {
            rec.record_frame(&f);
        }
    }
    rec
}

fn gpu_lm(ctx: &GpuContext, m: &LmModel, opts: GpuLmOptions) -> Box<dyn LmBackend> {
    let w = gpu::GpuLmWeights::upload(ctx, m).unwrap();
    Box::new(GpuLm::with_options(w, 1, opts).unwrap())
}

/// The oracle's tokens (frame-major audio) and its three float tensors.
struct Oracle {
    steps: usize,
    text: Vec<i64>,
    audio: Vec<i64>,
    trace: TensorFile,
}

fn oracle() -> Oracle {
    let trace = TensorFile::open(fixtures().join("lm/trace.safetensors"));
    let (_, shape) = trace.i64("input_tokens");
    let (text, audio) = common::oracle_tokens(&trace);
    Oracle {
        steps: shape[0],
        text,
        audio,
        trace,
    }
}

/// Max |a − b| of the three recorded float tensors of `rec` against the oracle trace's.
fn oracle_diffs(rec: &LmRecorder, o: &Oracle) -> [(&'static str, f32); 3] {
    let d = |name: &'static str, got: &[f32]| {
        assert!(got.iter().all(|x| x.is_finite()), "{name}: non-finite");
        (name, max_abs_diff(got, &o.trace.f32(name).0))
    };
    [
        d("transformer_out", &rec.transformer_out),
        d("text_logits", &rec.text_logits),
        d("depformer_logits", &rec.depformer_logits),
    ]
}

/// The fixture LM (temporal ring of 10, Depformer ring of 8) with chunks of 1, 3 and 4 keys, so
/// every attention of both stacks runs the split-K pass and the merge: the oracle's tokens, and
/// its floats within 1e-4 (the bound of `lm_parity.rs`).
#[test]
fn lm_with_the_merge_running_matches_the_oracle() {
    let Some(ctx) = common::context() else { return };
    kernels::set_f32_activations(true);
    let o = oracle();
    let m = load("lm");
    for chunk in [1, 3, 4] {
        let opts = GpuLmOptions {
            attention_chunk: chunk,
            ..Default::default()
        };
        let rec = run(gpu_lm(&ctx, &m, opts), o.steps);
        assert_eq!(rec.out_text, o.text, "chunk {chunk}: text tokens");
        assert_eq!(rec.out_audio, o.audio, "chunk {chunk}: audio tokens");
        for (name, diff) in oracle_diffs(&rec, &o) {
            eprintln!("chunk {chunk} {name}: max |gpu - oracle| {diff:e}");
            assert!(diff < 1e-4, "chunk {chunk} {name}: {diff}");
        }
    }
}

/// A backend that runs every call on `main` and, with the same inputs, on `shadow`, returning
/// `main`'s results (so the generator follows `main`) and keeping `shadow`'s: the teacher-forced
/// error of `shadow`.
struct Shadow {
    main: Box<dyn LmBackend>,
    shadow: Box<dyn LmBackend>,
    transformer_out: Vec<f32>,
    text_logits: Vec<f32>,
    depformer_logits: Vec<f32>,
}

impl LmBackend for Shadow {
    fn spec(&self) -> &model::lm::LmSpec {
        self.main.spec()
    }
    fn batch_size(&self) -> usize {
        self.main.batch_size()
    }
    fn temporal_step(&mut self, rows: &[usize], tokens: &[u32]) -> Result<(), model::lm::LmError> {
        self.shadow.temporal_step(rows, tokens)?;
        self.transformer_out
            .extend_from_slice(self.shadow.transformer_out());
        self.text_logits
            .extend_from_slice(self.shadow.text_logits());
        self.main.temporal_step(rows, tokens)
    }
    fn text_logits(&self) -> &[f32] {
        self.main.text_logits()
    }
    fn transformer_out(&self) -> &[f32] {
        self.main.transformer_out()
    }
    fn depformer_step(
        &mut self,
        rows: &[usize],
        k: usize,
        prev_tokens: &[u32],
    ) -> Result<&[f32], model::lm::LmError> {
        let l = self.shadow.depformer_step(rows, k, prev_tokens)?;
        self.depformer_logits.extend_from_slice(l);
        self.main.depformer_step(rows, k, prev_tokens)
    }
    fn reset_row(&mut self, b: usize) {
        self.main.reset_row(b);
        self.shadow.reset_row(b);
    }
    fn seek_for_bench(&mut self, offset: usize) {
        self.main.seek_for_bench(offset);
        self.shadow.seek_for_bench(offset);
    }
}

/// Stated error of the device's bf16 KV ring against the f32 oracle on the fixture LM,
/// teacher-forced (every step given the oracle's inputs): the largest |bf16 − oracle| over the
/// fixture's 32 steps of transformer outputs, text logits and Depformer logits. Measured on
/// lavapipe: 0.067 on the text logits (values up to ±40: 0.2 % of their range), 0.058 on the
/// Depformer logits, 0.0096 on the transformer outputs; bounded here at 0.1. Free-running, the tiny random fixture's greedy tokens leave the oracle's at the first
/// text token (its step-0 text logits move by 0.047 and two of them are closer than that), and
/// the CPU's bf16 ring leaves at the same token: the tokens of the two bf16 runs are equal.
const BF16_KV_ORACLE_BOUND: f32 = 0.1;

/// bf16 KV on the device, teacher-forced along the f32 device run (which gives the oracle's
/// tokens): within [`BF16_KV_ORACLE_BOUND`] of the oracle's floats; free-running: the CPU bf16
/// ring's tokens, and its floats within 2e-2 (a measured bound: see the comment at the check). For the merge path (chunk 3) and the
/// one-chunk path.
#[test]
fn bf16_kv_within_its_bound_of_the_oracle_and_matches_the_cpu_bf16_ring() {
    let Some(ctx) = common::context() else { return };
    kernels::set_f32_activations(true);
    let o = oracle();
    let m = load("lm");
    let cpu = run(
        Box::new(
            CpuLm::new(
                Arc::new(load("lm")),
                1,
                KvDtype::Bf16,
                Arc::new(Pool::new(1)),
            )
            .unwrap(),
        ),
        o.steps,
    );
    for chunk in [64, 3] {
        let opts = GpuLmOptions {
            kv_dtype: KvDtype::Bf16,
            attention_chunk: chunk,
        };
        let mut gen = Generator::new(Box::new(Shadow {
            main: gpu_lm(&ctx, &m, GpuLmOptions::default()),
            shadow: gpu_lm(&ctx, &m, opts),
            transformer_out: Vec::new(),
            text_logits: Vec::new(),
            depformer_logits: Vec::new(),
        }))
        .unwrap();
        let main = run_gen(&mut gen, o.steps);
        let shadow = gen.backend();
        assert_eq!(main.out_text, o.text, "f32 chunk {chunk}: text tokens");
        assert_eq!(main.out_audio, o.audio, "f32 chunk {chunk}: audio tokens");
        let forced = LmRecorder {
            transformer_out: shadow.transformer_out.clone(),
            text_logits: shadow.text_logits.clone(),
            depformer_logits: shadow.depformer_logits.clone(),
            ..Default::default()
        };
        for (name, diff) in oracle_diffs(&forced, &o) {
            eprintln!(
                "bf16 KV chunk {chunk} {name}: max |gpu - f32 oracle| {diff:e}, teacher-forced"
            );
            assert!(
                diff < BF16_KV_ORACLE_BOUND,
                "bf16 chunk {chunk} {name}: {diff}"
            );
        }

        let free = run(gpu_lm(&ctx, &m, opts), o.steps);
        assert_eq!(
            (&free.out_text, &free.out_audio),
            (&cpu.out_text, &cpu.out_audio),
            "bf16 chunk {chunk}: tokens vs the CPU's bf16 ring"
        );
        eprintln!(
            "bf16 KV chunk {chunk}: free-running text tokens equal to the oracle's: {}",
            free.out_text == o.text
        );
        for (name, a, b) in [
            (
                "transformer_out",
                &free.transformer_out,
                &cpu.transformer_out,
            ),
            ("text_logits", &free.text_logits, &cpu.text_logits),
            (
                "depformer_logits",
                &free.depformer_logits,
                &cpu.depformer_logits,
            ),
        ] {
            let diff = max_abs_diff(a, b);
            eprintln!("bf16 KV chunk {chunk} {name}: max |gpu - cpu bf16| {diff:e}");
            // The device's f32 K/V are not the CPU's bits before their bf16 rounding (the matvec
            // sums in another order, and the order depends on the adapter's subgroup size), so a
            // K/V value's rounding can fall the other way (one bf16 ulp, 2^-8 relative) and that
            // carries through the layers. Measured on the text logits: 6.4e-4 on lavapipe
            // (subgroups of 8, chunk 3), 4.2e-3 on an NVIDIA H200 (subgroups of 32, chunk 64).
            // Bounded at 2e-2, a measured bound (not derived), still well under the 0.067 that
            // bf16 KV itself moves the logits from f32; a store that truncates instead of rounding
            // is caught by the kernel tests above, which compare with the CPU's rounding exactly.
            assert!(
                diff < 2e-2,
                "bf16 chunk {chunk} {name}: {diff} from the CPU"
            );
        }
    }
}
