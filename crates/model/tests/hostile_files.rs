//! Hostile model files end to end: files written to a temporary folder and opened through
//! `Weights::open` / `Bundle::open` (safetensors and GGUF). Every case must be a typed
//! `CheckpointError`, and the peak heap growth while opening must stay small — a claimed size is
//! never used to allocate. NaN/Inf weights: loading succeeds (no full scan of the weights at load;
//! a 7B checkpoint would have to be read entirely), but the first LM step that meets a non-finite
//! logit fails with `SamplingError::NonFiniteLogits` instead of sampling a token from garbage.
//!
//! A counting global allocator tracks live and peak heap bytes (all threads); tests that measure
//! take `SERIAL` so they do not see each other's allocations.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use kernels::Pool;
use model::checkpoint::gguf::{self, WriteTensor};
use model::checkpoint::LmConfig;
use model::checkpoint::Weights;
use model::checkpoint::{safetensors, Bundle, CheckpointError, Component, Malformed};
use model::lm::{KvDtype, LmError, LmGen, LmModel};
use model::sampling::{Sampler, SamplerConfig, SamplingError};
use testkit::peak_growth_during as peak_during;
use testkit::{lm_bundle_copy, poke_f32, ScratchDir};

#[global_allocator]
static GLOBAL: testkit::CountingAlloc = testkit::CountingAlloc;

static SERIAL: Mutex<()> = Mutex::new(());

/// Largest heap growth tolerated while opening a hostile file (the files are a few KiB; the
/// claims inside them are up to 2^60 elements / 10 GB).
const HEAP_BOUND: usize = 4 << 20;

