//! Tests of the synthetic bundles: values, layouts, full-size inventories, and STT bundles.

use std::fs::File;

use half::f16;

use super::files::mimi_infos;
use super::tensors::{expand, fill, lm_outputs, stream_tensor, Init, Out, Rng, Store};
use model::checkpoint::Schema;

use super::*;
use model::checkpoint::names::Layout;
use model::checkpoint::Bundle;
use model::checkpoint::Quant;
use testkit::ScratchDir;

fn tiny() -> (LmConfig, MimiConfig) {
    let mut lm = LmConfig::moshiko_v0_1();
    lm.dim = 64;
    lm.num_heads = 4;
    lm.num_layers = 2;
    lm.text_card = 100;
    lm.text_card_out = 100;
    lm.card = 64;
    lm.context = Some(10);
    lm.depformer_dim = 64;
    lm.depformer_num_heads = 4;
    lm.depformer_num_layers = 1;
    lm.depformer_dim_feedforward = (4.125 * 64.0) as usize;
    let mut mimi = MimiConfig::v0_1();
    mimi.seanet.dimension = 32;
    mimi.seanet.n_filters = 4;
    mimi.transformer.d_model = 32;
    mimi.transformer.input_dimension = 32;
    mimi.transformer.output_dimensions = vec![32];
    mimi.transformer.num_heads = 4;
    mimi.transformer.num_layers = 1;
    mimi.transformer.dim_feedforward = 64;
    mimi.quantizer.dimension = 16;
    mimi.quantizer.n_q = 8;
    mimi.quantizer.bins = 64;
    mimi.quantizer.input_dimension = 32;
    mimi.quantizer.output_dimension = 32;
    (lm, mimi)
}

/// Q4_0 blocks written by the generator decode (through the kernels' block decoder) to the drawn
/// values within the format's rounding: the levels are d·(q − 8), q in 0..=15, with d (after its f16
/// rounding) set so the value of largest magnitude sits on q = 0 up to that rounding. A value inside
/// the 16 levels is off by at most |d|/2 (round to nearest); one beyond the last level on the other
/// side (|x| > 7.5·|d|) is clamped to q = 15 (or 0), off by |x| − 7·|d|. Plus float slack.
#[test]
fn q4_0_blocks_decode_to_the_drawn_values() {
    let o = Out {
        name: "w".into(),
        shape: vec![4, 64],
        store: Store::Q4_0,
        init: Init::Fan(64),
    };
    let mut drawn = vec![0f32; 4 * 64];
    fill(&mut Rng(3), o.init, &mut drawn);
    let mut bytes = Vec::new();
    stream_tensor(&o, &mut Rng(3), |_, b| {
        bytes.extend_from_slice(b);
        Ok(())
    })
    .unwrap();
    assert_eq!(bytes.len(), 4 * 64 / 32 * 18);
    // The kernels read the file's GGUF blocks as they are (the loader's dequantizer is private
    // to the model crate; both decode d·(q − 8)).
    let m = kernels::Matrix::from_bytes(
        kernels::WeightFormat::Q4_0,
        4,
        64,
        kernels::Storage::from_vec(bytes.clone()),
    )
    .unwrap();
    let mut dec = vec![0f32; 4 * 64];
    for (r, row) in dec.chunks_exact_mut(64).enumerate() {
        m.row_f32(r, row);
    }
    for (b, (x, y)) in bytes
        .chunks_exact(18)
        .zip(drawn.chunks_exact(32).zip(dec.chunks_exact(32)))
    {
        let d = f16::from_le_bytes([b[0], b[1]]).to_f32().abs();
        for (xv, yv) in x.iter().zip(y) {
            let bound = (d / 2.0).max(xv.abs() - 7.0 * d) + 1e-6;
            assert!((xv - yv).abs() <= bound, "{xv} -> {yv} (d {d})");
        }
    }
}

