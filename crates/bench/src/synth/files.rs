//! The files of a synthetic bundle: headers laid out as the released files' (GGUF, MLX and PyTorch
//! safetensors), tensors streamed to their offsets, inventories and header-only (sparse) files.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use model::checkpoint::gguf;
use model::checkpoint::CheckpointError;
use model::checkpoint::{LmConfig, MimiConfig, Schema, MIMI_NAME};

use super::tensors::{expand, init_for, lm_outputs, stream_tensor, Out, Rng, Store};
use super::SynthFormat;

pub(super) fn io_err(path: &Path) -> impl Fn(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Byte size and placement of each file tensor of `outs` (MLX triplets expanded).
pub(super) type Infos<'a> = Vec<(String, &'a str, Vec<usize>, usize)>;

/// The header of the LM file of `format` holding `infos`, each tensor's data offset (relative to
/// the data section), and the file's total length. Written as the released files are:
/// * GGUF (candle's writer, `moshiko-candle-q8`): version 2, no metadata key, tensor data
///   aligned to 32 bytes;
/// * MLX (`mx.save_safetensors`): `__metadata__` `{"format": "mlx"}`, header not padded (the
///   data section may be unaligned);
/// * PyTorch / candle safetensors: no metadata, header padded to 8 bytes.
pub(super) fn lm_header(format: SynthFormat, infos: &Infos<'_>) -> (Vec<u8>, Vec<u64>, u64) {
    match format {
        SynthFormat::Q8Gguf | SynthFormat::Q4Gguf => {
            let typed: Vec<(&str, u32, &[usize], usize)> = infos
                .iter()
                .map(|(n, d, s, l)| {
                    let t = match *d {
                        "F32" => gguf::ggml::F32,
                        "Q8_0" => gguf::ggml::Q8_0,
                        "Q4_0" => gguf::ggml::Q4_0,
                        _ => gguf::ggml::BF16,
                    };
                    (n.as_str(), t, s.as_slice(), *l)
                })
                .collect();
            let (h, offsets) = gguf::header_bytes(&typed, 2);
            let end = offsets.last().copied().unwrap_or(0) + infos.last().map_or(0, |i| i.3 as u64);
            let len =
                h.len() as u64 + end.div_ceil(gguf::DEFAULT_ALIGNMENT) * gguf::DEFAULT_ALIGNMENT;
            (h, offsets, len)
        }
        _ => {
            let mlx = matches!(format, SynthFormat::MlxQ4 | SynthFormat::MlxQ8);
            let metadata: std::collections::BTreeMap<String, String> =
                [("format".to_string(), "mlx".to_string())].into();
            let h = model::checkpoint::safetensors::header_bytes_with(
                infos,
                mlx.then_some(&metadata),
                !mlx,
            );
            let mut offsets = Vec::with_capacity(infos.len());
            let mut off = 0u64;
            for i in infos {
                offsets.push(off);
                off += i.3 as u64;
            }
            (h.clone(), offsets, h.len() as u64 + off)
        }
    }
}

/// Write the file of `outs` in `format` (safetensors, or GGUF with F32 / Q8_0 / Q4_0 / BF16
/// tensors only), streaming each tensor to the offset the header gives its first file tensor and
/// zero-filling the alignment gaps (GGUF's; safetensors has none).
pub(super) fn write_tensor_file(
    path: &Path,
    format: SynthFormat,
    outs: &[Out],
    seed: u64,
) -> Result<u64, CheckpointError> {
    let per_out: Vec<Infos<'_>> = outs.iter().map(expand).collect();
    let infos: Infos<'_> = per_out.concat();
    let (header, offsets, total) = lm_header(format, &infos);
    let f = File::create(path).map_err(io_err(path))?;
    let mut w = BufWriter::with_capacity(1 << 22, f);
    w.write_all(&header).map_err(io_err(path))?;
    let mut rng = Rng(seed);
    let mut pos = 0u64;
    // Index in `offsets` of the next tensor's first file tensor (an MLX matrix has three, written
    // one after the other by `stream_tensor`).
    let mut first = 0;
    for (o, parts) in outs.iter().zip(&per_out) {
        let off = offsets[first];
        first += parts.len();
        let pad = off - pos;
        w.write_all(&vec![0u8; pad as usize])
            .map_err(io_err(path))?;
        pos = off;
        stream_tensor(o, &mut rng, |_, b| {
            pos += b.len() as u64;
            w.write_all(b)
        })
        .map_err(io_err(path))?;
    }
    let end = total - header.len() as u64;
    w.write_all(&vec![0u8; (end - pos) as usize])
        .map_err(io_err(path))?;
    w.flush().map_err(io_err(path))?;
    Ok(total)
}

