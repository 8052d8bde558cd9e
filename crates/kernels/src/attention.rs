//! Attention over a ring-buffer KV cache: one query per head ([`KvRing::attend`], the LM) or a
//! causal chunk of queries ([`KvRing::attend_chunk`], Mimi's transformer; [`Chunks::attend`] for
//! several streams' rings in one pool dispatch).

use crate::arch::{self, HeadQuery, KernelSet, Kernels, Seg};
use crate::{ops, KernelError};

struct SendPtr(*mut f32);
// SAFETY: used to hand disjoint slices to pool shares.
unsafe impl Sync for SendPtr {}
unsafe impl Send for SendPtr {}

/// Below this many key values read per call (queries × capacity × width, summed over the
/// streams), chunk attention stays on the calling thread.
const PAR_CHUNK: usize = 64 * 1024;

/// Element type of the cached keys and values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvDtype {
    /// f32 (exact).
    F32,
    /// bfloat16 (rounded to nearest even on push; half the memory traffic).
    Bf16,
}

enum Store {
    F32 { k: Vec<f32>, v: Vec<f32> },
    Bf16 { k: Vec<u16>, v: Vec<u16> },
}

/// A ring buffer of the last `capacity` keys and values of one attention layer,
/// `n_heads · head_dim` values per entry. Allocation-free after construction.
pub struct KvRing {
    capacity: usize,
    n_heads: usize,
    head_dim: usize,
    pushed: u64,
    store: Store,
    scores: Vec<f32>,
}

impl std::fmt::Debug for KvRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvRing")
            .field("capacity", &self.capacity)
            .field("n_heads", &self.n_heads)
            .field("head_dim", &self.head_dim)
            .field("len", &self.len())
            .finish()
    }
}

impl KvRing {
    /// A ring of `capacity` entries of `n_heads × head_dim` keys and values.
    pub fn new(
        capacity: usize,
        n_heads: usize,
        head_dim: usize,
        dtype: KvDtype,
    ) -> Result<KvRing, KernelError> {
        if capacity == 0 || n_heads == 0 || head_dim == 0 {
            return Err(KernelError::BadShape(format!(
                "KvRing {capacity}x{n_heads}x{head_dim}"
            )));
        }
        let n = capacity
            .checked_mul(n_heads * head_dim)
            .ok_or_else(|| KernelError::BadShape("KvRing size overflow".into()))?;
        // Huge pages where the OS allows them: attention streams these buffers. Backed here, at
        // construction, so no frame pass page-faults (see `mem::touch_pages`).
        let store = match dtype {
            KvDtype::F32 => {
                let (mut k, mut v) = (crate::mem::zeroed_f32(n), crate::mem::zeroed_f32(n));
                crate::mem::touch_pages(&mut k);
                crate::mem::touch_pages(&mut v);
                Store::F32 { k, v }
            }
            KvDtype::Bf16 => {
                let (mut k, mut v) = (crate::mem::zeroed_u16(n), crate::mem::zeroed_u16(n));
                crate::mem::touch_pages(&mut k);
                crate::mem::touch_pages(&mut v);
                Store::Bf16 { k, v }
            }
        };
        Ok(KvRing {
            capacity,
            n_heads,
            head_dim,
            pushed: 0,
            store,
            scores: vec![0.0; capacity],
        })
    }