#[test]
fn every_format_roundtrips_through_bundle() {
    let (lm, mimi) = tiny();
    let root = ScratchDir::new("synth-test");
    for (fmt, layout) in [
        (SynthFormat::Bf16, Layout::PytorchLegacy),
        (SynthFormat::Bf16InProjs, Layout::PytorchNew),
        (SynthFormat::CandleBf16, Layout::Candle),
        (SynthFormat::Q8Gguf, Layout::Candle),
        (SynthFormat::Q4Gguf, Layout::Candle),
        (SynthFormat::MlxQ4, Layout::Mlx),
        (SynthFormat::MlxQ8, Layout::Mlx),
    ] {
        let dir = root.join(format!("{fmt:?}"));
        let rep = write_bundle(&dir, fmt, &lm, &mimi, 7).unwrap();
        assert_eq!(
            std::fs::metadata(&rep.lm.0).unwrap().len(),
            rep.lm.1,
            "{fmt:?}"
        );
        let b = Bundle::open(&dir).unwrap();
        assert_eq!(b.config.lm, lm);
        assert_eq!(b.mimi_config, mimi);
        let w = b.lm_weights().unwrap_or_else(|e| panic!("{fmt:?}: {e}"));
        assert_eq!(w.layout(), layout);
        let q = w
            .quant("transformer.layers.1.gating.linear_in.weight")
            .unwrap();
        let expect = match fmt {
            SynthFormat::Bf16 | SynthFormat::Bf16InProjs | SynthFormat::CandleBf16 => "bf16",
            SynthFormat::Q8Gguf => "q8_0",
            SynthFormat::Q4Gguf => "q4_0",
            SynthFormat::MlxQ4 => "mlx-q4-g32",
            SynthFormat::MlxQ8 => "mlx-q8-g64",
        };
        assert_eq!(q.name(), expect);
        // Values have the intended scale: std ~ 1/sqrt(fan_in) for a linear.
        let (v, _) = w
            .f32("transformer.layers.0.self_attn.in_proj_weight")
            .unwrap();
        let std = (v.iter().map(|x| x * x).sum::<f32>() / v.len() as f32).sqrt();
        assert!((std - 0.125).abs() < 0.02, "{fmt:?} std {std}");
        b.mimi_weights().unwrap();
        if let Quant::Mlx { .. } = q {
            w.matrix("text_emb.weight").unwrap();
        }
        let spm = model::text::SentencePiece::load(&b.files.tokenizer).unwrap();
        let _ = spm;
    }
}

/// Full-size moshiko files (header only, sparse) in every layout map completely onto the schema.
#[test]
fn moshiko_header_only_files_map_completely() {
    let cfg = LmConfig::moshiko_v0_1();
    let schema = Schema::lm(&cfg);
    let root = ScratchDir::new("synth-hdr");
    for (fmt, layout, q) in [
        (SynthFormat::Bf16, Layout::PytorchLegacy, "bf16"),
        (SynthFormat::Bf16InProjs, Layout::PytorchNew, "bf16"),
        (SynthFormat::CandleBf16, Layout::Candle, "bf16"),
        (SynthFormat::Q8Gguf, Layout::Candle, "q8_0"),
        (SynthFormat::Q4Gguf, Layout::Candle, "q4_0"),
        (SynthFormat::MlxQ4, Layout::Mlx, "mlx-q4-g32"),
        (SynthFormat::MlxQ8, Layout::Mlx, "mlx-q8-g64"),
    ] {
        let p = root.join(format!("{fmt:?}"));
        let len = write_lm_header_only(&p, fmt, &cfg).unwrap();
        let w = model::checkpoint::Weights::open(&p, model::checkpoint::Component::Lm).unwrap();
        assert_eq!(w.file_len() as u64, len);
        assert_eq!(w.layout(), layout, "{fmt:?}");
        w.check(&schema).unwrap_or_else(|e| panic!("{fmt:?}: {e}"));
        for n in [
            "text_emb.weight",
            "depformer.layers.5.gating.7.linear_out.weight",
            "linears.7.weight",
        ] {
            assert_eq!(w.quant(n).unwrap().name(), q, "{fmt:?} {n}");
        }
        let i = w
            .info("depformer.layers.3.self_attn.in_proj_weight")
            .unwrap();
        assert_eq!(i.shape, vec![24576, 1024]);
        std::fs::remove_file(&p).unwrap();
    }
}

