//! Streamed q8_0 / q4_0 / bf16 matvec GB/s against software-prefetch distances and with or
//! without transparent huge pages for the weights, interleaved rounds.
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
    for fmt in [WeightFormat::Q8_0, WeightFormat::Q4_0] {
        let bytes = match fmt {
            WeightFormat::Q8_0 => encode_q8_0(&vals).unwrap(),
            _ => encode_q4_0(&vals).unwrap(),
        };
        let sets: Vec<Vec<Matrix>> = [true, false]
            .iter()
            .map(|&thp| {
                kernels::set_huge_pages_allowed(thp);
                (0..32)
                    .map(|_| {
                        Matrix::from_bytes(fmt, rows, cols, Storage::from_vec(bytes.clone()))
                            .unwrap()
                    })
                    .collect()
            })
            .collect();
        kernels::set_huge_pages_allowed(true);
        let total: usize = sets[0].iter().map(|m| m.weight_bytes()).sum();
        let x = vec![0.25f32; cols];
        let mut y = vec![0f32; rows];
        let mut s = vec![Vec::new(); dists.len() * 2];
        for r in 0..rounds + 1 {
            for (si, set) in sets.iter().enumerate() {
                for (di, &d) in dists.iter().enumerate() {
                    kernels::set_prefetch_distance(d);
                    let t = Instant::now();
                    for m in set {
                        pool.matvec(m, &x, &mut y);
                    }
                    let g = total as f64 / t.elapsed().as_secs_f64() / 1e9;
                    if r > 0 {
                        s[si * dists.len() + di].push(g);
                    }
                }
            }
        }
        kernels::set_prefetch_distance(4096);
        for (si, thp) in ["THP requested", "4 KiB pages"].iter().enumerate() {
            for (di, &d) in dists.iter().enumerate() {
                let v = &mut s[si * dists.len() + di];
                v.sort_by(|a, b| a.total_cmp(b));
                println!(
                    "{fmt:?} threads {threads} {thp} prefetch {d}: {:.2} GB/s median ({:.2}–{:.2}), {} MB",
                    v[v.len() / 2],
                    v[0],
                    v[v.len() - 1],
                    total >> 20
                );
            }
        }
    }
}
