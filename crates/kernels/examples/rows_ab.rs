//! Row ops (RMSNorm, LayerNorm, RoPE, softmax, SiLU gating, f32 → bf16) of every kernel set
//! this CPU runs, at the moshiko sizes, interleaved rounds: median ns per call and the ratio
//! to the portable set (which is the same Rust body compiled for the baseline target).
//! `cargo run --release -p moshi-kernels --example rows_ab -- [rounds]`
use kernels::ops::SetOps;
use kernels::KernelSet;
use std::hint::black_box;
use std::time::Instant;

/// Median ns per call of `f` over `calls` calls.
fn time(calls: usize, mut f: impl FnMut()) -> f64 {
    let t = Instant::now();
    for _ in 0..calls {
        f();
    }
    t.elapsed().as_nanos() as f64 / calls as f64
}

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(9);
    let sets: Vec<(KernelSet, SetOps)> = KernelSet::ALL
        .into_iter()
        .filter_map(|s| SetOps::of(s).map(|o| (s, o)))
        .collect();
    let v = |n: usize, k: f32| -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 2654435761usize) % 1000) as f32 * 1e-3 * k - 0.5 * k)
            .collect()
    };
    let (d, mimi_d, hidden, ctx) = (4096usize, 512usize, 11264usize, 3000usize);
    let (x, w, b) = (v(d, 2.0), v(d, 1.0), v(d, 0.1));
    let mut out = vec![0f32; d];
    let scores = v(ctx, 20.0);
    let mut sm = scores.clone();
    let g = v(2 * hidden, 8.0);
    let mut u = vec![0f32; hidden];
    let (cos, sin) = (v(64, 1.0), v(64, 1.0));
    let mut qk = v(2 * d, 1.0);
    let mut h = vec![0u16; d];
    let names = [
        "rms_norm 4096",
        "layer_norm 512",
        "rope 2x4096",
        "softmax 3000",
        "silu_gate 11264",
        "to_bf16 4096",
    ];
    let mut ns = vec![vec![Vec::new(); names.len()]; sets.len()];
    for r in 0..rounds + 1 {
        for (si, &(_, o)) in sets.iter().enumerate() {
            let t = [
                time(2000, || o.rms_norm(black_box(&x), &w, 1e-5, &mut out)),
                time(2000, || {
                    o.layer_norm(
                        black_box(&x[..mimi_d]),
                        &w[..mimi_d],
                        &b[..mimi_d],
                        1e-5,
                        &mut out[..mimi_d],
                    )
                }),
                time(2000, || o.rope_rotate(black_box(&mut qk), 128, &cos, &sin)),
                time(500, || {
                    sm.copy_from_slice(&scores);
                    o.softmax(black_box(&mut sm))
                }),
                time(500, || o.silu_gate(black_box(&g), &mut u)),
                time(2000, || o.to_bf16(black_box(&x), &mut h)),
            ];
            if r > 0 {
                for (k, t) in t.into_iter().enumerate() {
                    ns[si][k].push(t);
                }
            }
        }
    }
    println!(
        "{:<16} {}",
        "op",
        sets.iter()
            .map(|(s, _)| format!("{:>22}", s.name()))
            .collect::<String>()
    );
    for (k, name) in names.iter().enumerate() {
        let med = |si: usize| {
            let mut s = ns[si][k].clone();
            s.sort_by(f64::total_cmp);
            (s[s.len() / 2], s[0], s[s.len() - 1])
        };
        let base = med(0).0;
        let cells: String = (0..sets.len())
            .map(|si| {
                let (m, lo, hi) = med(si);
                format!(
                    "{:>9.0} ns ({:.2}x) {:>3.0}%",
                    m,
                    base / m,
                    (hi - lo) / m * 100.0
                )
            })
            .map(|c| format!("{c:>22}"))
            .collect();
        println!("{name:<16} {cells}");
    }
}
