//! Writes a q8_0 GGUF the way Kyutai's released `moshiko-candle-q8` was made: candle's own
//! quantizer and GGUF writer applied to a candle-layout safetensors file. Every rank-2 tensor
//! whose inner dimension is a multiple of the Q8_0 block (32) becomes Q8_0, everything else F32;
//! no metadata keys (so GGUF v2, default 32-byte alignment).
//!
//! It then reads the file back with candle's GGUF reader and writes candle's dequantization of
//! every tensor to an f32 safetensors file: the reference for a loader's dequantized path.
//!
//! Usage: `candle-gguf-fixture <in.safetensors> <out.gguf> <out.dequant.safetensors>`

use std::collections::HashMap;
use std::fs::File;
use std::io::BufWriter;

use anyhow::{bail, Context, Result};
use candle::quantized::{gguf_file, GgmlDType, QTensor};
use candle::{Device, Tensor};

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [input, gguf_path, dequant_path] = args.as_slice() else {
        bail!("usage: candle-gguf-fixture <in.safetensors> <out.gguf> <out.dequant.safetensors>");
    };
    let cpu = Device::Cpu;
    let tensors = candle::safetensors::load(input, &cpu).context("reading input")?;
    // Sorted so the file is reproducible (candle's own tool takes a hash map's order).
    let mut names: Vec<&String> = tensors.keys().collect();
    names.sort();
    let block = GgmlDType::Q8_0.block_size();
    let mut quantized = Vec::with_capacity(names.len());
    for name in &names {
        let t = &tensors[*name];
        let to_q8 = t.rank() == 2 && t.dim(1)? % block == 0;
        let dtype = if to_q8 { GgmlDType::Q8_0 } else { GgmlDType::F32 };
        quantized.push((name.as_str(), QTensor::quantize(t, dtype)?));
    }
    let refs: Vec<(&str, &QTensor)> = quantized.iter().map(|(n, q)| (*n, q)).collect();
    let mut out = BufWriter::new(File::create(gguf_path)?);
    gguf_file::write(&mut out, &[], &refs)?;
    drop(out);

    let mut file = File::open(gguf_path)?;
    let content = gguf_file::Content::read(&mut file)?;
    let mut dequant: HashMap<String, Tensor> = HashMap::new();
    for name in &names {
        let q = content.tensor(&mut file, name, &cpu)?;
        dequant.insert(name.to_string(), q.dequantize(&cpu)?);
    }
    candle::safetensors::save(&dequant, dequant_path)?;
    let q8 = quantized.iter().filter(|(_, q)| q.dtype() == GgmlDType::Q8_0).count();
    println!(
        "{gguf_path}: {} tensors ({q8} Q8_0, {} F32), {} metadata keys",
        quantized.len(),
        quantized.len() - q8,
        content.metadata.len()
    );
    Ok(())
}
