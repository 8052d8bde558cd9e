//! Tests against the oracle fixtures (`fixtures/`): every released layout maps completely onto the
//! canonical names, and the values agree with the canonical PyTorch file.

use std::path::{Path, PathBuf};

use super::*;
use crate::checkpoint::Schema;
use crate::checkpoint::{LmConfig, MimiConfig};
use crate::checkpoint::{OpenOptions, Quant, Weights};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

/// The fixture weights file at `rel` (below `fixtures/`).
fn open_fixture(rel: impl AsRef<Path>, component: Component) -> Weights {
    Weights::open(&fixtures().join(rel), component).unwrap()
}

fn tiny_lm_config() -> LmConfig {
    let text = std::fs::read_to_string(fixtures().join("lm/config.json")).unwrap();
    LmConfig::from_json(&text).unwrap()
}

fn tiny_mimi_config() -> MimiConfig {
    let text = std::fs::read_to_string(fixtures().join("mimi/mimi_config.json")).unwrap();
    MimiConfig::from_json(&text).unwrap()
}

fn round_bf16(x: f32) -> f32 {
    half::bf16::from_f32(x).to_f32()
}

/// Compare every canonical tensor of `w` with the reference, with a per-row tolerance `rel * max|row|`.
fn assert_close(reference: &Weights, w: &Weights, rel: f32, bf16_ref: bool) {
    let names: Vec<&str> = reference.names().collect();
    assert_eq!(names, w.names().collect::<Vec<_>>());
    for n in names {
        let (a, sa) = reference.f32(n).unwrap();
        let (b, sb) = w.f32(n).unwrap();
        assert_eq!(sa, sb, "{n}");
        let cols: usize = sa.iter().skip(1).product::<usize>().max(1);
        for (r, (ra, rb)) in a.chunks(cols).zip(b.chunks(cols)).enumerate() {
            let amax = ra.iter().fold(0f32, |m, x| m.max(x.abs()));
            for (x, y) in ra.iter().zip(rb) {
                let x = if bf16_ref { round_bf16(*x) } else { *x };
                assert!(
                    (x - y).abs() <= rel * amax + 1e-30,
                    "{n} row {r}: {x} vs {y} (amax {amax})"
                );
            }
        }
    }
}

#[test]
fn tiny_bundle_opens_and_matches_schema() {
    let b = Bundle::open(&fixtures().join("lm")).unwrap();
    assert_eq!(b.config.lm, tiny_lm_config());
    assert_eq!(b.mimi_config, tiny_mimi_config());
    assert_eq!(b.config.lm.ffn_hidden(), 128);
    assert_eq!(b.config.lm.depformer_ffn_hidden(), 64);
    let lm = b.lm_weights().unwrap();
    assert_eq!(lm.layout(), names::Layout::PytorchLegacy);
    assert_eq!(lm.len(), b.lm_schema().tensors.len());
    let mimi = b.mimi_weights().unwrap();
    assert_eq!(mimi.len(), b.mimi_schema().tensors.len());
    // Every canonical tensor converts to a matrix of the flattened shape.
    for n in lm
        .names()
        .chain(mimi.names().filter(|n| !n.ends_with("_initialized")))
    {
        let w = if lm.contains(n) { &lm } else { &mimi };
        let shape = w.shape(n).unwrap();
        let m = w.matrix(n).unwrap();
        assert_eq!(m.rows(), shape[0], "{n}");
        assert_eq!(m.cols(), shape[1..].iter().product::<usize>(), "{n}");
    }
}

#[test]
fn new_layout_equals_legacy() {
    let legacy = open_fixture("lm/model.safetensors", Component::Lm);
    let new = open_fixture("lm/model_new_layout.safetensors", Component::Lm);
    assert_eq!(new.layout(), names::Layout::PytorchNew);
    new.check(&Schema::lm(&tiny_lm_config())).unwrap();
    assert_close(&legacy, &new, 0.0, false);
    // One depformer step of the stacked in_proj is a zero-copy row block.
    let n = "depformer.layers.1.self_attn.in_proj_weight";
    let dd = 32;
    let m = new.matrix_rows(n, 3 * 3 * dd, 3 * dd).unwrap();
    assert_eq!((m.rows(), m.cols()), (3 * dd, dd));
    let (all, _) = legacy.f32(n).unwrap();
    let mut row = vec![0f32; dd];
    m.row_f32(5, &mut row);
    assert_eq!(&row[..], &all[(9 * dd + 5) * dd..(9 * dd + 6) * dd]);
}

