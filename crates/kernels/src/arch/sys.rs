//! Operating-system calls the kernels' memory helpers need, per platform (no-ops where the
//! platform lacks them).

/// Asks the OS to back `[start, start + len)` (2 MiB aligned, inside one of our allocations)
/// with huge pages, where the platform has such a call; a no-op elsewhere.
pub(crate) fn advise_huge_pages(start: usize, len: usize) {
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    // SAFETY: madvise(2) with MADV_HUGEPAGE (14) on a range inside our own allocation only
    // changes how the kernel backs those pages; it never changes their contents.
    unsafe {
        let _ret: isize;
        std::arch::asm!(
            "syscall",
            inlateout("rax") 28isize => _ret, // SYS_madvise
            in("rdi") start,
            in("rsi") len,
            in("rdx") 14usize, // MADV_HUGEPAGE
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    let _ = (start, len);
}

/// Asks the OS to back `[start, start + len)` (2 MiB aligned, inside one of our allocations) with
/// huge pages now, copying into fresh huge pages whatever part of it the page faults left on small
/// pages (Linux `MADV_COLLAPSE`, 6.1 and later); a no-op elsewhere. Returns whether the OS did it
/// (an older kernel refuses the call; memory too fragmented fails it).
pub(crate) fn collapse_huge_pages(start: usize, len: usize) -> bool {
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    // SAFETY: madvise(2) with MADV_COLLAPSE (25) on a range inside our own allocation only changes
    // which physical pages back it (the kernel copies the contents); it never changes the contents.
    unsafe {
        let ret: isize;
        std::arch::asm!(
            "syscall",
            inlateout("rax") 28isize => ret, // SYS_madvise
            in("rdi") start,
            in("rsi") len,
            in("rdx") 25usize, // MADV_COLLAPSE
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
        ret == 0
    }
    #[cfg(not(all(target_os = "linux", target_arch = "x86_64")))]
    {
        let _ = (start, len);
        false
    }
}
