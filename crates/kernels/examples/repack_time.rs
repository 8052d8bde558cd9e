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
    let st = |v: &Vec<u8>| Storage::from_vec(v.clone());
    type Build<'a> = Box<dyn Fn() -> Matrix + 'a>;
    let builds: [(&str, Build<'_>); 3] = [
        (
            "q8_0",
            Box::new(|| Matrix::from_bytes(WeightFormat::Q8_0, rows, cols, st(&q8)).unwrap()),
        ),
        (
            "q4_0",
            Box::new(|| Matrix::from_bytes(WeightFormat::Q4_0, rows, cols, st(&q4)).unwrap()),
        ),
        (
            "mlx-q4",
            Box::new(|| Matrix::from_mlx(4, 32, rows, cols, st(&c), st(&s), st(&b)).unwrap()),
        ),
    ];
    let w = (rows * cols) as f64 / 1e9;
    for _ in 0..2 {
        let mut line = format!("repack {rows}x{cols}:");
        for (name, build) in &builds {
            let t = Instant::now();
            let m = build();
            let dt = t.elapsed().as_secs_f64();
            std::hint::black_box(m.rows());
            line += &format!(" {name} {:.0} ms ({:.2} Gw/s)", dt * 1e3, w / dt);
        }
        println!("{line}");
    }
}