#[test]
fn hf_mimi_equals_kyutai() {
    let cfg = tiny_mimi_config();
    let k = open_fixture("mimi/mimi.safetensors", Component::Mimi);
    let mut o = OpenOptions::new(Component::Mimi);
    o.mimi_num_heads = cfg.transformer.num_heads;
    let hf = Weights::open_with(&fixtures().join("mimi/mimi_hf.safetensors"), &o).unwrap();
    assert_eq!(hf.layout(), names::Layout::HfMimi);
    let schema = Schema::mimi(&cfg);
    k.check(&schema).unwrap();
    hf.check(&schema).unwrap();
    assert_close(&k, &hf, 0.0, false);
}

#[test]
fn candle_and_mlx_bf16_equal_legacy() {
    let legacy = open_fixture("lm/model.safetensors", Component::Lm);
    let schema = Schema::lm(&tiny_lm_config());
    for (dir, layout) in [
        ("lm_candle_bf16", names::Layout::Candle),
        ("lm_mlx_bf16", names::Layout::Mlx),
    ] {
        let w = open_fixture(Path::new(dir).join("model.safetensors"), Component::Lm);
        assert_eq!(w.layout(), layout, "{dir}");
        w.check(&schema).unwrap();
        assert_close(&legacy, &w, 0.0, true);
        let b = Bundle::open(&fixtures().join(dir)).unwrap();
        b.lm_weights().unwrap();
    }
}

#[test]
fn quantized_layouts_map_completely() {
    let legacy = open_fixture("lm/model.safetensors", Component::Lm);
    let schema = Schema::lm(&tiny_lm_config());
    // (dir, file, layout, tolerance relative to the row max)
    for (dir, file, layout, rel) in [
        ("lm_gguf_q8", "model.q8.gguf", names::Layout::Candle, 0.02),
        (
            "lm_mlx_q8",
            "model.q8.safetensors",
            names::Layout::Mlx,
            0.02,
        ),
        (
            "lm_mlx_q4",
            "model.q4.safetensors",
            names::Layout::Mlx,
            0.15,
        ),
    ] {
        let w = open_fixture(Path::new(dir).join(file), Component::Lm);
        assert_eq!(w.layout(), layout, "{dir}");
        w.check(&schema).unwrap();
        assert_close(&legacy, &w, rel, false);
        let b = Bundle::open(&fixtures().join(dir)).unwrap();
        assert_eq!(b.files.lm, fixtures().join(dir).join(file));
        let w = b.lm_weights().unwrap();
        let q = w
            .quant("transformer.layers.0.self_attn.in_proj_weight")
            .unwrap();
        match dir {
            "lm_gguf_q8" => assert_eq!(q, Quant::Plain(DType::Q8_0)),
            "lm_mlx_q8" => assert!(matches!(
                q,
                Quant::Mlx {
                    bits: 8,
                    group: 64,
                    ..
                }
            )),
            _ => assert!(matches!(
                q,
                Quant::Mlx {
                    bits: 4,
                    group: 32,
                    ..
                }
            )),
        }
        for n in w.names() {
            let m = w.matrix(n).unwrap();
            assert_eq!(m.rows(), w.shape(n).unwrap()[0], "{dir} {n}");
        }
    }
}

#[test]
fn crafted_gguf_matches_expected() {
    let g = open_fixture("quant/crafted.gguf", Component::Lm);
    let e = open_fixture("quant/crafted_gguf_expected.safetensors", Component::Lm);
    assert_eq!(g.format(), FileFormat::Gguf);
    assert_close(&e, &g, 0.0, false);
    let bytes = std::fs::read(fixtures().join("quant/crafted.gguf")).unwrap();
    let h = gguf::parse(&bytes).unwrap();
    assert_eq!(h.alignment, 64);
    let md: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("quant/crafted_gguf_metadata.json")).unwrap(),
    )
    .unwrap();
    for (k, v) in md.as_object().unwrap() {
        let got = &h.metadata[k];
        let val = &v["value"];
        match got {
            gguf::MetaValue::Int(i) => assert_eq!(
                *i,
                val.as_i64()
                    .map(i128::from)
                    .unwrap_or_else(|| val.as_u64().unwrap() as i128),
                "{k}"
            ),
            gguf::MetaValue::Float(f) => assert_eq!(*f, val.as_f64().unwrap(), "{k}"),
            gguf::MetaValue::Bool(b) => assert_eq!(*b, val.as_bool().unwrap(), "{k}"),
            gguf::MetaValue::Str(s) => assert_eq!(s, val.as_str().unwrap(), "{k}"),
            gguf::MetaValue::Array { len, .. } => {
                assert_eq!(*len as usize, val.as_array().unwrap().len(), "{k}")
            }
        }
    }
}