    /// Appends one entry (`k`, `v` of `n_heads · head_dim` values), overwriting the oldest
    /// once full.
    pub fn push(&mut self, k: &[f32], v: &[f32]) {
        let (hd, nh, cap) = (self.head_dim, self.n_heads, self.capacity);
        let d = nh * hd;
        assert!(k.len() == d && v.len() == d, "KvRing::push: wrong length");
        let slot = (self.pushed % cap as u64) as usize;
        // Layout [head][slot][head_dim]: each head's entries are contiguous, so attention
        // streams them sequentially.
        for h in 0..nh {
            let (src, dst) = (h * hd..(h + 1) * hd, (h * cap + slot) * hd);
            match &mut self.store {
                Store::F32 { k: ks, v: vs } => {
                    ks[dst..dst + hd].copy_from_slice(&k[src.clone()]);
                    vs[dst..dst + hd].copy_from_slice(&v[src]);
                }
                Store::Bf16 { k: ks, v: vs } => {
                    to_bf16(&k[src.clone()], &mut ks[dst..dst + hd]);
                    to_bf16(&v[src], &mut vs[dst..dst + hd]);
                }
            }
        }
        self.pushed += 1;
    }

    /// Forgets all entries.
    pub fn reset(&mut self) {
        self.pushed = 0;
    }

    /// Number of valid entries (`min(pushed, capacity)`).
    pub fn len(&self) -> usize {
        self.pushed.min(self.capacity as u64) as usize
    }

    /// True when no entry was pushed since construction / reset.
    pub fn is_empty(&self) -> bool {
        self.pushed == 0
    }

    /// Total number of entries pushed since construction / reset.
    pub fn pushed(&self) -> u64 {
        self.pushed
    }

    /// Capacity in entries.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Number of heads.
    pub fn n_heads(&self) -> usize {
        self.n_heads
    }

    /// Values per head.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// For every head: `out_h = softmax(q_h·k_hᵀ/√d) v_h` over the most recent
    /// `min(window, len)` entries (including the one just pushed), oldest first.
    /// `q` and `out` hold `n_heads · head_dim` values. With no entry, `out` is zero.
    pub fn attend(&mut self, q: &[f32], out: &mut [f32], window: usize) {
        self.attend_level(arch::active(), q, out, window)
    }

    /// [`KvRing::attend`] with a named kernel set (tests and benchmarks compare sets in one
    /// process); [`KernelError::Unsupported`] when this CPU cannot run it.
    pub fn attend_with(
        &mut self,
        set: KernelSet,
        q: &[f32],
        out: &mut [f32],
        window: usize,
    ) -> Result<(), KernelError> {
        self.attend_level(arch::checked_table(set)?, q, out, window);
        Ok(())
    }

    /// All heads, one after the other, with the given kernel table.
    fn attend_level(&mut self, level: &Kernels, q: &[f32], out: &mut [f32], window: usize) {
        let hd = self.head_dim;
        let mut scores = std::mem::take(&mut self.scores);
        for h in 0..self.n_heads {
            self.attend_head_level(
                level,
                h,
                &q[h * hd..(h + 1) * hd],
                &mut out[h * hd..(h + 1) * hd],
                window,
                &mut scores,
            );
        }
        self.scores = scores;
    }

    /// Scalar reference of [`KvRing::attend`]: per entry a scalar dot product, a scalar
    /// softmax and scalar `out += p·v` (property tests compare the SIMD paths with it).
    pub fn attend_reference(&mut self, q: &[f32], out: &mut [f32], window: usize) {
        self.attend_level(arch::table(KernelSet::Scalar), q, out, window)
    }

    /// [`KvRing::attend`] with the heads split over the pool's threads (each head's
    /// arithmetic is identical to `attend`, so results match bit for bit).
    pub fn attend_pool(&mut self, q: &[f32], out: &mut [f32], window: usize, pool: &crate::Pool) {
        let (hd, nh) = (self.head_dim, self.n_heads);
        assert!(
            q.len() >= nh * hd && out.len() >= nh * hd,
            "attend_pool: wrong length"
        );
        let nt = pool.n_threads().min(nh);
        if nt <= 1 || self.len().min(window) < 16 {
            return self.attend(q, out, window);
        }
        let cap = self.capacity;
        if self.scores.len() < cap * nt {
            // Grows once per thread count (warm-up), never in steady state.
            self.scores.resize(cap * nt, 0.0);
        }
        let mut scores = std::mem::take(&mut self.scores);
        {
            let this = &*self;
            let outp = SendPtr(out.as_mut_ptr());
            let sp = SendPtr(scores.as_mut_ptr());
            pool.run(nt, &|i| {
                let (outp, sp) = (&outp, &sp);
                let (a, b) = (i * nh / nt, (i + 1) * nh / nt);
                // SAFETY: share i owns heads a..b of `out` and scores slice i.
                let sc = unsafe { std::slice::from_raw_parts_mut(sp.0.add(i * cap), cap) };
                for h in a..b {
                    let o = unsafe { std::slice::from_raw_parts_mut(outp.0.add(h * hd), hd) };
                    this.attend_head(h, &q[h * hd..(h + 1) * hd], o, window, sc);
                }
            });
        }
        self.scores = scores;
    }