/// What the LM file of `format` for `cfg` holds, computed from the schema without writing it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inventory {
    /// Tensors in the file (an MLX quantized matrix counts as its three tensors).
    pub tensors: usize,
    /// Tensors per file dtype (`BF16`, `F32`, `Q8_0`, `U32`).
    pub by_dtype: std::collections::BTreeMap<String, usize>,
    /// Model values (dequantized elements of every weight).
    pub values: u64,
    /// File length in bytes.
    pub file_len: u64,
}

/// The inventory of the LM file [`super::write_bundle`] writes for `cfg` in `format`.
pub fn lm_inventory(cfg: &LmConfig, format: SynthFormat) -> Inventory {
    let outs = lm_outputs(cfg, format);
    let infos: Infos<'_> = outs.iter().flat_map(expand).collect();
    let (_, _, file_len) = lm_header(format, &infos);
    let mut by_dtype = std::collections::BTreeMap::new();
    for i in &infos {
        *by_dtype.entry(i.1.to_string()).or_insert(0) += 1;
    }
    Inventory {
        tensors: infos.len(),
        by_dtype,
        values: outs
            .iter()
            .map(|o| o.shape.iter().product::<usize>() as u64)
            .sum(),
        file_len,
    }
}

/// Write only the header of the LM file of `format` for `cfg` and extend the file to its full
/// length without writing data (a sparse file): enough to exercise format detection, name mapping
/// and schema checks at full size without generating gigabytes.
pub fn write_lm_header_only(
    path: &Path,
    format: SynthFormat,
    cfg: &LmConfig,
) -> Result<u64, CheckpointError> {
    let outs = lm_outputs(cfg, format);
    let infos: Infos<'_> = outs.iter().flat_map(expand).collect();
    let (header, _, total) = lm_header(format, &infos);
    let mut f = File::create(path).map_err(io_err(path))?;
    f.write_all(&header).map_err(io_err(path))?;
    f.set_len(total).map_err(io_err(path))?;
    Ok(total)
}

/// Write only the header of an f32 Mimi file for `cfg` (Kyutai names, or the Hugging Face layout when
/// `hf`) and extend it to full length without data (sparse), like [`write_lm_header_only`].
pub fn write_mimi_header_only(
    path: &Path,
    cfg: &MimiConfig,
    hf: bool,
) -> Result<u64, CheckpointError> {
    let infos = mimi_infos(cfg, hf)?;
    let header = model::checkpoint::safetensors::header_bytes(&infos, None);
    let total = header.len() as u64 + infos.iter().map(|i| i.3 as u64).sum::<u64>();
    let mut f = File::create(path).map_err(io_err(path))?;
    f.write_all(&header).map_err(io_err(path))?;
    f.set_len(total).map_err(io_err(path))?;
    Ok(total)
}

/// The f32 tensors of the Mimi file for `cfg` (Kyutai names, or the Hugging Face layout).
pub(super) fn mimi_infos(cfg: &MimiConfig, hf: bool) -> Result<Infos<'static>, CheckpointError> {
    let mut infos: Infos<'static> = Vec::new();
    for t in Schema::mimi(cfg).tensors {
        let n: usize = t.shape.iter().product();
        if !hf {
            infos.push((t.name, "F32", t.shape, n * 4));
            continue;
        }
        let names = model::checkpoint::names::to_hf_mimi(&t.name)
            .ok_or_else(|| CheckpointError::NoSuchTensor(t.name.clone()))?;
        let k = names.len();
        let mut shape = t.shape.clone();
        shape[0] /= k;
        for name in names {
            infos.push((name, "F32", shape.clone(), n / k * 4));
        }
    }
    Ok(infos)
}

/// Write the f32 Mimi file of `mimi` (Kyutai names, `MIMI_NAME`) into `dir`: its path and length.
pub(super) fn write_mimi_file(
    dir: &Path,
    mimi: &MimiConfig,
    seed: u64,
) -> Result<(PathBuf, u64), CheckpointError> {
    let outs: Vec<Out> = Schema::mimi(mimi)
        .tensors
        .iter()
        .map(|s| Out {
            name: s.name.clone(),
            shape: s.shape.clone(),
            store: Store::F32,
            init: init_for(s),
        })
        .collect();
    let path = dir.join(MIMI_NAME);
    // The released Mimi file is a plain PyTorch safetensors file (padded header, no metadata).
    let len = write_tensor_file(&path, SynthFormat::Bf16, &outs, seed)?;
    Ok((path, len))
}