#[test]
fn quant_blocks_dequantize_like_the_oracle() {
    let bytes = std::fs::read(fixtures().join("quant/blocks.safetensors")).unwrap();
    let h = safetensors::parse(&bytes).unwrap();
    let get = |n: &str| {
        h.tensors
            .iter()
            .find(|t| t.name == n)
            .unwrap_or_else(|| panic!("{n}"))
    };
    let f32s = |n: &str| {
        let t = get(n);
        let mut v = Vec::new();
        crate::checkpoint::dequant::dequant_plain(
            t.dtype,
            &bytes[t.offset..t.offset + t.len],
            &mut v,
        )
        .unwrap();
        v
    };
    for (q, dt) in [("q8_0", DType::Q8_0), ("q4_0", DType::Q4_0)] {
        let t = get(&format!("{q}.bytes"));
        let mut out = Vec::new();
        crate::checkpoint::dequant::dequant_plain(dt, &bytes[t.offset..t.offset + t.len], &mut out)
            .unwrap();
        assert_eq!(out, f32s(&format!("{q}.dequant")), "{q}");
    }
    // [8, 128] triplets: q4/g64 and q8/g32 have identical shapes, so (bits, group) is given here;
    // unambiguous shapes are inferred (checked in `quantized_layouts_map_completely`).
    for (name, bits, group) in [
        ("mlx_q4_g32", 4u8, 32usize),
        ("mlx_q4_g64", 4, 64),
        ("mlx_q8_g32", 8, 32),
        ("mlx_q8_g64", 8, 64),
    ] {
        let keep: Vec<(String, &str, Vec<usize>, Vec<u8>)> = ["weight", "scales", "biases"]
            .iter()
            .map(|leaf| {
                let t = get(&format!("{name}.{leaf}"));
                let dt = if t.dtype == DType::U32 { "U32" } else { "BF16" };
                (
                    t.name.clone(),
                    dt,
                    t.shape.clone(),
                    bytes[t.offset..t.offset + t.len].to_vec(),
                )
            })
            .collect();
        let file = safetensors::to_bytes(&keep);
        let inferred = Weights::from_bytes(name, file.clone(), &OpenOptions::new(Component::Lm));
        if (bits, group) == (4, 32) || (bits, group) == (8, 64) {
            assert!(inferred.is_ok(), "{name}");
        } else {
            assert!(
                matches!(inferred, Err(CheckpointError::BadQuantization { .. })),
                "{name}"
            );
        }
        let mut o = OpenOptions::new(Component::Lm);
        o.mlx_bits_group = Some((bits, group));
        let m = Weights::from_bytes(name, file, &o).unwrap();
        let (vals, shape) = m.f32(&format!("{name}.weight")).unwrap();
        assert_eq!(shape, vec![8, 128]);
        assert_eq!(vals, f32s(&format!("{name}.dequant")), "{name}");
        assert_eq!(m.matrix(&format!("{name}.weight")).unwrap().cols(), 128);
    }
}

