//! Unit tests of the checkpoint reader (`weights.rs`), moved out to keep that file under 900 lines.

use super::*;
use crate::checkpoint::mapped::{BackingKind, RELEASE_PAGE};
use half::{bf16, f16};

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Writes a GGUF file with a q8_0 tensor `q` of `[q_rows, q_cols]` (repacked by kernels) and an f32
/// tensor `f` of `[64, 256]` (64 KiB, borrowed in place); returns the path and both tensors' values.
fn release_fixture(tag: &str, q_rows: usize, q_cols: usize) -> (PathBuf, Vec<f32>, Vec<f32>) {
    let blocks = q_rows * q_cols / 32;
    let mut q = Vec::with_capacity(blocks * 34);
    for b in 0..blocks {
        q.extend_from_slice(&f16::from_f32(0.25 + (b % 5) as f32 * 0.125).to_le_bytes());
        q.extend((0..32).map(|i| ((b * 7 + i * 13) % 251) as u8));
    }
    let f: Vec<f32> = (0..64 * 256).map(|i| i as f32 * 0.5 - 100.0).collect();
    let fb = f32_bytes(&f);
    let bytes = gguf::write(&[
        gguf::WriteTensor {
            name: "q",
            ggml_type: gguf::ggml::Q8_0,
            shape: &[q_rows, q_cols],
            data: &q,
        },
        gguf::WriteTensor {
            name: "f",
            ggml_type: gguf::ggml::F32,
            shape: &[64, 256],
            data: &fb,
        },
    ]);
    let mut qv = Vec::new();
    dequant_plain(DType::Q8_0, &q, &mut qv).unwrap();
    let path = std::env::temp_dir().join(format!(
        "moshi-weights-release-{tag}-{}.gguf",
        std::process::id()
    ));
    std::fs::write(&path, bytes).unwrap();
    (path, qv, f)
}

fn rows_equal(m: &Matrix, expect: &[f32]) -> bool {
    let mut row = vec![0.0; m.cols()];
    (0..m.rows()).all(|r| {
        m.row_f32(r, &mut row);
        row == expect[r * m.cols()..(r + 1) * m.cols()]
    })
}

// The pages of a repacked tensor are given back as soon as the matrix is built (the raw bytes are
// no longer referenced), those of a tensor borrowed in place only when its matrix is dropped, and
// every tensor still reads correctly afterwards (released pages fault back in from the file).
#[cfg(unix)]
#[test]
fn repacked_tensor_pages_are_released_borrowed_ones_kept() {
    let (path, qv, fv) = release_fixture("unit", 64, 1024);
    let w = Weights::open(&path, Component::Mimi).unwrap();
    assert_eq!(w.released_bytes(), 0);
    let q_len = w.info("q").unwrap().bytes;
    let mq = w.matrix("q").unwrap();
    let after_q = w.released_bytes();
    // Only whole pages inside the tensor are released.
    assert!(
        after_q <= q_len && after_q + 2 * RELEASE_PAGE >= q_len,
        "released {after_q} of {q_len} bytes"
    );
    assert!(rows_equal(&mq, &qv));

    let mf = w.matrix("f").unwrap();
    assert_eq!(
        w.released_bytes(),
        after_q,
        "a borrowed tensor must keep its pages"
    );
    assert!(rows_equal(&mf, &fv));
    drop(mf);
    assert!(w.released_bytes() > after_q, "the last borrower releases");

    // Everything reads the same after its pages were released.
    assert!(rows_equal(&w.matrix("q").unwrap(), &qv));
    assert_eq!(w.f32("f").unwrap().0, fv);
    assert!(rows_equal(&mq, &qv));
    drop(w);
    std::fs::remove_file(&path).unwrap();
}

/// Resident kB of the mapping that contains `addr`, from /proc/self/smaps.
#[cfg(target_os = "linux")]
fn mapping_rss_kb(addr: usize) -> usize {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut inside = false;
    for line in smaps.lines() {
        let head = line.split_whitespace().next().unwrap_or("");
        if let Some((a, b)) = head.split_once('-') {
            if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) {
                inside = a <= addr && addr < b;
                continue;
            }
        }
        if inside {
            if let Some(kb) = line.strip_prefix("Rss:") {
                return kb.trim().trim_end_matches("kB").trim().parse().unwrap();
            }
        }
    }
    panic!("no mapping contains {addr:#x}");
}

