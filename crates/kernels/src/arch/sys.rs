//! Operating-system calls the kernels' memory helpers need, per platform (no-ops where the
//! platform lacks them).

/// The madvise(2) advices the memory helpers give. Neither changes the contents of the range,
/// only which physical pages back it.
#[derive(Clone, Copy)]
enum Advice {
    /// `MADV_HUGEPAGE`: back the range with huge pages from now on.
    HugePage = 14,
    /// `MADV_COLLAPSE` (Linux 6.1 and later): copy the range into fresh huge pages now.
    Collapse = 25,
}

/// madvise(2) on `[start, start + len)`, a range inside one of our own allocations; whether the
/// OS accepted it.
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
fn madvise(start: usize, len: usize, advice: Advice) -> bool {
    let ret: isize;
    // SAFETY: madvise(2) with one of the `Advice` values on a range inside our own allocation only
    // changes which physical pages back it (for `Collapse` the kernel copies the contents); it
    // never changes the contents.
    unsafe {
        std::arch::asm!(
            "syscall",
            inlateout("rax") 28isize => ret, // SYS_madvise
            in("rdi") start,
            in("rsi") len,
            in("rdx") advice as usize,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret == 0
}

/// No madvise(2) here: nothing is done.
#[cfg(not(all(target_os = "linux", target_arch = "x86_64")))]
fn madvise(start: usize, len: usize, advice: Advice) -> bool {
    let _ = (start, len, advice);
    false
}

/// Asks the OS to back `[start, start + len)` (2 MiB aligned, inside one of our allocations)
/// with huge pages, where the platform has such a call; a no-op elsewhere.
pub(crate) fn advise_huge_pages(start: usize, len: usize) {
    madvise(start, len, Advice::HugePage);
}

/// Asks the OS to back `[start, start + len)` (2 MiB aligned, inside one of our allocations) with
/// huge pages now, copying into fresh huge pages whatever part of it the page faults left on small
/// pages (Linux `MADV_COLLAPSE`, 6.1 and later); a no-op elsewhere. Returns whether the OS did it
/// (an older kernel refuses the call; memory too fragmented fails it).
pub(crate) fn collapse_huge_pages(start: usize, len: usize) -> bool {
    madvise(start, len, Advice::Collapse)
}