#[test]
fn tensor_level_refusals() {
    let f = |names: &[(&str, &str)]| {
        let t: Vec<(String, &str, Vec<usize>, Vec<u8>)> = names
            .iter()
            .map(|(n, d)| {
                (
                    n.to_string(),
                    *d,
                    vec![4],
                    vec![0u8; 4 * if *d == "I8" { 1 } else { 4 }],
                )
            })
            .collect();
        Weights::from_bytes(
            "mem",
            safetensors::to_bytes(&t),
            &OpenOptions::new(Component::Lm),
        )
    };
    assert!(
        matches!(f(&[("text_emb.weight", "F32"), ("x.lora_A.weight", "F32")]), Err(CheckpointError::Lora { keys }) if keys == ["x.lora_A.weight"])
    );
    for (name, dtype, want) in [
        (
            "transformer.layers.0.gating.linear_in.weight",
            "I8",
            "BitsAndBytes",
        ),
        ("condition_provider.x.weight", "F32", "Conditioning"),
        ("extra_heads.0.weight", "F32", "ExtraHeads"),
        (
            "decoder.model.layers.0.self_attn.q_proj.weight",
            "F32",
            "UnsupportedLayout",
        ),
    ] {
        assert_eq!(err_variant(&f(&[(name, dtype)])), want, "{name}");
    }
    assert!(matches!(
        crate::checkpoint::BundleConfig::from_json(
            r#"{"architectures": ["MoshiForConditionalGeneration"], "model_type": "moshi"}"#
        ),
        Err(CheckpointError::UnsupportedLayout { .. })
    ));
    // Missing / unexpected / shape / dtype against the schema.
    let legacy = open_fixture("lm/model.safetensors", Component::Lm);
    let mut cfg = tiny_lm_config();
    assert!(legacy.check(&Schema::lm(&cfg)).is_ok());
    cfg.num_layers = 3;
    assert!(
        matches!(legacy.check(&Schema::lm(&cfg)), Err(CheckpointError::MissingTensor { names }) if names.len() == 6)
    );
    cfg.num_layers = 1;
    assert!(
        matches!(legacy.check(&Schema::lm(&cfg)), Err(CheckpointError::UnexpectedTensor { names }) if names.len() == 6)
    );
    cfg.num_layers = 2;
    cfg.card = 63;
    assert!(matches!(
        legacy.check(&Schema::lm(&cfg)),
        Err(CheckpointError::ShapeMismatch { .. })
    ));
    // A norm stored as an integer type is refused with the tensor named.
    let t = vec![(
        "out_norm.alpha".to_string(),
        "I32",
        vec![1, 1, 4],
        vec![0u8; 16],
    )];
    let w = Weights::from_bytes(
        "mem",
        safetensors::to_bytes(&t),
        &OpenOptions::new(Component::Lm),
    )
    .unwrap();
    let schema = Schema {
        component: Component::Lm,
        tensors: vec![crate::checkpoint::TensorSpec {
            name: "out_norm.alpha".into(),
            shape: vec![1, 1, 4],
            allowed: crate::checkpoint::Allowed::Float,
        }],
    };
    assert!(
        matches!(w.check(&schema), Err(CheckpointError::DtypeNotAllowed { name, .. }) if name == "out_norm.alpha")
    );
    // A Q8_0 norm in a GGUF file is refused as well.
    let q = vec![0u8; 34];
    let g = gguf::write(&[gguf::WriteTensor {
        name: "out_norm.alpha",
        ggml_type: gguf::ggml::Q8_0,
        shape: &[1, 1, 32],
        data: &q,
    }]);
    let w = Weights::from_bytes("mem.gguf", g, &OpenOptions::new(Component::Lm)).unwrap();
    let mut schema = schema;
    schema.tensors[0].shape = vec![1, 1, 32];
    assert!(matches!(
        w.check(&schema),
        Err(CheckpointError::DtypeNotAllowed { .. })
    ));
}

