//! The f64 attention that the attention tests check the kernels against, the CPU's and the
//! device's alike.

/// One head's attention in f64: `softmax(q·k_e / √d) · v_e` over the entries `e` (`keys[e]` and
/// `values[e]`, `d = q.len()` values each, oldest first), every sum in entry order.
pub fn naive_attention(q: &[f32], keys: &[&[f32]], values: &[&[f32]]) -> Vec<f64> {
    let d = q.len();
    let scores: Vec<f64> = keys
        .iter()
        .map(|k| {
            k.iter()
                .zip(q)
                .map(|(&a, &b)| a as f64 * b as f64)
                .sum::<f64>()
                / (d as f64).sqrt()
        })
        .collect();
    let top = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let w: Vec<f64> = scores.iter().map(|s| (s - top).exp()).collect();
    let z: f64 = w.iter().sum();
    (0..d)
        .map(|i| {
            w.iter()
                .zip(values)
                .map(|(p, v)| p * v[i] as f64)
                .sum::<f64>()
                / z
        })
        .collect()
}