/// The released Mimi (Kyutai and Hugging Face layouts, header only) maps onto the schema.
#[test]
fn released_mimi_header_only_both_layouts() {
    let cfg = MimiConfig::v0_1();
    let schema = Schema::mimi(&cfg);
    let root = ScratchDir::new("synth-mimi");
    for (hf, layout) in [(false, Layout::PytorchLegacy), (true, Layout::HfMimi)] {
        let p = root.join(format!("mimi-{hf}.safetensors"));
        write_mimi_header_only(&p, &cfg, hf).unwrap();
        let w = model::checkpoint::Weights::open(&p, model::checkpoint::Component::Mimi).unwrap();
        assert_eq!(w.layout(), layout);
        w.check(&schema).unwrap_or_else(|e| panic!("hf={hf}: {e}"));
        let i = w.info("decoder.model.11.convtr.convtr.weight").unwrap();
        assert_eq!(i.shape, vec![128, 64, 8]);
        if hf {
            assert_eq!(i.sources, vec!["decoder.layers.11.conv.weight".to_string()]);
            assert_eq!(
                w.info("decoder.model.14.conv.conv.weight").unwrap().shape,
                vec![1, 64, 3]
            );
        }
    }
}

#[test]
fn moshiko_outputs_match_released_counts() {
    // candle bf16: 8 slices x 6 layers x (in/out proj + 2 norms + 2 gating) + per-slice 3.
    let outs = lm_outputs(&LmConfig::moshiko_v0_1(), SynthFormat::CandleBf16);
    let dep: Vec<_> = outs
        .iter()
        .filter(|o| o.name.starts_with("depformer."))
        .collect();
    assert_eq!(dep.len(), 8 * (6 * 6 + 3));
    let outs = lm_outputs(&LmConfig::moshiko_v0_1(), SynthFormat::MlxQ4);
    let t: Vec<_> = outs.iter().flat_map(expand).collect();
    let w = t
        .iter()
        .find(|x| x.0 == "transformer.layers.0.self_attn.in_proj.weight")
        .unwrap();
    assert_eq!(w.2, vec![12288, 512]);
    let s = t
        .iter()
        .find(|x| x.0 == "transformer.layers.0.self_attn.in_proj.scales")
        .unwrap();
    assert_eq!(s.2, vec![12288, 128]);
    let e = t.iter().find(|x| x.0 == "text_emb.weight").unwrap();
    assert_eq!(e.2, vec![32001, 512]);
    let outs = lm_outputs(&LmConfig::moshiko_v0_1(), SynthFormat::Bf16);
    let bytes: usize = outs.iter().flat_map(expand).map(|x| x.3).sum();
    assert_eq!(bytes, 2 * 7_687_729_152);
}

/// The full-size inventories, computed from the schema (nothing written), are those of the
/// released files: PyTorch bf16 355 tensors / 7,687,729,152 values; candle q8 523 tensors
/// (362 Q8_0, 161 F32) in 8,169,420,704 bytes; MLX q4 and q8 1,247 tensors; Mimi 318
/// tensors (Hugging Face layout 350) / 96,151,393 values.
#[test]
fn full_size_inventories_match_the_released_files() {
    let cfg = LmConfig::moshiko_v0_1();
    let bf16 = lm_inventory(&cfg, SynthFormat::Bf16);
    assert_eq!((bf16.tensors, bf16.values), (355, 7_687_729_152));
    let q8 = lm_inventory(&cfg, SynthFormat::Q8Gguf);
    assert_eq!(q8.tensors, 523);
    assert_eq!(q8.by_dtype.get("Q8_0"), Some(&362));
    assert_eq!(q8.by_dtype.get("F32"), Some(&161));
    assert_eq!(q8.file_len, 8_169_420_704);
    // candle and MLX files repeat each Depformer norm per slice: 8 slices x 6 layers x 2 x 1024.
    let dep_norm_copies = 7 * 6 * 2 * 1024;
    assert_eq!(q8.values, bf16.values + dep_norm_copies);
    for fmt in [SynthFormat::MlxQ4, SynthFormat::MlxQ8] {
        let m = lm_inventory(&cfg, fmt);
        assert_eq!(m.tensors, 1_247, "{fmt:?}");
        assert_eq!(m.values, bf16.values + dep_norm_copies, "{fmt:?}");
    }
    for (hf, tensors) in [(false, 318), (true, 350)] {
        let infos = mimi_infos(&MimiConfig::v0_1(), hf).unwrap();
        assert_eq!(infos.len(), tensors, "hf {hf}");
        let values: usize = infos.iter().map(|i| i.3 / 4).sum();
        assert_eq!(values, 96_151_393, "hf {hf}");
    }
}