fn exercise(w: &Weights) {
    for n in w.names().map(str::to_string).collect::<Vec<_>>() {
        let _ = w.f32(&n);
        let _ = w.matrix(&n);
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

    /// Corrupting header bytes of real fixtures gives typed errors or valid weights, never a panic.
    #[test]
    fn corrupted_fixtures_never_panic(
        which in 0usize..4,
        edits in proptest::collection::vec((0usize..4096, proptest::num::u8::ANY), 1..4),
    ) {
        let (file, comp) = [
            ("lm_mlx_q4/model.q4.safetensors", Component::Lm),
            ("lm_gguf_q8/model.q8.gguf", Component::Lm),
            ("mimi/mimi_hf.safetensors", Component::Mimi),
            ("lm/model_new_layout.safetensors", Component::Lm),
        ][which];
        let mut bytes = std::fs::read(fixtures().join(file)).unwrap();
        for (pos, val) in edits {
            let p = pos % bytes.len();
            bytes[p] = val;
        }
        let mut o = OpenOptions::new(comp);
        o.mimi_num_heads = 2;
        if let Ok(w) = Weights::from_bytes(file, bytes, &o) {
            exercise(&w);
        }
    }
}

#[test]
fn bundle_refusals() {
    let dir = testkit::ScratchDir::new("bundle-refusals");
    // Empty directory: no config.json, so the released layout is looked for and reported missing.
    assert!(matches!(
        Bundle::open(&dir),
        Err(CheckpointError::MissingFile {
            what: "LM weights",
            ..
        })
    ));
    let src = fixtures().join("lm");
    for f in [
        "model.safetensors",
        "tokenizer_spm_32k_3.model",
        "mimi_config.json",
    ] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let cfg = std::fs::read_to_string(src.join("config.json")).unwrap();
    std::fs::write(dir.join("config.json"), &cfg).unwrap();
    assert!(matches!(
        Bundle::open(&dir),
        Err(CheckpointError::MissingFile {
            what: "Mimi weights",
            ..
        })
    ));
    std::fs::copy(src.join(MIMI_NAME), dir.join("mimi.safetensors")).unwrap();
    // `hf://org/repo/file` and `file://` references resolve inside the bundle directory.
    let patched = cfg
        .replace(
            "\"tokenizer-e351c8d8-checkpoint125.safetensors\"",
            "\"hf://kyutai/moshiko-pytorch-bf16/mimi.safetensors\"",
        )
        .replace("\"mimi_config.json\"", "\"file://mimi_config.json\"");
    std::fs::write(dir.join("config.json"), &patched).unwrap();
    let b = Bundle::open(&dir).unwrap();
    b.lm_weights().unwrap();
    b.mimi_weights().unwrap();
    // Each refusal named in config.json (and what is explicitly off is accepted).
    let hibiki = (r#""model_type": "hibiki""#, "UnsupportedModelType");
    for (extra, check) in super::bundle_config::CONFIG_EXTRAS
        .into_iter()
        .chain([hibiki])
    {
        let body = patched.trim_end().strip_suffix('}').unwrap();
        let text = if extra.starts_with("\"model_type\"") {
            patched.replace("\"model_type\": \"moshi\"", extra)
        } else {
            format!("{body}, {extra}}}")
        };
        std::fs::write(dir.join("config.json"), &text).unwrap();
        assert_eq!(err_variant(&Bundle::open(&dir)), check, "{extra}");
    }
    // A truncated LM file is a typed error, not a panic.
    std::fs::write(dir.join("config.json"), &patched).unwrap();
    let full = std::fs::read(src.join("model.safetensors")).unwrap();
    std::fs::write(dir.join("model.safetensors"), &full[..full.len() / 2]).unwrap();
    let b = Bundle::open(&dir).unwrap();
    assert!(matches!(
        b.lm_weights(),
        Err(CheckpointError::Malformed {
            kind: Malformed::OffsetOutOfRange { .. },
            ..
        })
    ));
}

/// The error of opening, as an LM file, two F32 `[3, 1]` tensors with these names.
fn lm_error_of_two_tensors(a: &str, b: &str) -> CheckpointError {
    let t = [a, b].map(|name| (name.to_string(), "F32", vec![3, 1], vec![0u8; 12]));
    Weights::from_bytes(
        "mem",
        safetensors::to_bytes(&t),
        &OpenOptions::new(Component::Lm),
    )
    .unwrap_err()
}

#[test]
fn legacy_and_new_attention_in_one_file_conflict() {
    let e = lm_error_of_two_tensors(
        "transformer.layers.0.self_attn.in_proj_weight",
        "transformer.layers.0.self_attn.in_projs.0.weight",
    );
    assert!(
        matches!(
            e,
            CheckpointError::Malformed {
                kind: Malformed::MappingConflict { .. },
                ..
            }
        ),
        "{e:?}"
    );
    // A gap in the per-step parts is reported as the missing part.
    let e = lm_error_of_two_tensors(
        "depformer.layers.0.self_attn.in_projs.0.weight",
        "depformer.layers.0.self_attn.in_projs.2.weight",
    );
    assert!(
        matches!(&e, CheckpointError::MissingTensor { names } if names[0].contains("part 1")),
        "{e:?}"
    );
}

#[test]
fn weights_and_bundle_are_shareable_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Weights>();
    assert_send_sync::<Bundle>();
    assert_send_sync::<CheckpointError>();
}

/// A file just read is in the page cache (evicting a 1.5 MB file's pages read a moment before would
/// take memory pressure no test run has); weights in memory have no page-cache share.
#[test]
fn resident_share_of_a_read_file_is_whole_and_of_bytes_in_memory_none() {
    let path = fixtures().join("lm/model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let w = Weights::open(&path, Component::Lm).unwrap();
    #[cfg(unix)]
    assert_eq!(w.resident_share(), Some(1.0));
    #[cfg(not(unix))]
    assert_eq!(w.resident_share(), None);
    let m =
        Weights::from_bytes("model.safetensors", bytes, &OpenOptions::new(Component::Lm)).unwrap();
    assert_eq!(m.resident_share(), None);
}