// The kernel really drops the released pages from this process's resident set (what
// `/usr/bin/time -v` reports as the peak): after repacking, the file mapping holds next to nothing.
#[cfg(target_os = "linux")]
#[test]
fn repacked_tensor_leaves_the_resident_set() {
    let (path, qv, _) = release_fixture("rss", 1024, 4096);
    let w = Weights::open(&path, Component::Mimi).unwrap();
    let BackingKind::Map(map) = &w.backing.kind else {
        panic!("Weights::open maps the file")
    };
    let addr = map.as_ptr() as usize;
    // Touch every page, as a load that reads the whole file does.
    let sum = map
        .iter()
        .step_by(RELEASE_PAGE)
        .map(|&b| b as u64)
        .sum::<u64>();
    std::hint::black_box(sum);
    let before = mapping_rss_kb(addr);
    let file_kb = w.file_len() / 1024;
    assert!(
        before * 2 >= file_kb,
        "touched {before} kB of a {file_kb} kB file"
    );
    let mq = w.matrix("q").unwrap();
    let after = mapping_rss_kb(addr);
    // Left: the header page, the partial pages at the tensor's ends and the f32 tensor (64 KiB).
    assert!(
        after <= 256,
        "{after} kB of the mapping still resident (file {file_kb} kB)"
    );
    assert!(rows_equal(&mq, &qv));
    drop(w);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn open_plain_safetensors_and_read() {
    let a: Vec<f32> = (0..6).map(|i| i as f32).collect();
    let bytes = safetensors::to_bytes(&[
        ("x.weight".into(), "F32", vec![2, 3], f32_bytes(&a)),
        (
            "y".into(),
            "BF16",
            vec![2],
            bf16::from_f32(1.5).to_le_bytes().repeat(2),
        ),
    ]);
    let w = Weights::from_bytes("mem", bytes, &OpenOptions::new(Component::Mimi)).unwrap();
    assert_eq!(w.names().collect::<Vec<_>>(), vec!["x.weight", "y"]);
    assert_eq!(w.shape("x.weight"), Some(&[2usize, 3][..]));
    assert_eq!(w.f32("x.weight").unwrap().0, a);
    assert_eq!(w.f32("y").unwrap().0, vec![1.5, 1.5]);
    assert!(matches!(
        w.f32("nope"),
        Err(CheckpointError::NoSuchTensor(_))
    ));
}

#[test]
fn hf_qk_unpermute_roundtrip() {
    // 2 heads, head_dim 4, d = 8: q rows permuted HF-style, k too, v plain.
    let d = 8;
    let heads = 2;
    let orig: Vec<f32> = (0..3 * d * d).map(|i| i as f32).collect();
    let hf_perm = |m: &[f32]| -> Vec<f32> {
        let hd = d / heads;
        let mut out = vec![0.0; d * d];
        for h in 0..heads {
            for s in 0..2 {
                for i in 0..hd / 2 {
                    let hf_row = h * hd + s * hd / 2 + i;
                    let o_row = h * hd + 2 * i + s;
                    out[hf_row * d..(hf_row + 1) * d]
                        .copy_from_slice(&m[o_row * d..(o_row + 1) * d]);
                }
            }
        }
        out
    };
    let q = hf_perm(&orig[..d * d]);
    let k = hf_perm(&orig[d * d..2 * d * d]);
    let v = orig[2 * d * d..].to_vec();
    let p = "encoder_transformer.layers.0.self_attn.";
    let bytes = safetensors::to_bytes(&[
        (
            format!("{p}q_proj.weight"),
            "F32",
            vec![d, d],
            f32_bytes(&q),
        ),
        (
            format!("{p}k_proj.weight"),
            "F32",
            vec![d, d],
            f32_bytes(&k),
        ),
        (
            format!("{p}v_proj.weight"),
            "F32",
            vec![d, d],
            f32_bytes(&v),
        ),
    ]);
    let mut o = OpenOptions::new(Component::Mimi);
    o.mimi_num_heads = heads;
    let w = Weights::from_bytes("mem", bytes, &o).unwrap();
    assert_eq!(w.layout(), Layout::HfMimi);
    let (vals, shape) = w
        .f32("encoder_transformer.transformer.layers.0.self_attn.in_proj_weight")
        .unwrap();
    assert_eq!(shape, vec![3 * d, d]);
    assert_eq!(vals, orig);
}
