//! How far a run's floats are from a reference's (parity tests against the oracle's traces, GPU
//! against CPU, SIMD against scalar).
//!
//! Every float parity check of the tree goes through this module rather than its own fold,
//! because the obvious fold `.map(|(a, b)| (a - b).abs()).fold(0.0, f32::max)` is blind to NaN:
//! `f32::max(m, NaN) == m`, so an output of all NaN "differs by 0" and passes any tolerance. Here a
//! non-finite value on either side (NaN, +inf or -inf; a reference that holds one is as broken as
//! a run that does), or a length mismatch, is a failure, never a small difference.

use std::fmt;

/// Which side of a comparison held the value a [`Mismatch`] names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The values under test.
    Ours,
    /// The values they are compared with (an oracle trace, the CPU path, a scalar kernel).
    Reference,
}

/// Why two float slices could not be compared by a distance.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mismatch {
    /// The slices have different lengths (a run that produced the wrong number of values).
    Length {
        /// Length of ours.
        ours: usize,
        /// Length of the reference.
        reference: usize,
    },
    /// A value is NaN or infinite (the first such value, ours checked before the reference at
    /// each index).
    NonFinite {
        /// The slice that holds it.
        side: Side,
        /// Its index.
        index: usize,
        /// The value itself.
        value: f32,
    },
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mismatch::Length { ours, reference } => {
                write!(f, "lengths differ: ours {ours}, reference {reference}")
            }
            Mismatch::NonFinite { side, index, value } => {
                let side = match side {
                    Side::Ours => "ours",
                    Side::Reference => "the reference",
                };
                write!(f, "non-finite value in {side}: [{index}] = {value}")
            }
        }
    }
}

impl std::error::Error for Mismatch {}

/// Largest absolute difference between `ours` and `reference`, or why there is none: a length
/// mismatch or a non-finite value on either side.
pub fn try_max_abs_diff(ours: &[f32], reference: &[f32]) -> Result<f32, Mismatch> {
    // Both finite: the difference is a number (at worst +inf on overflow, which fails any
    // tolerance as it should).
    try_max_by(
        ours,
        reference,
        f32::is_finite,
        |b| b,
        0f32,
        |a, b| (a - b).abs(),
    )
}

/// Largest absolute difference between `ours` and `reference`.
///
/// Panics (fails the test) when the lengths differ or when any value on either side is NaN or
/// infinite, so that `assert!(max_abs_diff(..) <= tol)` cannot pass on broken output.
#[track_caller]
pub fn max_abs_diff(ours: &[f32], reference: &[f32]) -> f32 {
    match try_max_abs_diff(ours, reference) {
        Ok(d) => d,
        Err(e) => panic!("float comparison failed: {e}"),
    }
}

/// Asserts that `ours` is within `tol` of `reference` at every index (and that both are finite
/// and of the same length); returns the largest absolute difference. `what` names the
/// comparison in the failure message.
#[track_caller]
pub fn assert_close(ours: &[f32], reference: &[f32], tol: f32, what: &str) -> f32 {
    within(try_max_abs_diff(ours, reference), tol, what)
}

/// [`try_max_abs_diff`] against a reference computed in f64 (a test's own f64 evaluation of the
/// math), the difference taken in f64 so that the reference's extra precision is not rounded
/// away before it is compared. A non-finite reference value is reported as its f32 cast (NaN and
/// the infinities survive it).
pub fn try_max_abs_diff_f64(ours: &[f32], reference: &[f64]) -> Result<f64, Mismatch> {
    try_max_by(
        ours,
        reference,
        f64::is_finite,
        |b| b as f32,
        0f64,
        |a, b| (a as f64 - b).abs(),
    )
}

/// [`assert_close`] against an f64 reference ([`try_max_abs_diff_f64`]): fails on a length
/// mismatch, a non-finite value on either side, or a difference above `tol`; returns the largest
/// absolute difference.
#[track_caller]
pub fn assert_close_f64(ours: &[f32], reference: &[f64], tol: f64, what: &str) -> f64 {
    within(try_max_abs_diff_f64(ours, reference), tol, what)
}

/// The scan behind both `try_max_abs_diff*`: the lengths, then at each index our value's and the
/// reference's finiteness (a reference value reported as `as_f32` of it), then the largest `diff`.
fn try_max_by<R: Copy, D: Copy + PartialOrd>(
    ours: &[f32],
    reference: &[R],
    finite: impl Fn(R) -> bool,
    as_f32: impl Fn(R) -> f32,
    zero: D,
    diff: impl Fn(f32, R) -> D,
) -> Result<D, Mismatch> {
    if ours.len() != reference.len() {
        return Err(Mismatch::Length {
            ours: ours.len(),
            reference: reference.len(),
        });
    }
    let mut max = zero;
    for (index, (&a, &b)) in ours.iter().zip(reference).enumerate() {
        if !a.is_finite() {
            return Err(Mismatch::NonFinite {
                side: Side::Ours,
                index,
                value: a,
            });
        }
        if !finite(b) {
            return Err(Mismatch::NonFinite {
                side: Side::Reference,
                index,
                value: as_f32(b),
            });
        }
        let d = diff(a, b);
        if d > max {
            max = d;
        }
    }
    Ok(max)
}