    /// Causal attention for a chunk of `t` queries whose keys and values were the last `t`
    /// entries pushed (a streaming transformer step of `t` frames). Query `s` belongs to
    /// entry `p = pushed − t + s` and attends, per head, to the entries
    /// `max(p + 1 − context, pushed − capacity) ..= p` still in the ring, oldest first.
    /// `q` holds `t` rows `q_stride` apart (the first `n_heads·head_dim` values of each are
    /// the query); `out` receives `t` rows of `n_heads·head_dim`. With a pool, large chunks
    /// are split by heads (each head's arithmetic is the same, so results match bit for bit).
    /// The one-ring case of [`Chunks::attend`].
    pub fn attend_chunk(
        &mut self,
        q: &[f32],
        q_stride: usize,
        t: usize,
        context: usize,
        out: &mut [f32],
        pool: Option<&crate::Pool>,
    ) {
        let mut scores = std::mem::take(&mut self.scores);
        let this = &*self;
        let chunk = Chunks {
            rings: |_: usize| this,
            m: 1,
            q,
            q_stride,
            t,
            context,
        };
        chunk.attend(out, &mut scores, pool);
        self.scores = scores;
    }

    /// One head of [`KvRing::attend`], usable from several threads at once (e.g. via
    /// [`crate::Pool::run`]); `scores` must hold at least `min(window, len)` values.
    pub fn attend_head(
        &self,
        h: usize,
        q: &[f32],
        out: &mut [f32],
        window: usize,
        scores: &mut [f32],
    ) {
        self.attend_head_level(arch::active(), h, q, out, window, scores)
    }

    fn attend_head_level(
        &self,
        level: &Kernels,
        h: usize,
        q: &[f32],
        out: &mut [f32],
        window: usize,
        scores: &mut [f32],
    ) {
        let n = window.min(self.len());
        self.attend_span(level, h, q, out, self.pushed, n, scores)
    }