/// A safetensors file from a raw JSON header and `data` bytes of zeros.
fn st_file(header: &str, data: usize) -> Vec<u8> {
    let mut v = (header.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(header.as_bytes());
    v.resize(v.len() + data, 0);
    v
}

/// Opens `bytes` written as `name` through `Weights::open` (LM) and returns the error and the
/// peak heap growth.
fn open_hostile(name: &str, bytes: &[u8]) -> (CheckpointError, usize) {
    let dir = ScratchDir::new("hostile-w");
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    let (r, peak) = peak_during(|| Weights::open(&p, Component::Lm).map(|_| ()));
    let e = r.expect_err("hostile file must be refused");
    (e, peak)
}

fn malformed(e: &CheckpointError) -> &Malformed {
    match e {
        CheckpointError::Malformed { kind, .. } => kind,
        other => panic!("expected a Malformed error, got {other:?}"),
    }
}

fn assert_bounded(case: &str, peak: usize) {
    eprintln!("{case}: peak heap growth {peak} B");
    assert!(
        peak < HEAP_BOUND,
        "{case}: peak heap growth {peak} B exceeds {HEAP_BOUND} B"
    );
}

// ---------------------------------------------------------------- safetensors

/// (description, file bytes, accepted error kinds)
type Case = (&'static str, Vec<u8>, fn(&Malformed) -> bool);

/// Opens every case's bytes written as `name`: each is refused with an accepted kind of
/// [`Malformed`], within [`HEAP_BOUND`].
fn refused_as_expected(name: &str, cases: Vec<Case>) {
    for (case, bytes, ok) in cases {
        let (e, peak) = open_hostile(name, &bytes);
        eprintln!("{case}: {e}");
        let m = malformed(&e);
        assert!(ok(m), "{case}: unexpected error {m:?}");
        assert_bounded(case, peak);
    }
}

/// A safetensors file of one F32 tensor of 2^30 x 2^30 = 2^60 elements whose data is claimed at
/// `0..end`, followed by 16 bytes of data.
fn st_huge_tensor(end: u64) -> Vec<u8> {
    let huge = 1u64 << 30;
    st_file(
        &format!(
            r#"{{"text_linear.weight":{{"dtype":"F32","shape":[{huge},{huge}],"data_offsets":[0,{end}]}}}}"#
        ),
        16,
    )
}

#[test]
fn safetensors_hostile_headers_are_typed_and_bounded() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // The meter works: a 1 MiB allocation shows up as about 1 MiB of peak growth. Not exactly:
    // the meter counts all threads, and the previous test's thread and the harness may still be
    // freeing (thread-locals, captured output) after that test released `SERIAL`, so the growth
    // can read a few bytes short of 1 MiB (seen under qemu: 1 MiB - 58 B). A broken meter reads 0.
    let ((), probe) = peak_during(|| drop(std::hint::black_box(vec![1u8; 1 << 20])));
    assert!(probe >= 1 << 19, "allocator meter broken: {probe}");
    let cases: Vec<Case> = vec![
        ("2^60 elements, 16 bytes of data", st_huge_tensor(16), |m| {
            matches!(
                m,
                Malformed::DimsOverflow { .. } | Malformed::ByteSizeMismatch { .. }
            )
        }),
        (
            "2^60 elements claiming 2^62 bytes",
            st_huge_tensor(1 << 62),
            |m| {
                matches!(
                    m,
                    Malformed::DimsOverflow { .. } | Malformed::OffsetOutOfRange { .. }
                )
            },
        ),
        (
            "u64::MAX dims",
            st_file(
                &format!(
                    r#"{{"a.weight":{{"dtype":"BF16","shape":[{},{}],"data_offsets":[0,4]}}}}"#,
                    u64::MAX,
                    u64::MAX
                ),
                4,
            ),
            |m| matches!(m, Malformed::DimsOverflow { .. }),
        ),
        (
            "overlapping offsets",
            st_file(
                r#"{"emb.0.weight":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"emb.1.weight":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}}"#,
                24,
            ),
            |m| matches!(m, Malformed::Overlapping { .. }),
        ),
        (
            "identical offsets (aliasing)",
            st_file(
                r#"{"emb.0.weight":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"emb.1.weight":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#,
                16,
            ),
            |m| matches!(m, Malformed::Overlapping { .. }),
        ),
        (
            "tensor past end of data",
            st_file(
                r#"{"emb.0.weight":{"dtype":"F32","shape":[1024],"data_offsets":[0,4096]}}"#,
                64,
            ),
            |m| matches!(m, Malformed::OffsetOutOfRange { .. }),
        ),
        (
            "duplicate tensor name",
            st_file(
                r#"{"emb.0.weight":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"emb.0.weight":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#,
                8,
            ),
            |m| matches!(m, Malformed::DuplicateName(_)),
        ),
    ];
    refused_as_expected("model.safetensors", cases);

    // Header length past EOF, and a 10 GB header claim, in a small file.
    for (case, claim) in [
        ("header length past EOF", 200u64),
        ("10 GB header claim", 10_000_000_000u64),
        ("u64::MAX header claim", u64::MAX),
    ] {
        let mut bytes = claim.to_le_bytes().to_vec();
        bytes.extend_from_slice(br#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#);
        let (e, peak) = open_hostile("model.safetensors", &bytes);
        eprintln!("{case}: {e}");
        match malformed(&e) {
            Malformed::HeaderTooLarge { claimed, limit } => {
                assert_eq!(*claimed, claim, "{case}");
                assert!(*limit < bytes.len() as u64, "{case}");
            }
            other => panic!("{case}: unexpected error {other:?}"),
        }
        assert_bounded(case, peak);
    }
    // Truncated to nothing / to less than the length field.
    for n in [0usize, 1, 7] {
        let (e, peak) = open_hostile("model.safetensors", &vec![b'{'; n]);
        assert!(
            matches!(
                e,
                CheckpointError::Malformed {
                    kind: Malformed::Truncated { .. },
                    ..
                } | CheckpointError::UnknownFormat { .. }
            ),
            "{n} bytes: {e:?}"
        );
        assert_bounded("truncated", peak);
    }
}

/// A real 10 GB file (sparse: no disk blocks are written) whose header claims 10 GB: refused
/// without reading or allocating it.
#[test]
fn ten_gigabyte_sparse_file_with_ten_gigabyte_header_claim() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = ScratchDir::new("hostile-sparse");
    let p = dir.join("model.safetensors");
    let claim = 10u64 << 30;
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&p).unwrap();
        f.write_all(&claim.to_le_bytes()).unwrap();
        f.write_all(b"{").unwrap();
        if f.set_len(claim + 8).is_err() {
            eprintln!("skipping: the temp file system refuses a 10 GB sparse file");
            return;
        }
    }
    let (r, peak) = peak_during(|| Weights::open(&p, Component::Lm).map(|_| ()));
    drop(dir);
    if let Err(e) = &r {
        eprintln!("10 GB sparse file: {e}");
    }
    match r {
        Err(CheckpointError::Malformed {
            kind: Malformed::HeaderTooLarge { claimed, limit },
            ..
        }) => {
            assert_eq!(claimed, claim);
            assert_eq!(limit, safetensors::MAX_HEADER);
        }
        other => panic!("unexpected {:?}", other.map(|_| ())),
    }
    assert_bounded("10 GB sparse file", peak);
}

