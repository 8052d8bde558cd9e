//! Per-layer timing of the Mimi SEANet convolution shapes (best of 15, one thread):
//! `cargo run --release -p moshi-kernels --example conv_layers`.
use kernels::conv::*;
use std::time::Instant;
fn main() {
    let layers: &[(bool, usize, usize, usize, usize, usize)] = &[
        (false, 1, 64, 7, 1, 1920),
        (false, 64, 32, 3, 1, 1920),
        (false, 32, 64, 1, 1, 1920),
        (false, 64, 128, 8, 4, 480),
        (false, 128, 64, 3, 1, 480),
        (false, 128, 256, 10, 5, 96),
        (false, 256, 512, 12, 6, 16),
        (false, 512, 1024, 16, 8, 2),
        (true, 1024, 512, 16, 8, 2),
        (true, 512, 256, 12, 6, 16),
        (true, 256, 128, 10, 5, 96),
        (true, 128, 64, 8, 4, 480),
        (false, 64, 1, 3, 1, 1920),
    ];
    for &(tr, cin, cout, k, s, t) in layers {
        let w: Vec<f32> = (0..cin * cout * k)
            .map(|i| (i % 17) as f32 * 0.01)
            .collect();
        let mut best = f64::INFINITY;
        let flops = 2.0 * (cin * cout * k * t) as f64;
        if tr {
            let m = ConvTranspose1d::new(w, None, cin, cout, k, s, 1).unwrap();
            let x = vec![0.5f32; cin * t];
            let mut y = vec![0f32; cout * m.out_len(t)];
            for _ in 0..15 {
                let t0 = Instant::now();
                m.forward(&x, &mut y).unwrap();
                best = best.min(t0.elapsed().as_secs_f64());
            }
        } else {
            let m = Conv1d::new(w, None, cin, cout, k, s, 1, 1).unwrap();
            let x = vec![0.5f32; cin * ((t - 1) * s + k)];
            let mut y = vec![0f32; cout * t];
            for _ in 0..15 {
                let t0 = Instant::now();
                m.forward(&x, &mut y).unwrap();
                best = best.min(t0.elapsed().as_secs_f64());
            }
        }
        println!(
            "tr={tr} {cin}->{cout} k{k} s{s} t{t}: {:.3} ms  {:.1} GFLOP/s  weights {:.1} MB",
            best * 1e3,
            flops / best / 1e9,
            (cin * cout * k * 4) as f64 / 1e6
        );
    }
}