    /// Head `h` of query `q` over the `n` entries pushed just before entry number `end`
    /// (`end − n .. end`, all still in the ring).
    #[allow(clippy::too_many_arguments)]
    fn attend_span(
        &self,
        level: &Kernels,
        h: usize,
        q: &[f32],
        out: &mut [f32],
        end: u64,
        n: usize,
        scores: &mut [f32],
    ) {
        let (hd, cap) = (self.head_dim, self.capacity);
        assert!(
            h < self.n_heads && q.len() == hd && out.len() == hd,
            "attend_head: bad head or length"
        );
        debug_assert!(end <= self.pushed && end - n as u64 + cap as u64 >= self.pushed);
        out.fill(0.0);
        if n == 0 {
            return;
        }
        let scores = &mut scores[..n];
        // The window is at most two runs of consecutive slots: s0.. (up to the end of the
        // ring) and 0.. (after wrapping).
        let s0 = ((end - n as u64) % cap as u64) as usize;
        let n1 = n.min(cap - s0);
        let runs = [(s0, n1), (0, n - n1)];
        let base = h * cap * hd;
        let inv = 1.0 / (hd as f32).sqrt();
        let (bf16, kp, vp, es) = match &self.store {
            Store::F32 { k, v } => (false, k.as_ptr() as *const u8, v.as_ptr() as *const u8, 4),
            Store::Bf16 { k, v } => (true, k.as_ptr() as *const u8, v.as_ptr() as *const u8, 2),
        };
        // SAFETY: the runs lie inside head h's region (s0 + n1 <= cap, n - n1 <= cap); the
        // table was selected for this CPU.
        let done = unsafe {
            let seg = |(s, c): (usize, usize)| Seg {
                k: kp.add((base + s * hd) * es),
                v: vp.add((base + s * hd) * es),
                n: c,
            };
            let head = HeadQuery {
                bf16,
                hd,
                q,
                segs: [seg(runs[0]), seg(runs[1])],
                inv,
            };
            (level.attend_head)(&head, scores, out)
        };
        if done {
            return;
        }
        let rows = || {
            runs.into_iter()
                .flat_map(|(s, c)| (s..s + c).map(|slot| base + slot * hd))
        };
        match &self.store {
            Store::F32 { k, .. } => {
                for (s, o) in scores.iter_mut().zip(rows()) {
                    *s = ops::dot_reference(q, &k[o..o + hd]) * inv;
                }
            }
            Store::Bf16 { k, .. } => {
                for (s, o) in scores.iter_mut().zip(rows()) {
                    *s = ops::dot_bf16_reference(q, &k[o..o + hd]) * inv;
                }
            }
        }
        ops::softmax(scores);
        match &self.store {
            Store::F32 { v, .. } => {
                for (&p, o) in scores.iter().zip(rows()) {
                    ops::axpy_reference(out, p, &v[o..o + hd]);
                }
            }
            Store::Bf16 { v, .. } => {
                for (&p, o) in scores.iter().zip(rows()) {
                    ops::axpy_bf16_reference(out, p, &v[o..o + hd]);
                }
            }
        }
    }
}

/// The chunks of `m` streams for one call ([`KvRing::attend_chunk`] for several rings at once):
/// stream `j` attends its ring `rings(j)` with the `t` query rows `j·t .. (j+1)·t` of `q`
/// (`q_stride` apart) into the rows `j·t .. (j+1)·t` of the output (`n_heads·head_dim` each). All
/// rings have the same heads and head size; each already holds the stream's `t` new entries.
#[derive(Clone, Copy, Debug)]
pub struct Chunks<'q, R> {
    /// Stream `j`'s ring.
    pub rings: R,
    /// Streams.
    pub m: usize,
    /// The `m·t` query rows.
    pub q: &'q [f32],
    /// Values from one query row to the next (at least `n_heads·head_dim`).
    pub q_stride: usize,
    /// Queries per stream.
    pub t: usize,
    /// Entries a query sees at most, its own included (as in [`KvRing::attend_chunk`]).
    pub context: usize,
}