/// The files are laid out as the released ones: GGUF version 2 with no metadata key; MLX
/// safetensors with `{"format":"mlx"}` and an unpadded header; and `write_lm_header_only`
/// gives the inventory's length.
#[test]
fn headers_are_those_of_the_released_files() {
    let cfg = LmConfig::moshiko_v0_1();
    let root = ScratchDir::new("synth-inv");
    for fmt in [SynthFormat::Q8Gguf, SynthFormat::MlxQ4, SynthFormat::Bf16] {
        let p = root.join(format!("{fmt:?}"));
        let len = write_lm_header_only(&p, fmt, &cfg).unwrap();
        assert_eq!(len, lm_inventory(&cfg, fmt).file_len);
        let head = {
            use std::io::Read;
            let mut b = vec![0u8; 1 << 20];
            let n = File::open(&p).unwrap().read(&mut b).unwrap();
            b.truncate(n);
            b
        };
        match fmt {
            SynthFormat::Q8Gguf => {
                assert_eq!(&head[..4], b"GGUF");
                assert_eq!(u32::from_le_bytes(head[4..8].try_into().unwrap()), 2);
                assert_eq!(u64::from_le_bytes(head[8..16].try_into().unwrap()), 523);
                assert_eq!(u64::from_le_bytes(head[16..24].try_into().unwrap()), 0);
            }
            _ => {
                let n = u64::from_le_bytes(head[..8].try_into().unwrap()) as usize;
                let json: serde_json::Value = serde_json::from_slice(&head[8..8 + n]).unwrap();
                if fmt == SynthFormat::MlxQ4 {
                    assert_eq!(json["__metadata__"], serde_json::json!({"format": "mlx"}));
                    assert_ne!(head[8 + n - 1], b' ', "no padding");
                } else {
                    assert!(json.get("__metadata__").is_none());
                    assert_eq!((8 + n) % 8, 0);
                }
            }
        }
        std::fs::remove_file(&p).unwrap();
    }
}

/// The tiny STT configuration of the oracle's 1b fixture (LM, `stt_config`, Mimi).
fn tiny_stt() -> SttSynth {
    let dir = testkit::fixtures_dir("stt").join("1b");
    let cfg = model::checkpoint::BundleConfig::from_json(
        &std::fs::read_to_string(dir.join("config.json")).unwrap(),
    )
    .unwrap();
    let mimi =
        MimiConfig::from_json(&std::fs::read_to_string(dir.join("mimi_config.json")).unwrap())
            .unwrap();
    SttSynth {
        lm: cfg.lm,
        stt: cfg.stt.unwrap(),
        mimi,
        tokenizer_name: "tokenizer_en_fr_audio_8000.model".into(),
    }
}