// ---------------------------------------------------------------- GGUF

/// GGUF v3 prefix: magic, version, tensor count, metadata count.
fn gguf_prefix(n_tensors: u64, n_kv: u64) -> Vec<u8> {
    let mut v = gguf::MAGIC.to_le_bytes().to_vec();
    v.extend_from_slice(&3u32.to_le_bytes());
    v.extend_from_slice(&n_tensors.to_le_bytes());
    v.extend_from_slice(&n_kv.to_le_bytes());
    v
}

fn gguf_tensor_info(v: &mut Vec<u8>, name: &str, dims_inner_first: &[u64], ty: u32, off: u64) {
    v.extend_from_slice(&(name.len() as u64).to_le_bytes());
    v.extend_from_slice(name.as_bytes());
    v.extend_from_slice(&(dims_inner_first.len() as u32).to_le_bytes());
    for d in dims_inner_first {
        v.extend_from_slice(&d.to_le_bytes());
    }
    v.extend_from_slice(&ty.to_le_bytes());
    v.extend_from_slice(&off.to_le_bytes());
}

fn pad_to(v: &mut Vec<u8>, align: usize, extra: usize) {
    while !v.len().is_multiple_of(align) {
        v.push(0);
    }
    v.resize(v.len() + extra, 0);
}

#[test]
fn gguf_hostile_headers_are_typed_and_bounded() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    const F32: u32 = 0;
    let mut cases: Vec<Case> = Vec::new();

    let mut b = gguf_prefix(1, 0);
    gguf_tensor_info(&mut b, "text_linear.weight", &[1 << 30, 1 << 30], F32, 0);
    pad_to(&mut b, 32, 64);
    cases.push(("2^60 elements", b, |m| {
        matches!(
            m,
            Malformed::DimsOverflow { .. } | Malformed::OffsetOutOfRange { .. }
        )
    }));

    let mut b = gguf_prefix(2, 0);
    gguf_tensor_info(&mut b, "emb.0.weight", &[16], F32, 0);
    gguf_tensor_info(&mut b, "emb.1.weight", &[16], F32, 32);
    pad_to(&mut b, 32, 128);
    cases.push(("overlapping offsets", b, |m| {
        matches!(m, Malformed::Overlapping { .. })
    }));

    let mut b = gguf_prefix(1, 0);
    gguf_tensor_info(&mut b, "emb.0.weight", &[1024], F32, 0);
    pad_to(&mut b, 32, 64);
    cases.push(("tensor past EOF", b, |m| {
        matches!(m, Malformed::OffsetOutOfRange { .. })
    }));

    // Counts and lengths that would allocate terabytes if trusted.
    cases.push(("2^60 tensors claimed", gguf_prefix(1 << 60, 0), |m| {
        matches!(m, Malformed::Truncated { .. })
    }));
    cases.push((
        "2^60 metadata entries claimed",
        gguf_prefix(0, 1 << 60),
        |m| matches!(m, Malformed::Truncated { .. }),
    ));
    let mut b = gguf_prefix(0, 1);
    b.extend_from_slice(&(10u64 << 30).to_le_bytes()); // a 10 GB key string
    b.extend_from_slice(b"general.name");
    cases.push(("10 GB key length", b, |m| {
        matches!(
            m,
            Malformed::Truncated { .. } | Malformed::HeaderTooLarge { .. }
        )
    }));
    let mut b = gguf_prefix(0, 1);
    let key = b"tokenizer.ggml.tokens";
    b.extend_from_slice(&(key.len() as u64).to_le_bytes());
    b.extend_from_slice(key);
    b.extend_from_slice(&9u32.to_le_bytes()); // ARRAY
    b.extend_from_slice(&8u32.to_le_bytes()); // of STRING
    b.extend_from_slice(&(1u64 << 60).to_le_bytes());
    b.extend_from_slice(&[0u8; 64]);
    cases.push(("2^60-element metadata array", b, |m| {
        matches!(
            m,
            Malformed::Truncated { .. } | Malformed::HeaderTooLarge { .. } | Malformed::Other(_)
        )
    }));

    refused_as_expected("model.q8.gguf", cases);

    // A well-formed GGUF still opens (the helpers above are not simply producing garbage).
    let data = [0u8; 64];
    let ok = gguf::write(&[WriteTensor {
        name: "emb.0.weight",
        ggml_type: F32,
        shape: &[4, 4],
        data: &data,
    }]);
    let dir = ScratchDir::new("hostile-gguf-ok");
    let p = dir.join("model.q8.gguf");
    std::fs::write(&p, ok).unwrap();
    let w = Weights::open(&p, Component::Lm).expect("valid GGUF opens");
    assert_eq!(w.shape("emb.0.weight"), Some(&[4usize, 4][..]));
}