impl<'r, R> Chunks<'_, R>
where
    R: Fn(usize) -> &'r KvRing + Sync,
{
    /// Every stream's chunk into `out`. With a pool, the (stream, head) pairs are shared out in
    /// one dispatch when the chunks are large; every pair runs the same arithmetic as the
    /// one-ring call, so each stream's output is bitwise what [`KvRing::attend_chunk`] gives for
    /// its ring alone.
    ///
    /// `scores` is work space of `m · n_heads · max capacity` values; it grows when shorter (keep
    /// it between calls so steady state does not allocate).
    pub fn attend(&self, out: &mut [f32], scores: &mut Vec<f32>, pool: Option<&crate::Pool>) {
        self.attend_level(arch::active(), out, scores, pool)
    }

    /// [`Chunks::attend`] with the kernels of a named set, whatever set is active: the seam
    /// through which property tests compare every set this CPU runs with an independent
    /// reference. [`KernelError::Unsupported`] (and nothing written) when this CPU cannot run
    /// `set`.
    pub fn attend_with(
        &self,
        set: KernelSet,
        out: &mut [f32],
        scores: &mut Vec<f32>,
        pool: Option<&crate::Pool>,
    ) -> Result<(), KernelError> {
        self.attend_level(arch::checked_table(set)?, out, scores, pool);
        Ok(())
    }

    fn attend_level(
        &self,
        level: &Kernels,
        out: &mut [f32],
        scores: &mut Vec<f32>,
        pool: Option<&crate::Pool>,
    ) {
        let Chunks {
            ref rings,
            m,
            q,
            q_stride,
            t,
            context,
        } = *self;
        if m == 0 {
            return;
        }
        let (nh, hd) = (rings(0).n_heads, rings(0).head_dim);
        let d = nh * hd;
        let rows = m * t;
        assert!(
            q_stride >= d
                && (rows == 0 || q.len() >= (rows - 1) * q_stride + d)
                && out.len() >= rows * d,
            "attend_chunk: wrong length"
        );
        let (mut cmax, mut work) = (0, 0);
        for j in 0..m {
            let r = rings(j);
            assert!(
                r.n_heads == nh && r.head_dim == hd && t <= r.len(),
                "attend_chunk: wrong length"
            );
            cmax = cmax.max(r.capacity);
            work += t * r.capacity * d;
        }
        let units = m * nh;
        if scores.len() < units * cmax {
            // Grows once (warm-up), never in steady state.
            scores.resize(units * cmax, 0.0);
        }
        let outp = SendPtr(out.as_mut_ptr());
        let sp = SendPtr(scores.as_mut_ptr());
        let unit = |u: usize| {
            let (outp, sp) = (&outp, &sp);
            let (j, h) = (u / nh, u % nh);
            let r = rings(j);
            let cap = r.capacity;
            let oldest = r.pushed.saturating_sub(cap as u64);
            // SAFETY: unit (j, h) owns head h's columns of stream j's output rows and scores
            // slice u (`cap <= cmax` values).
            let sc = unsafe { std::slice::from_raw_parts_mut(sp.0.add(u * cmax), cap) };
            for s in 0..t {
                let p = r.pushed - (t - s) as u64;
                let lo = (p + 1).saturating_sub(context as u64).max(oldest);
                let row = j * t + s;
                let o = unsafe { std::slice::from_raw_parts_mut(outp.0.add(row * d + h * hd), hd) };
                let qh = &q[row * q_stride + h * hd..row * q_stride + (h + 1) * hd];
                r.attend_span(level, h, qh, o, p + 1, (p + 1 - lo) as usize, sc);
            }
        };
        match pool {
            Some(pl) if pl.n_threads() > 1 && units > 1 && work >= PAR_CHUNK => {
                pl.run(units, &unit)
            }
            _ => (0..units).for_each(unit),
        }
    }
}

/// f32 → bf16 bits, rounded to nearest even (NaN stays NaN), like `half::bf16::from_f32`
/// (the conversion [`KvRing::push`] uses; SIMD when the active table has it).
pub fn to_bf16(x: &[f32], out: &mut [u16]) {
    debug_assert_eq!(x.len(), out.len());
    let n = x.len().min(out.len());
    // SAFETY: the active table was selected for this CPU; both slices hold n values.
    unsafe { (arch::active().to_bf16)(&x[..n], &mut out[..n]) }
}

/// Scalar reference of the f32 → bf16 conversion used by [`KvRing::push`].
pub use crate::arch::scalar::to_bf16 as to_bf16_reference;

#[cfg(test)]
mod tests {
    /// Minor page faults of the calling thread so far (`/proc/thread-self/stat`, field 10).
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    fn thread_minor_faults() -> u64 {
        let s = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
        let rest = s.rsplit_once(')').unwrap().1;
        rest.split_whitespace().nth(7).unwrap().parse().unwrap()
    }

