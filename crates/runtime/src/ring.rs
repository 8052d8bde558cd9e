//! Lock-free single-producer / single-consumer ring of 1920-sample frames with drop-oldest.
//!
//! The producer ([`crate::PcmProducer`]) accumulates samples of any chunk size into a private frame buffer;
//! each completed frame is written into the next slot of the ring. When the ring is full, the producer drops the
//! oldest queued frame by advancing the read index itself (a compare-and-swap that races with the consumer), so it
//! never waits. The consumer copies a slot out and then claims it with a compare-and-swap on the same index; if the
//! producer dropped that frame in the meantime the claim fails and the (possibly torn) copy is discarded.
//!
//! Samples are stored as `AtomicU32` bit patterns with relaxed ordering, so a concurrent overwrite of a slot that is
//! being copied is a well-defined (and detected) race rather than undefined behaviour. Publication uses
//! release/acquire on the indices. Nothing here allocates after construction.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use crate::FRAME_SIZE;

/// Shared state of the frame ring.
pub(crate) struct FrameRing {
    /// Slot storage: `capacity * FRAME_SIZE` samples as f32 bit patterns.
    slots: Box<[AtomicU32]>,
    /// When each slot's frame was completed by the producer: nanoseconds since `origin`.
    arrivals: Box<[AtomicU64]>,
    /// Time origin of `arrivals` (a clock read per completed frame, no syscall: the vDSO clock).
    origin: Instant,
    capacity: u64,
    /// Number of frames consumed or dropped so far (read index). Written by both sides (CAS).
    head: AtomicU64,
    /// Number of frames published so far (write index). Written only by the producer.
    tail: AtomicU64,
    /// Frames dropped because the ring was full.
    dropped: AtomicU64,
    /// Frames discarded by the consumer (reset drains the queue).
    discarded: AtomicU64,
    /// Set by the consumer to ask the producer to forget its partial frame (new stream).
    clear_partial: AtomicBool,
    /// Woken after a push that completed a frame (the runner's worker thread). Set once at spawn.
    waker: OnceLock<Waker>,
}

impl FrameRing {
    /// A ring holding at most `capacity` (>= 1) complete frames.
    pub(crate) fn new(capacity: usize) -> Arc<FrameRing> {
        let capacity = capacity.max(1);
        let slots: Box<[AtomicU32]> = (0..capacity * FRAME_SIZE)
            .map(|_| AtomicU32::new(0))
            .collect();
        let arrivals: Box<[AtomicU64]> = (0..capacity).map(|_| AtomicU64::new(0)).collect();
        Arc::new(FrameRing {
            slots,
            arrivals,
            origin: Instant::now(),
            capacity: capacity as u64,
            head: AtomicU64::new(0),
            tail: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            discarded: AtomicU64::new(0),
            clear_partial: AtomicBool::new(false),
            waker: OnceLock::new(),
        })
    }

    /// Install the waker (once; later calls are ignored).
    pub(crate) fn set_waker(&self, waker: Waker) {
        let _ = self.waker.set(waker);
    }

    /// Frames discarded by `clear`.
    pub(crate) fn discarded(&self) -> u64 {
        self.discarded.load(Ordering::Relaxed)
    }

    /// Frames currently queued (approximate while the producer runs).
    pub(crate) fn len(&self) -> usize {
        let t = self.tail.load(Ordering::Acquire);
        let h = self.head.load(Ordering::Acquire);
        t.saturating_sub(h) as usize
    }

    /// Frames ever published by the producer.
    pub(crate) fn published(&self) -> u64 {
        self.tail.load(Ordering::Acquire)
    }

    /// Frames dropped because the ring was full.
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    fn slot(&self, index: u64) -> &[AtomicU32] {
        let s = (index % self.capacity) as usize * FRAME_SIZE;
        &self.slots[s..s + FRAME_SIZE]
    }

    /// Producer side: publish one complete frame, dropping the oldest queued frame if full.
    /// Returns whether a frame was dropped. Must only be called by the single producer.
    fn publish(&self, frame: &[f32; FRAME_SIZE]) -> bool {
        let t = self.tail.load(Ordering::Relaxed);
        let mut dropped = false;
        loop {
            let h = self.head.load(Ordering::Acquire);
            if t - h < self.capacity {
                break;
            }
            // Full: drop the oldest frame unless the consumer takes it first (then re-check).
            if self
                .head
                .compare_exchange(h, h + 1, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                dropped = true;
                break;
            }
        }
        for (dst, &x) in self.slot(t).iter().zip(frame.iter()) {
            dst.store(x.to_bits(), Ordering::Relaxed);
        }
        let arrived = self.origin.elapsed().as_nanos() as u64;
        self.arrivals[(t % self.capacity) as usize].store(arrived, Ordering::Relaxed);
        self.tail.store(t + 1, Ordering::Release);
        dropped
    }

