//! Dense f32 matmul over Mimi's transformer shapes (16 layers of the four linears, 201 MB of
//! weights, more than any cache) at 2 and 8 activation rows: one Mimi stream, then a 4-slot
//! server tick. Software-prefetch distances interleaved within each round; best and median ms
//! per pass over all the weights, and the 8-row ÷ 2-row ratio (median over rounds).
//! `cargo run --release -p moshi-kernels --example dense_rows -- [rounds] [distances]`
//! (distances in bytes, comma-separated; default `4096,0`; a distance ending in `r` prefetches
//! in the same row also where rows are short, instead of the next block's twin row).
use kernels::{Matrix, Scratch};
use std::time::Instant;

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let rounds: usize = args.next().and_then(|v| v.parse().ok()).unwrap_or(20);
    let distances: Vec<(usize, bool)> = args
        .next()
        .unwrap_or_else(|| "4096,0".into())
        .split(',')
        .map(|v| {
            let (d, in_row) = v.strip_suffix('r').map_or((v, false), |d| (d, true));
            (d.parse().expect("a distance in bytes"), in_row)
        })
        .collect();
    let shapes = [(1536usize, 512usize), (512, 512), (2048, 512), (512, 2048)];
    let mats: Vec<Matrix> = (0..16)
        .flat_map(|l| {
            shapes.iter().enumerate().map(move |(i, &(r, c))| {
                let w = (0..r * c)
                    .map(|k| ((k * 7 + l * 13 + i) % 97) as f32 * 0.001 - 0.05)
                    .collect();
                Matrix::from_f32(r, c, w).expect("shape")
            })
        })
        .collect();
    let ns = [2usize, 8];
    let mut scratch = Scratch::new();
    let x: Vec<f32> = (0..8 * 2048).map(|k| (k % 31) as f32 * 0.01).collect();
    let mut y = vec![0f32; 8 * 2048];
    let mut ms = vec![vec![Vec::new(); ns.len()]; distances.len()];
    for _ in 0..rounds {
        for (a, &(pf, in_row)) in distances.iter().enumerate() {
            kernels::set_prefetch_distance(pf);
            kernels::set_short_row_prefetch(!in_row);
            for (b, &n) in ns.iter().enumerate() {
                let t0 = Instant::now();
                for m in &mats {
                    m.matmul(&x[..n * m.cols()], n, &mut y[..n * m.rows()], &mut scratch);
                }
                ms[a][b].push(t0.elapsed().as_secs_f64() * 1e3);
            }
        }
    }
    let mb: usize = mats.iter().map(|m| m.rows() * m.cols() * 4).sum();
    println!("{} MB of f32 weights, {rounds} rounds", mb / 1_000_000);
    kernels::set_short_row_prefetch(true);
    for (a, &(pf, in_row)) in distances.iter().enumerate() {
        let ratio: Vec<f64> = ms[a][1].iter().zip(&ms[a][0]).map(|(e, t)| e / t).collect();
        let how = if in_row { "in-row" } else { "" };
        for (b, &n) in ns.iter().enumerate() {
            let best = ms[a][b].iter().copied().fold(f64::INFINITY, f64::min);
            println!(
                "prefetch {pf:6} B {how:6}, {n} rows: best {best:.2} ms, median {:.2} ms",
                median(&ms[a][b])
            );
        }
        println!(
            "prefetch {pf:6} B {how:6}: 8 rows ÷ 2 rows {:.3}",
            median(&ratio)
        );
    }
}