// ---------------------------------------------------------------- whole bundles

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/lm")
}

#[test]
fn bundle_with_hostile_lm_file_is_refused_with_typed_error() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = lm_bundle_copy("hostile-bundle-hostile");
    std::fs::write(
        dir.join("model.safetensors"),
        st_file(
            r#"{"emb.0.weight":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"emb.1.weight":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}}"#,
            24,
        ),
    )
    .unwrap();
    let (r, peak) = peak_during(|| Bundle::open(&dir).and_then(|b| b.lm_weights().map(|_| ())));
    let e = r.expect_err("overlapping LM file must be refused");
    assert!(
        matches!(malformed(&e), Malformed::Overlapping { .. }),
        "{e:?}"
    );
    assert_bounded("bundle", peak);

    // Truncated LM file (half of the real one).
    let real = std::fs::read(fixture_dir().join("model.safetensors")).unwrap();
    std::fs::write(dir.join("model.safetensors"), &real[..real.len() / 2]).unwrap();
    let e = Bundle::open(&dir)
        .and_then(|b| b.lm_weights().map(|_| ()))
        .expect_err("truncated LM file must be refused");
    assert!(
        matches!(
            malformed(&e),
            Malformed::OffsetOutOfRange { .. } | Malformed::Truncated { .. }
        ),
        "{e:?}"
    );
}

/// Loads the LM of a bundle folder and steps it until it errs or `steps` calls have passed.
fn step_until_error(dir: &Path, steps: usize, greedy: bool) -> Result<usize, LmError> {
    let bundle = Bundle::open(dir).unwrap();
    let w = bundle.lm_weights().expect("NaN weights still load");
    let cfg: &LmConfig = &bundle.config.lm;
    let model = LmModel::load(&w, cfg).expect("NaN weights still load");
    let pool = Pool::new(1);
    let sc = if greedy {
        SamplerConfig::greedy()
    } else {
        SamplerConfig::seeded(7)
    };
    let mut sampler = Sampler::new(sc, cfg.text_card, cfg.card).unwrap();
    let mut gen = LmGen::new(&model, KvDtype::F32).unwrap();
    for i in 0..steps {
        gen.step(&model, &[(i % 64) as u32; 8], &mut sampler, &pool)?;
    }
    Ok(steps)
}

#[test]
fn non_finite_weights_load_but_never_reach_a_sampler_silently() {
    // Serialized with the heap-bound tests: its loads and frees would move their peak meter.
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // Control: the untouched copy steps fine in both modes.
    let dir = lm_bundle_copy("hostile-nan-control");
    assert_eq!(step_until_error(&dir, 6, true).unwrap(), 6);

    // (tensor, row width, value, stream)
    for (tensor, width, value, stream) in [
        ("text_linear.weight", 64, f32::NAN, "text"),
        ("text_linear.weight", 64, f32::INFINITY, "text"),
        ("linears.0.weight", 32, f32::NAN, "audio"),
        ("linears.3.weight", 32, f32::NEG_INFINITY, "audio"),
    ] {
        for greedy in [true, false] {
            let dir = lm_bundle_copy("hostile-nan");
            // Row 5 of the output projection: exactly one logit becomes non-finite.
            poke_f32(&dir.join("model.safetensors"), tensor, 5 * width, value);
            let r = step_until_error(&dir, 6, greedy);
            match r {
                Err(LmError::Sampling(e @ SamplingError::NonFiniteLogits { .. })) => {
                    eprintln!("{tensor} = {value} (greedy {greedy}): {e}");
                    let SamplingError::NonFiniteLogits {
                        stream: s, index, ..
                    } = e
                    else {
                        unreachable!()
                    };
                    assert_eq!(s, stream, "{tensor} = {value}");
                    assert_eq!(index, 5, "{tensor} = {value}");
                }
                other => panic!("{tensor} = {value} (greedy {greedy}): {other:?}"),
            }
        }
    }
}
