//! Streamed q8_0 / q4_0 matvec GB/s against software-prefetch distances, interleaved rounds.
//! `cargo run --release -p moshi-kernels --example prefetch_ab -- [rounds] [threads]`
use kernels::quant::{encode_q4_0, encode_q8_0};
use kernels::{Matrix, Pool, Storage, WeightFormat};
use std::time::Instant;

fn main() {
    let mut a = std::env::args().skip(1);
    let rounds: usize = a.next().and_then(|v| v.parse().ok()).unwrap_or(7);
    let threads: usize = a.next().and_then(|v| v.parse().ok()).unwrap_or(1);
    let (rows, cols) = (4096usize, 4096usize);
    let vals: Vec<f32> = (0..rows * cols)
        .map(|i| ((i * 2654435761usize) % 1000) as f32 * 1e-3 - 0.5)
        .collect();
    let pool = Pool::new(threads);
    let dists = [0usize, 2048, 4096, 8192];
    for fmt in [WeightFormat::Q8_0, WeightFormat::Q4_0, WeightFormat::Bf16] {
        let bytes = match fmt {
            WeightFormat::Q8_0 => encode_q8_0(&vals).unwrap(),
            WeightFormat::Q4_0 => encode_q4_0(&vals).unwrap(),
            _ => vals
                .iter()
                .flat_map(|v| half::bf16::from_f32(*v).to_bits().to_le_bytes())
                .collect(),
        };
        let copies = if fmt == WeightFormat::Bf16 { 16 } else { 48 };
        let ms: Vec<Matrix> = (0..copies)
            .map(|_| Matrix::from_bytes(fmt, rows, cols, Storage::from_vec(bytes.clone())).unwrap())
            .collect();
        let total: usize = ms.iter().map(|m| m.weight_bytes()).sum();
        let x = vec![0.25f32; cols];
        let mut y = vec![0f32; rows];
        let mut s = vec![Vec::new(); dists.len()];
        for r in 0..rounds + 1 {
            for (di, &d) in dists.iter().enumerate() {
                kernels::set_prefetch_distance(d);
                let t = Instant::now();
                for m in &ms {
                    pool.matvec(m, &x, &mut y);
                }
                let g = total as f64 / t.elapsed().as_secs_f64() / 1e9;
                if r > 0 {
                    s[di].push(g);
                }
            }
        }
        for (di, &d) in dists.iter().enumerate() {
            let v = &mut s[di];
            v.sort_by(|a, b| a.total_cmp(b));
            println!(
                "{fmt:?} threads {threads} prefetch {d}: {:.2} GB/s median ({:.2}–{:.2}), {} MB",
                v[v.len() / 2],
                v[0],
                v[v.len() - 1],
                total >> 20
            );
        }
    }
}
