//! Load-time cost of repacking: `cargo run --release -p moshi-kernels --example repack_time`.
use kernels::quant::{encode_mlx, encode_q4_0, encode_q8_0};
use kernels::{Matrix, Storage, WeightFormat};
use std::time::Instant;
fn main() {
    let (rows, cols) = (4096usize, 11264usize);
    let vals: Vec<f32> = (0..rows * cols)
        .map(|i| ((i * 7919) % 1000) as f32 * 1e-3 - 0.5)
        .collect();
    let q8 = encode_q8_0(&vals).unwrap();
    let q4 = encode_q4_0(&vals).unwrap();
    let (c, s, b) = encode_mlx(4, 32, rows, cols, &vals).unwrap();
    for _ in 0..2 {
        let t = Instant::now();
        let m = Matrix::from_bytes(
            WeightFormat::Q8_0,
            rows,
            cols,
            Storage::from_vec(q8.clone()),
        )
        .unwrap();
        let t8 = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let m4 = Matrix::from_bytes(
            WeightFormat::Q4_0,
            rows,
            cols,
            Storage::from_vec(q4.clone()),
        )
        .unwrap();
        let t4 = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let mm = Matrix::from_mlx(
            4,
            32,
            rows,
            cols,
            Storage::from_vec(c.clone()),
            Storage::from_vec(s.clone()),
            Storage::from_vec(b.clone()),
        )
        .unwrap();
        let tm = t.elapsed().as_secs_f64();
        let w = (rows * cols) as f64 / 1e9;
        println!("repack {rows}x{cols}: q8_0 {:.0} ms ({:.2} Gw/s), q4_0 {:.0} ms ({:.2} Gw/s), mlx-q4 {:.0} ms ({:.2} Gw/s)", t8 * 1e3, w / t8, t4 * 1e3, w / t4, tm * 1e3, w / tm);
        std::hint::black_box((m.rows(), m4.rows(), mm.rows()));
    }
}
