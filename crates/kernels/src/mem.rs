//! Memory hints for large weight buffers.

use std::sync::atomic::{AtomicBool, Ordering};

static HUGE: AtomicBool = AtomicBool::new(true);

/// Allows or forbids asking the OS for transparent huge pages on large weight buffers
/// (benchmarks compare both). Takes effect for buffers allocated afterwards.
pub fn set_huge_pages_allowed(allowed: bool) {
    HUGE.store(allowed, Ordering::Relaxed);
}

/// Allocates a zeroed byte buffer and, on Linux x86_64, asks for transparent huge pages
/// (`madvise(MADV_HUGEPAGE)`) on its 2 MiB-aligned interior before it is first written, so
/// streaming it needs far fewer TLB entries. A refusal by the OS is ignored (it is a hint).
pub(crate) fn zeroed_bytes(n: usize) -> Vec<u8> {
    let v = vec![0u8; n];
    advise_huge(v.as_ptr(), v.len());
    v
}

/// [`zeroed_bytes`] for 16-bit values.
pub(crate) fn zeroed_u16(n: usize) -> Vec<u16> {
    let v = vec![0u16; n];
    advise_huge(v.as_ptr() as *const u8, v.len() * 2);
    v
}

/// [`zeroed_bytes`] for f32 values.
pub(crate) fn zeroed_f32(n: usize) -> Vec<f32> {
    let v = vec![0f32; n];
    advise_huge(v.as_ptr() as *const u8, v.len() * 4);
    v
}

/// Writes one element of every 4 KiB page of `buf` (with its current value), so the OS backs the whole
/// buffer now rather than at first use. For buffers a hot path fills bit by bit: the KV rings, whose
/// `[head][slot]` layout would otherwise fault a page of every head, deep into a conversation, every few
/// frames (and, with huge pages advised on a fragmented machine, stall on compaction for each 2 MiB).
pub(crate) fn touch_pages<T: Copy>(buf: &mut [T]) {
    let step = (4096 / std::mem::size_of::<T>().max(1)).max(1);
    for i in (0..buf.len()).step_by(step) {
        let p: *mut T = &mut buf[i];
        // SAFETY: `p` points into `buf`; a volatile read and write of its own value keeps the
        // compiler from proving the store dead (the buffer is fresh zeroed memory).
        unsafe { std::ptr::write_volatile(p, std::ptr::read_volatile(p)) };
    }
}

/// Asks the OS (Linux x86_64) to back the 2 MiB-aligned interior of `buf` with transparent
/// huge pages; best called before the buffer is first written (e.g. right after
/// `vec![0; n]`, which leaves fresh pages untouched). Buffers under 8 MiB are left alone; the
/// contents never change. Measured on the development host: one core streams q8_0 weights
/// ~13 % and q4_0 ~33 % faster from huge pages (`examples/prefetch_ab.rs`).
pub fn advise_huge_pages<T>(buf: &[T]) {
    advise_huge(buf.as_ptr() as *const u8, std::mem::size_of_val(buf))
}

/// The 2 MiB-aligned interior of `[p, p + len)` when huge pages are allowed and the buffer is large
/// enough to be worth them (8 MiB), else `None`.
fn huge_interior(p: *const u8, len: usize) -> Option<(usize, usize)> {
    const HUGE_PAGE: usize = 2 << 20;
    if len < 4 * HUGE_PAGE || !HUGE.load(Ordering::Relaxed) {
        return None;
    }
    let start = (p as usize).div_ceil(HUGE_PAGE) * HUGE_PAGE;
    let end = (p as usize + len) / HUGE_PAGE * HUGE_PAGE;
    (end > start).then_some((start, end - start))
}

fn advise_huge(p: *const u8, len: usize) {
    if let Some((start, len)) = huge_interior(p, len) {
        crate::arch::sys::advise_huge_pages(start, len);
    }
}

/// After a buffer from [`zeroed_bytes`] was written: moves whatever part of its huge-page interior the
/// page faults left on 4 KiB pages onto huge pages (Linux x86_64 `MADV_COLLAPSE`; a no-op elsewhere).
/// A fault takes a huge page only when one is free (or compaction makes one) at that moment, which
/// depends on what the page cache holds then: without this, the share of a model's weights on huge
/// pages varies from one process to the next, and streaming from 4 KiB pages is slower.
pub(crate) fn collapse_huge<T>(buf: &[T]) {
    if let Some((start, len)) = huge_interior(buf.as_ptr() as *const u8, std::mem::size_of_val(buf))
    {
        crate::arch::sys::collapse_huge_pages(start, len);
    }
}

/// `; anonymous memory on huge pages: H of A GB` from `/proc/self/smaps_rollup` (Linux; empty
/// elsewhere or when it cannot be read): how much of the repacked weights the OS backs with
/// transparent huge pages, which sets how fast they stream.
pub fn huge_page_share() -> String {
    let Ok(text) = std::fs::read_to_string("/proc/self/smaps_rollup") else {
        return String::new();
    };
    let kb = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
    };
    match (kb("AnonHugePages:"), kb("Anonymous:")) {
        (Some(h), Some(a)) => format!(
            "; anonymous memory on huge pages: {:.2} of {:.2} GB",
            h as f64 / 1e6 * 1.024,
            a as f64 / 1e6 * 1.024
        ),
        _ => String::new(),
    }
}
