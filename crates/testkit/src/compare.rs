//! How far a run's floats are from a reference's (parity tests against the oracle's traces).

/// Largest absolute difference between `ours` and `reference`. Panics when the lengths differ (a
/// run that produced the wrong number of values is a failure, not a small difference).
pub fn max_abs_diff(ours: &[f32], reference: &[f32]) -> f32 {
    assert_eq!(ours.len(), reference.len(), "lengths differ");
    ours.iter()
        .zip(reference)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max)
}

/// (largest absolute difference, RMS difference relative to the reference's standard deviation).
/// Panics when the lengths differ.
pub fn diff_stats(ours: &[f32], reference: &[f32]) -> (f32, f32) {
    let max = max_abs_diff(ours, reference);
    let n = reference.len() as f64;
    let mean = reference.iter().map(|&x| x as f64).sum::<f64>() / n;
    let var = reference
        .iter()
        .map(|&x| (x as f64 - mean).powi(2))
        .sum::<f64>()
        / n;
    let mse = ours
        .iter()
        .zip(reference)
        .map(|(&a, &b)| (a as f64 - b as f64).powi(2))
        .sum::<f64>()
        / n;
    (max, (mse / var).sqrt() as f32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn differences_of_known_values() {
        // Reference [1, 3]: mean 2, variance 1. Ours [1.5, 3]: |Δ| = [0.5, 0], MSE 0.125.
        let (max, rel) = diff_stats(&[1.5, 3.0], &[1.0, 3.0]);
        assert_eq!(max, 0.5);
        assert!((rel - 0.125f32.sqrt()).abs() < 1e-7, "{rel}");
        assert_eq!(max_abs_diff(&[1.0, -2.0], &[1.0, 2.0]), 4.0);
    }

    #[test]
    #[should_panic(expected = "lengths differ")]
    fn different_lengths_panic() {
        max_abs_diff(&[1.0], &[1.0, 2.0]);
    }
}