    /// Consumer side: copy the oldest queued frame into `out` and remove it; returns its sequence number
    /// (count of frames published before it), or None if empty. Must only be called by the single consumer.
    #[cfg(test)]
    pub(crate) fn pop(&self, out: &mut [f32; FRAME_SIZE]) -> Option<u64> {
        self.pop_stamped(out).map(|(seq, _)| seq)
    }

    /// [`FrameRing::pop`], also returning when the producer completed the frame.
    pub(crate) fn pop_stamped(&self, out: &mut [f32; FRAME_SIZE]) -> Option<(u64, Instant)> {
        loop {
            let h = self.head.load(Ordering::Acquire);
            let t = self.tail.load(Ordering::Acquire);
            if h >= t {
                return None;
            }
            for (o, src) in out.iter_mut().zip(self.slot(h).iter()) {
                *o = f32::from_bits(src.load(Ordering::Relaxed));
            }
            let arrived = self.arrivals[(h % self.capacity) as usize].load(Ordering::Relaxed);
            if self
                .head
                .compare_exchange(h, h + 1, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return Some((h, self.origin + std::time::Duration::from_nanos(arrived)));
            }
            // The producer dropped frame `h` while we copied it: the copy may be torn; take the next one.
        }
    }

    /// Ask the producer to forget its partial frame at its next push (new stream).
    pub(crate) fn forget_partial(&self) {
        self.clear_partial.store(true, Ordering::Release);
    }

    /// Consumer side: discard queued frames whose sequence number is below `mark`.
    pub(crate) fn discard_before(&self, mark: u64) {
        loop {
            let h = self.head.load(Ordering::Acquire);
            if h >= mark {
                return;
            }
            if self
                .head
                .compare_exchange(h, mark, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                self.discarded.fetch_add(mark - h, Ordering::Relaxed);
                return;
            }
        }
    }

    /// Count one popped frame as discarded (it belonged to a stream that was reset).
    pub(crate) fn count_discarded(&self) {
        self.discarded.fetch_add(1, Ordering::Relaxed);
    }
}

/// What one [`PcmProducer::push`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PushReport {
    /// Complete 1920-sample frames this push produced (and queued).
    pub frames_completed: u32,
    /// Queued frames dropped (oldest first) during this push because the queue was full.
    pub frames_dropped: u32,
    /// Frames waiting in the queue after this push.
    pub queued: usize,
}

/// Something to wake when a frame is published (the runner's worker thread).
pub(crate) type Waker = Arc<dyn Fn() + Send + Sync>;

/// The non-blocking producer end of a session's input queue (24 kHz mono f32).
///
/// Obtained once from [`crate::Session::take_producer`] or [`crate::SessionRunner::producer`]; it is `Send`,
/// so it can live in an audio callback or a network task. `push` never blocks and never allocates.
pub struct PcmProducer {
    ring: Arc<FrameRing>,
    partial: Box<[f32; FRAME_SIZE]>,
    filled: usize,
}

impl std::fmt::Debug for PcmProducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PcmProducer")
            .field("partial_samples", &self.filled)
            .field("queued", &self.ring.len())
            .finish()
    }
}

impl PcmProducer {
    pub(crate) fn new(ring: Arc<FrameRing>) -> PcmProducer {
        PcmProducer {
            ring,
            partial: Box::new([0.0; FRAME_SIZE]),
            filled: 0,
        }
    }

    /// Append samples of any length. Each completed 1920-sample frame is queued; if the queue already holds
    /// `max_queued_frames` frames, the oldest one is dropped and counted.
    ///
    /// Input sanitisation (so that no NaN or overflow can reach Mimi and the LM): NaN and ±inf become 0,
    /// finite samples are clamped to full scale `[-1, 1]`, and subnormal values are flushed to 0.
    pub fn push(&mut self, mut pcm: &[f32]) -> PushReport {
        if self.ring.clear_partial.swap(false, Ordering::AcqRel) {
            self.filled = 0;
        }
        let mut report = PushReport::default();
        while !pcm.is_empty() {
            let n = (FRAME_SIZE - self.filled).min(pcm.len());
            for (d, &s) in self.partial[self.filled..self.filled + n]
                .iter_mut()
                .zip(&pcm[..n])
            {
                *d = sanitize(s);
            }
            self.filled += n;
            pcm = &pcm[n..];
            if self.filled == FRAME_SIZE {
                self.filled = 0;
                if self.ring.publish(&self.partial) {
                    report.frames_dropped += 1;
                }
                report.frames_completed += 1;
            }
        }
        report.queued = self.ring.len();
        if report.frames_completed > 0 {
            if let Some(w) = self.ring.waker.get() {
                w();
            }
        }
        report
    }

    /// Samples waiting in the partial (not yet complete) frame.
    pub fn partial_samples(&self) -> usize {
        self.filled
    }
}

