//! How a convolution's work is cut into shares for a pool: a strided input split into its phases,
//! row shares over a B gathered once, one stream per share, and the share arithmetic.

use crate::arch;
use crate::gemm::{
    gather_groups, gathered_len, gemm_pregathered, groups, panel_len, with_panels, with_scratch,
};
use crate::layout::{BView, PackedA};
use crate::Pool;

/// A raw output pointer handed to a pool's shares.
pub(super) struct SendPtr(pub(super) *mut f32);
// SAFETY: shares write disjoint regions.
unsafe impl Sync for SendPtr {}
unsafe impl Send for SendPtr {}

/// Below this many input values a strided input is split on the calling thread.
const PHASES_PAR_MIN: usize = 64 * 1024;

/// Splits `input` (`[channels, t_in]`) into `dst` (`[channels][s][lp]`, `lp = ⌈t_in / s⌉`):
/// phase `r` of a channel holds its values `r, r + s, …`, zero past the end.
pub(super) fn split_phases(
    input: &[f32],
    t_in: usize,
    s: usize,
    lp: usize,
    dst: &mut [f32],
    pool: Option<&Pool>,
) {
    let channels = input.len() / t_in;
    let split = |c0: usize, c1: usize, dst: &mut [f32]| {
        for (row, out) in input[c0 * t_in..c1 * t_in]
            .chunks_exact(t_in)
            .zip(dst.chunks_exact_mut(s * lp))
        {
            for (r, ph) in out.chunks_exact_mut(lp).enumerate() {
                let n = (t_in - r.min(t_in)).div_ceil(s);
                for (d, v) in ph.iter_mut().zip(row[r.min(t_in)..].iter().step_by(s)) {
                    *d = *v;
                }
                ph[n..].fill(0.0);
            }
        }
    };
    match pool {
        Some(p) if p.n_threads() > 1 && input.len() >= PHASES_PAR_MIN => {
            let parts = p.n_threads().min(channels);
            let out = SendPtr(dst.as_mut_ptr());
            p.run(parts, &|i| {
                let (c0, c1) = share(channels, parts, i);
                let out = &out;
                // SAFETY: share i writes only the phases of channels c0..c1.
                let dst = unsafe {
                    std::slice::from_raw_parts_mut(out.0.add(c0 * s * lp), (c1 - c0) * s * lp)
                };
                split(c0, c1, dst)
            });
        }
        _ => split(0, channels, dst),
    }
}

/// `C = A·B` split by row panels over `pool` (shares of `pu` panels), with B gathered once
/// (split by column groups) instead of by every share: for the few-column layers where the
/// rows are what can be split.
///
/// # Safety
/// `wide` belongs to an available table; `c` is valid for `a.m` rows of `ldc` and nobody else writes them.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn rows_pregathered(
    wide: arch::WideFn,
    pool: &Pool,
    a: &PackedA,
    b: &BView<'_>,
    c: *mut f32,
    ldc: usize,
    bias: Option<&[f32]>,
    pu: usize,
) {
    let nt = pool.n_threads();
    with_scratch(gathered_len(a.k, b.n), |buf| {
        let pre = SendPtr(buf.as_mut_ptr());
        let ng = groups(b.n);
        let parts = ng.min(nt);
        pool.run(parts, &|i| {
            let pre = &pre;
            // SAFETY: each share gathers its own groups into the buffer sized above.
            unsafe { gather_groups(b, a.k, share(ng, parts, i), pre.0) }
        });
        let mp = a.panels();
        let chunks = mp.div_ceil(pu).min(nt * CHUNKS_PER_THREAD);
        let out = SendPtr(c);
        pool.run(chunks, &|i| {
            let (pre, out) = (&pre, &out);
            // SAFETY: B is fully gathered (the previous run returned); shares write disjoint
            // row panels of C.
            unsafe {
                gemm_pregathered(
                    wide,
                    a,
                    pre.0,
                    b.n,
                    out.0,
                    ldc,
                    bias,
                    share_units(mp, pu, chunks, i),
                )
            }
        });
    })
}

/// Runs `one(j, panels)` for the streams `0..m` of a `forward_streams` call whose GEMMs have
/// depth `k` and `n` columns: on a pool a stream per share (each with its own panel buffer), else
/// one after the other on this thread. It first grows the panel scratch to what a call of one
/// stream of the same layer can take (its row or column shares, or a pre-gathered B), so a
/// warm-up with several streams also covers later calls of one.
pub(super) fn each_stream(
    k: usize,
    n: usize,
    m: usize,
    pool: Option<&Pool>,
    one: &(dyn Fn(usize, &mut [f32]) + Sync),
) {
    let nt = pool.map_or(1, |p| p.n_threads());
    with_scratch(
        (panel_len(k) * nt * CHUNKS_PER_THREAD).max(gathered_len(k, n)),
        |_| (),
    );
    match pool {
        Some(p) if nt > 1 => with_panels(k, m, |panels| {
            // SAFETY: stream j is run once, by one thread.
            p.run(m, &|j| one(j, unsafe { panels.share(j) }))
        }),
        _ => with_panels(k, 1, |panels| {
            for j in 0..m {
                // SAFETY: one share, on this thread.
                one(j, unsafe { panels.share(0) })
            }
        }),
    }
}

/// Work chunks per pool thread for the threaded convolutions.
pub(super) const CHUNKS_PER_THREAD: usize = 3;

/// [`share`] of `n` items in whole units of `unit` items (the last unit may be short).
pub(super) fn share_units(n: usize, unit: usize, parts: usize, i: usize) -> (usize, usize) {
    let (a, b) = share(n.div_ceil(unit), parts, i);
    ((a * unit).min(n), (b * unit).min(n))
}

pub(super) fn share(n: usize, parts: usize, i: usize) -> (usize, usize) {
    let base = n / parts;
    let rem = n % parts;
    let a = i * base + i.min(rem);
    (a.min(n), (a + base + usize::from(i < rem)).min(n))
}