/// The largest difference `d` of a comparison named `what`, failing the test on a mismatch or
/// when `d` is above `tol`.
#[track_caller]
fn within<D: PartialOrd + std::fmt::LowerExp>(d: Result<D, Mismatch>, tol: D, what: &str) -> D {
    let d = match d {
        Ok(d) => d,
        Err(e) => panic!("{what}: {e}"),
    };
    assert!(d <= tol, "{what}: max abs difference {d:e} > {tol:e}");
    d
}

/// (largest absolute difference, RMS difference relative to the reference's standard deviation).
/// Panics like [`max_abs_diff`] on a length mismatch or a non-finite value.
#[track_caller]
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
        assert_eq!(max_abs_diff(&[], &[]), 0.0);
        assert_eq!(assert_close(&[1.0, 2.0], &[1.0, 2.00001], 1e-4, "x"), {
            (2.0f32 - 2.00001).abs()
        });
    }

    #[test]
    fn every_non_finite_value_on_either_side_is_a_failure() {
        for bad in [f32::NAN, -f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            // Alone, after a large finite difference (which a NaN-dropping fold would report), and
            // equal on both sides (inf - inf is NaN, and inf == inf is no evidence either).
            for (ours, reference, side, index) in [
                (vec![bad], vec![0.0], Side::Ours, 0),
                (vec![0.0], vec![bad], Side::Reference, 0),
                (vec![0.0, 5.0, bad], vec![0.0, 0.0, 1.0], Side::Ours, 2),
                (vec![0.0, 5.0, 1.0], vec![0.0, 0.0, bad], Side::Reference, 2),
                (vec![1.0, bad], vec![1.0, bad], Side::Ours, 1),
            ] {
                match try_max_abs_diff(&ours, &reference) {
                    Err(Mismatch::NonFinite {
                        side: s, index: i, ..
                    }) => assert_eq!((s, i), (side, index), "{bad} {ours:?} {reference:?}"),
                    other => panic!("{bad} {ours:?} {reference:?}: {other:?}"),
                }
                let panicked = std::panic::catch_unwind(|| max_abs_diff(&ours, &reference));
                assert!(
                    panicked.is_err(),
                    "max_abs_diff passed {ours:?} vs {reference:?}"
                );
                let panicked = std::panic::catch_unwind(|| diff_stats(&ours, &reference));
                assert!(
                    panicked.is_err(),
                    "diff_stats passed {ours:?} vs {reference:?}"
                );
                let panicked =
                    std::panic::catch_unwind(|| assert_close(&ours, &reference, f32::MAX, "x"));
                assert!(
                    panicked.is_err(),
                    "assert_close passed {ours:?} vs {reference:?}"
                );
            }
        }
    }

    #[test]
    fn f64_references_fail_on_non_finite_values_either_side() {
        assert_eq!(try_max_abs_diff_f64(&[1.0, 2.0], &[1.0, 2.5]), Ok(0.5));
        // A difference below f32's resolution at 1 is kept (taken in f64), exactly.
        let tiny = 2f64.powi(-30);
        assert_eq!(assert_close_f64(&[1.0], &[1.0 + tiny], 1e-8, "x"), tiny);
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            // The reference's NaN after a large finite difference: a fold with f64::max would
            // keep the 5 and drop the NaN.
            match try_max_abs_diff_f64(&[5.0, 0.0], &[0.0, bad]) {
                Err(Mismatch::NonFinite {
                    side: Side::Reference,
                    index: 1,
                    ..
                }) => {}
                other => panic!("{bad}: {other:?}"),
            }
            let ours = [bad as f32];
            match try_max_abs_diff_f64(&ours, &[0.0]) {
                Err(Mismatch::NonFinite {
                    side: Side::Ours,
                    index: 0,
                    ..
                }) => {}
                other => panic!("{bad}: {other:?}"),
            }
            let panicked =
                std::panic::catch_unwind(|| assert_close_f64(&[0.0], &[bad], f64::MAX, "x"));
            assert!(
                panicked.is_err(),
                "assert_close_f64 passed a {bad} reference"
            );
        }
        assert!(matches!(
            try_max_abs_diff_f64(&[1.0], &[1.0, 2.0]),
            Err(Mismatch::Length { .. })
        ));
    }

    #[test]
    fn an_overflowing_difference_fails_every_tolerance() {
        let d = max_abs_diff(&[f32::MAX], &[-f32::MAX]);
        assert_eq!(d, f32::INFINITY);
        let panicked =
            std::panic::catch_unwind(|| assert_close(&[f32::MAX], &[-f32::MAX], 1e30, "x"));
        assert!(panicked.is_err());
    }

    #[test]
    fn different_lengths_are_a_failure() {
        assert_eq!(
            try_max_abs_diff(&[1.0], &[1.0, 2.0]),
            Err(Mismatch::Length {
                ours: 1,
                reference: 2
            })
        );
        assert!(std::panic::catch_unwind(|| max_abs_diff(&[1.0], &[1.0, 2.0])).is_err());
        assert!(std::panic::catch_unwind(|| assert_close(&[1.0, 2.0], &[1.0], 1.0, "x")).is_err());
    }

    #[test]
    #[should_panic(expected = "samples: max abs difference")]
    fn assert_close_fails_past_the_tolerance() {
        assert_close(&[1.0, 2.0], &[1.0, 2.1], 0.05, "samples");
    }
}