/// One input sample made safe: non-finite → 0, clamp to `[-1, 1]`, subnormal → 0.
#[inline]
fn sanitize(s: f32) -> f32 {
    if !s.is_finite() || s.abs() < f32::MIN_POSITIVE {
        0.0
    } else {
        s.clamp(-1.0, 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(v: f32) -> Vec<f32> {
        vec![v; FRAME_SIZE]
    }

    #[test]
    fn arbitrary_chunks_make_whole_frames() {
        let ring = FrameRing::new(8);
        let mut p = PcmProducer::new(ring.clone());
        // Distinct, exactly representable values inside [-1, 1] (the producer clamps to full scale).
        let signal: Vec<f32> = (0..FRAME_SIZE * 3 + 7)
            .map(|i| i as f32 / 16384.0)
            .collect();
        let mut off = 0;
        for chunk in [1usize, 333, 960, 1919, 2, 3000, 548] {
            let end = (off + chunk).min(signal.len());
            p.push(&signal[off..end]);
            off = end;
        }
        assert_eq!(off, signal.len());
        assert_eq!(ring.len(), 3);
        assert_eq!(p.partial_samples(), 7);
        let mut out = [0f32; FRAME_SIZE];
        for f in 0..3 {
            assert_eq!(ring.pop(&mut out), Some(f as u64));
            assert!(out
                .iter()
                .enumerate()
                .all(|(i, &x)| x == (f * FRAME_SIZE + i) as f32 / 16384.0));
        }
        assert!(ring.pop(&mut out).is_none());
    }

    #[test]
    fn full_queue_drops_oldest_and_counts() {
        let ring = FrameRing::new(3);
        let mut p = PcmProducer::new(ring.clone());
        let mut dropped = 0;
        for v in 0..5 {
            dropped += p.push(&frame(v as f32 / 8.0)).frames_dropped;
        }
        assert_eq!(dropped, 2);
        assert_eq!(ring.dropped(), 2);
        assert_eq!(ring.published(), 5);
        let mut out = [0f32; FRAME_SIZE];
        for v in 2..5 {
            assert_eq!(ring.pop(&mut out), Some(v));
            assert_eq!(out[0], v as f32 / 8.0);
            assert_eq!(out[FRAME_SIZE - 1], v as f32 / 8.0);
        }
        assert!(ring.pop(&mut out).is_none());
    }

    #[test]
    fn clear_empties_queue_and_partial() {
        let ring = FrameRing::new(4);
        let mut p = PcmProducer::new(ring.clone());
        p.push(&frame(0.1));
        p.push(&[0.2; 100]);
        ring.forget_partial();
        ring.discard_before(ring.published());
        assert_eq!(ring.len(), 0);
        assert_eq!(ring.discarded(), 1);
        p.push(&[0.3; FRAME_SIZE - 100]);
        assert_eq!(
            ring.len(),
            0,
            "partial frame from before the clear must be forgotten"
        );
        p.push(&[0.3; 100]);
        let mut out = [0f32; FRAME_SIZE];
        assert_eq!(ring.pop(&mut out), Some(1));
        assert!(out.iter().all(|&x| x == 0.3));
    }

    #[test]
    fn input_is_sanitized() {
        let ring = FrameRing::new(1);
        let mut p = PcmProducer::new(ring.clone());
        let mut x = vec![0.25f32; FRAME_SIZE];
        x[..5].copy_from_slice(&[f32::NAN, f32::INFINITY, -3.0, 1e-40, 2.0]);
        p.push(&x);
        let mut out = [0f32; FRAME_SIZE];
        assert_eq!(ring.pop(&mut out), Some(0));
        assert_eq!(&out[..6], &[0.0, 0.0, -1.0, 0.0, 1.0, 0.25]);
    }

    #[test]
    fn concurrent_producer_never_yields_torn_frames() {
        // Each frame is constant-valued (its sequence number); a torn copy would mix values.
        let ring = FrameRing::new(2);
        let mut p = PcmProducer::new(ring.clone());
        let n = 20_000u32;
        let prod = std::thread::spawn(move || {
            let mut buf = vec![0f32; FRAME_SIZE];
            for v in 0..n {
                buf.iter_mut().for_each(|x| *x = v as f32 / 32768.0);
                p.push(&buf);
            }
        });
        let mut out = [0f32; FRAME_SIZE];
        let mut last = -1f32;
        let mut got = 0u64;
        loop {
            if ring.pop(&mut out).is_some() {
                assert!(out.iter().all(|&x| x == out[0]), "torn frame");
                assert!(out[0] > last, "frames out of order");
                last = out[0];
                got += 1;
            } else if prod.is_finished() && ring.len() == 0 {
                break;
            }
        }
        prod.join().unwrap();
        assert_eq!(got + ring.dropped(), n as u64);
        assert_eq!(last, (n - 1) as f32 / 32768.0);
    }
}