    /// A moshiko-sized temporal ring (48 MiB per K and V in f32) is backed when built: pushing entries
    /// and attending over them, as the frame passes of a conversation do, faults no page in. (Without
    /// the touch at construction the first push alone faults a page of every head.)
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    #[test]
    fn pushes_into_a_fresh_ring_fault_no_page() {
        for dtype in [KvDtype::F32, KvDtype::Bf16] {
            let (cap, nh, hd) = (3000, 32, 128);
            let mut ring = KvRing::new(cap, nh, hd, dtype).unwrap();
            let k: Vec<f32> = (0..nh * hd).map(|i| (i % 7) as f32 * 0.1).collect();
            let mut out = vec![0.0; nh * hd];
            // The first attend sizes nothing new (scores were allocated with the ring) but reads the
            // entries; do one before counting so lazily mapped read-only pages are not the question.
            ring.push(&k, &k);
            ring.attend(&k, &mut out, cap);
            let before = thread_minor_faults();
            for _ in 0..300 {
                ring.push(&k, &k);
            }
            ring.attend(&k, &mut out, cap);
            let faults = thread_minor_faults() - before;
            assert_eq!(faults, 0, "{dtype:?}: {faults} page faults over 300 pushes");
        }
    }

    use super::*;

    /// Independent naive attention over explicit lists of keys and values.
    fn naive(q: &[f32], ks: &[Vec<f32>], vs: &[Vec<f32>]) -> Vec<f32> {
        let (ks, vs): (Vec<&[f32]>, Vec<&[f32]>) = (
            ks.iter().map(Vec::as_slice).collect(),
            vs.iter().map(Vec::as_slice).collect(),
        );
        testkit::naive_attention(q, &ks, &vs)
            .into_iter()
            .map(|x| x as f32)
            .collect()
    }

    #[test]
    fn ring_wraps_and_windows() {
        let (cap, hd) = (4, 3);
        let mut ring = KvRing::new(cap, 1, hd, KvDtype::F32).unwrap();
        let mut ks = Vec::new();
        let mut vs = Vec::new();
        for t in 0..7 {
            let k: Vec<f32> = (0..hd)
                .map(|i| ((t * 7 + i * 3) % 5) as f32 * 0.3 - 0.5)
                .collect();
            let v: Vec<f32> = (0..hd).map(|i| ((t * 5 + i) % 7) as f32 - 3.0).collect();
            ring.push(&k, &v);
            ks.push(k);
            vs.push(v);
            let q = [0.2f32, -0.4, 0.9];
            for window in [1usize, 2, 10] {
                let mut out = [0f32; 3];
                ring.attend(&q, &mut out, window);
                let n = window.min(cap).min(t + 1);
                let want = naive(&q, &ks[t + 1 - n..], &vs[t + 1 - n..]);
                for (a, b) in out.iter().zip(&want) {
                    assert!(
                        (a - b).abs() < 1e-5,
                        "t {t} window {window}: {out:?} vs {want:?}"
                    );
                }
            }
        }
        assert_eq!(ring.len(), cap);
        // attend_pool matches attend bit for bit (needs >= 16 entries to take the threaded path).
        let mut big = KvRing::new(40, 4, 8, KvDtype::Bf16).unwrap();
        for t in 0..50 {
            let k: Vec<f32> = (0..32)
                .map(|i| ((t * 3 + i * 5) % 11) as f32 * 0.1 - 0.5)
                .collect();
            big.push(&k, &k);
        }
        let q: Vec<f32> = (0..32).map(|i| (i % 7) as f32 * 0.2 - 0.6).collect();
        let (mut a, mut b) = (vec![0f32; 32], vec![0f32; 32]);
        big.attend(&q, &mut a, 30);
        big.attend_pool(&q, &mut b, 30, &crate::Pool::new(2));
        assert_eq!(a, b);
        ring.reset();
        assert!(ring.is_empty());
        assert!(KvRing::new(0, 1, 1, KvDtype::F32).is_err());
    }
}