/// An STT bundle in each layout opens as one (`model_type` "stt", its `stt_config`, extra heads,
/// tokenizer name, Mimi config), loads as an `SttModel` in the layout's format, and transcribes.
#[test]
fn every_stt_format_opens_loads_and_steps() {
    let s = tiny_stt();
    let root = ScratchDir::new("synth-stt");
    for (fmt, quant) in [
        (SynthFormat::Bf16, "bf16"),
        (SynthFormat::CandleBf16, "bf16"),
        (SynthFormat::Q8Gguf, "q8_0"),
        (SynthFormat::Q4Gguf, "q4_0"),
        (SynthFormat::MlxQ4, "mlx-q4-g32"),
    ] {
        let dir = root.join(format!("{fmt:?}"));
        let rep = write_stt_bundle(&dir, fmt, &s, 3).unwrap();
        assert!(rep.config);
        let b = Bundle::open(&dir).unwrap_or_else(|e| panic!("{fmt:?}: {e}"));
        assert_eq!(b.config.model_type, "stt");
        assert_eq!(b.config.stt, Some(s.stt), "{fmt:?}");
        assert_eq!(b.config.lm, s.lm, "{fmt:?}");
        assert_eq!(b.mimi_config, s.mimi, "{fmt:?}");
        assert!(b.files.tokenizer.ends_with(&s.tokenizer_name));
        let w = b.lm_weights().unwrap_or_else(|e| panic!("{fmt:?}: {e}"));
        assert!(!w.names().any(|n| n.starts_with("depformer")), "{fmt:?}");
        assert_eq!(
            w.quant("transformer.layers.0.gating.linear_in.weight")
                .unwrap()
                .name(),
            quant,
            "{fmt:?}"
        );
        assert_eq!(
            w.names().filter(|n| n.starts_with("extra_heads.")).count(),
            s.lm.extra_heads_num_heads
        );
        let pool = std::sync::Arc::new(kernels::Pool::new(1));
        let m = std::sync::Arc::new(model::stt::SttModel::load(&b, &pool).unwrap());
        assert_eq!(m.n_heads(), s.lm.extra_heads_num_heads);
        let mut stream = model::stt::SttStream::cpu(&m, pool).unwrap();
        let pcm = crate::mimi::test_signal(3 * 1920, 24_000);
        let mut steps = 0;
        stream
            .push_pcm(&pcm, |batch, _| {
                assert!(batch.head_probs().iter().all(|p| p.is_finite()));
                steps += 1;
            })
            .unwrap();
        assert_eq!(steps, 3 + m.plan().prefix_frames, "{fmt:?}");
    }
    // A Moshi configuration (a Depformer) is refused.
    let mut moshi = s.clone();
    moshi.lm.dep_q = 8;
    assert!(write_stt_bundle(&root.join("moshi"), SynthFormat::Bf16, &moshi, 1).is_err());
}

/// The released STT models at full size (header-only sparse files) map completely onto their
/// schema in the bf16, Q8_0 and Q4_0 layouts: no Depformer, the extra heads of stt-1b only.
#[test]
fn released_stt_header_only_files_map_completely() {
    let root = ScratchDir::new("synth-stt-hdr");
    for r in model::stt::SttRelease::ALL {
        let cfg = r.lm_config();
        let schema = Schema::lm(&cfg);
        for (fmt, q) in [
            (SynthFormat::Bf16, "bf16"),
            (SynthFormat::Q8Gguf, "q8_0"),
            (SynthFormat::Q4Gguf, "q4_0"),
        ] {
            let p = root.join(format!("{r}-{fmt:?}"));
            let len = write_lm_header_only(&p, fmt, &cfg).unwrap();
            assert_eq!(len, lm_inventory(&cfg, fmt).file_len);
            let mut o = model::checkpoint::OpenOptions::new(model::checkpoint::Component::Lm);
            o.allow_extra_heads = cfg.extra_heads_num_heads > 0;
            let w = model::checkpoint::Weights::open_with(&p, &o).unwrap();
            w.check(&schema)
                .unwrap_or_else(|e| panic!("{r} {fmt:?}: {e}"));
            assert!(!w.names().any(|n| n.starts_with("depformer")));
            assert_eq!(
                w.names().filter(|n| n.starts_with("extra_heads.")).count(),
                cfg.extra_heads_num_heads,
                "{r}"
            );
            assert_eq!(
                w.quant("transformer.layers.1.self_attn.in_proj_weight")
                    .unwrap()
                    .name(),
                q
            );
            std::fs::remove_file(&p).unwrap();
        }
    }
}
