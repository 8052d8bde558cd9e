//! Per-layer timing of the Mimi SEANet convolution shapes (best of 15, one thread, each
//! distinct shape once):
//! `cargo run --release -p moshi-kernels --features bench --example conv_layers`.
use kernels::bench::{mimi_layers, ConvLayer};
use std::time::Instant;
fn main() {
    let mut layers = mimi_layers();
    // Keep the first of each shape, in stack order.
    let mut seen = Vec::new();
    layers.retain(|l| {
        let new = !seen.contains(l);
        seen.push(*l);
        new
    });
    for (seed, l) in (1..).zip(&layers) {
        let mut conv = l.build(seed);
        let mut best = f64::INFINITY;
        for _ in 0..15 {
            let t0 = Instant::now();
            conv.forward(None);
            best = best.min(t0.elapsed().as_secs_f64());
        }
        let ConvLayer {
            transpose: tr,
            cin,
            cout,
            k,
            stride: s,
            t,
        } = *l;
        println!(
            "tr={tr} {cin}->{cout} k{k} s{s} t{t}: {:.3} ms  {:.1} GFLOP/s  weights {:.1} MB",
            best * 1e3,
            l.flops() / best / 1e9,
            (cin * cout * k * 4) as f64 / 1e6
        );
    }
}
