//! A weights file's bytes (a read-only mmap or an owned buffer) and the page bookkeeping that gives a
//! tensor's mapped pages back to the OS (`MADV_DONTNEED`) once no matrix reads them in place.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use kernels::Storage;

use super::{CheckpointError, Malformed};

/// Granularity of [`Backing::release`]: ranges are shrunk to whole 4 KiB pages inside them. On a system
/// with larger pages the kernel widens the range to its pages, which can only drop a neighbouring
/// tensor's clean, file-backed page from this process (it is read again from the file when touched).
pub(super) const RELEASE_PAGE: usize = 4096;

/// Where a weights file's bytes live.
pub(super) enum BackingKind {
    /// A read-only file mapping (`Weights::open`).
    Map(memmap2::Mmap),
    /// Bytes in memory (`Weights::from_bytes`, tensors assembled or reordered at open).
    Owned(Vec<u8>),
}

/// The bytes every tensor of a [`Weights`] is borrowed from, and the bookkeeping of mapped pages
/// given back to the OS once no matrix reads them any more (see [`View`]).
pub(super) struct Backing {
    pub(super) kind: BackingKind,
    /// Bytes of the mapping released with `MADV_DONTNEED` so far (a range released twice counts twice).
    pub(super) released: AtomicUsize,
}

impl AsRef<[u8]> for Backing {
    fn as_ref(&self) -> &[u8] {
        match &self.kind {
            BackingKind::Map(m) => m,
            BackingKind::Owned(v) => v,
        }
    }
}

impl Backing {
    pub(super) fn owned(v: Vec<u8>) -> Arc<Backing> {
        Arc::new(Backing {
            kind: BackingKind::Owned(v),
            released: AtomicUsize::new(0),
        })
    }

    /// Reads `[offset, offset + len)` of a file mapping in before it is used, in one call: on Linux
    /// `MADV_POPULATE_READ` maps every page of the range (reading what the page cache lacks in large
    /// requests) instead of one fault per few pages as a loop over the bytes would take; on other Unix
    /// systems `MADV_WILLNEED` starts the read-ahead. No-op for bytes in memory and elsewhere. Only a
    /// hint: a refusal (an older kernel) leaves the faults to the first access.
    pub(super) fn prefetch(&self, offset: usize, len: usize) {
        let BackingKind::Map(map) = &self.kind else {
            return;
        };
        if len == 0 || offset.checked_add(len).is_none_or(|end| end > map.len()) {
            return;
        }
        #[cfg(target_os = "linux")]
        let advice = memmap2::Advice::PopulateRead;
        #[cfg(all(unix, not(target_os = "linux")))]
        let advice = memmap2::Advice::WillNeed;
        #[cfg(unix)]
        if let Err(e) = map.advise_range(advice, offset, len) {
            tracing::debug!("madvise({advice:?}) on weights pages failed: {e}");
        }
    }

    /// Share of the file mapping's pages that are in the page cache (0.0..=1.0), from `mincore(2)` on
    /// up to `samples` pages spread evenly over the file; `None` for bytes in memory, off Unix, or when
    /// the OS refuses the call. Reads no byte of the file.
    pub(super) fn resident_share(&self, samples: usize) -> Option<f64> {
        let BackingKind::Map(map) = &self.kind else {
            return None;
        };
        #[cfg(unix)]
        {
            // SAFETY: sysconf has no preconditions.
            let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).ok()?;
            let pages = map.len().div_ceil(page.max(1));
            let samples = samples.clamp(1, pages.max(1));
            let mut resident = 0usize;
            for i in 0..samples {
                let p = i * pages / samples;
                let mut vec = 0u8;
                // SAFETY: the address is page `p` of our own live mapping (page aligned: the
                // mapping starts on a page boundary), the length one page inside it, and `vec`
                // holds the one byte mincore writes for one page.
                let ret = unsafe {
                    libc::mincore(
                        map.as_ptr().add(p * page) as *mut libc::c_void,
                        page.min(map.len() - p * page),
                        &mut vec as *mut u8 as _,
                    )
                };
                if ret != 0 {
                    return None;
                }
                resident += usize::from(vec & 1);
            }
            Some(resident as f64 / samples as f64)
        }
        #[cfg(not(unix))]
        {
            let _ = (map, samples);
            None
        }
    }

    /// Drops this process's resident pages that lie wholly inside `[offset, offset + len)` of a file
    /// mapping (no-op for bytes in memory and off Unix). The mapping is read-only and never written,
    /// so this changes no byte: a later read faults the page in again from the file (page cache).
    /// It only stops those pages from counting in this process's resident set next to the
    /// repacked copy a quantized [`Matrix`] keeps.
    pub(super) fn release(&self, offset: usize, len: usize) {
        let BackingKind::Map(map) = &self.kind else {
            return;
        };
        // The mapping starts on a page boundary, so file offsets and page offsets agree.
        let start = offset.next_multiple_of(RELEASE_PAGE);
        let end = (offset + len) / RELEASE_PAGE * RELEASE_PAGE;
        if end <= start || end > map.len() {
            return;
        }
        #[cfg(unix)]
        {
            // SAFETY: `map` is a read-only shared file mapping that this process never writes, so
            // MADV_DONTNEED discards no data: every later access reads the same file bytes back
            // (the checkpoint must not change while mapped, as `map_file` already requires).
            let advised = unsafe {
                map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, end - start)
            };
            match advised {
                Ok(()) => {
                    self.released.fetch_add(end - start, Ordering::Relaxed);
                }
                Err(e) => tracing::debug!("madvise(DONTNEED) on weights pages failed: {e}"),
            }
        }
    }
}

pub(super) type Owner = Arc<Backing>;

/// One tensor's bytes as handed to [`kernels::Storage`]. When the last reference goes (at once when
/// the matrix repacked or copied them, later when a matrix that borrows them in place is dropped),
/// the tensor's whole pages of the file mapping are released ([`Backing::release`]). Formats used in
/// place (f32/bf16/f16 rows borrowed from the mapping) keep their view, so their pages stay.
pub(super) struct View {
    pub(super) backing: Owner,
    pub(super) offset: usize,
    pub(super) len: usize,
}

impl AsRef<[u8]> for View {
    fn as_ref(&self) -> &[u8] {
        &(*self.backing).as_ref()[self.offset..self.offset + self.len]
    }
}

impl Drop for View {
    fn drop(&mut self) {
        self.backing.release(self.offset, self.len);
    }
}

/// A byte range of a shared owner (mmap or owned buffer).
#[derive(Clone)]
pub(super) struct Bytes {
    pub(super) owner: Owner,
    pub(super) offset: usize,
    pub(super) len: usize,
}

impl Bytes {
    pub(super) fn as_slice(&self) -> &[u8] {
        &(*self.owner).as_ref()[self.offset..self.offset + self.len]
    }
    pub(super) fn sub(&self, off: usize, len: usize) -> Bytes {
        debug_assert!(off + len <= self.len);
        Bytes {
            owner: self.owner.clone(),
            offset: self.offset + off,
            len,
        }
    }
    /// The bytes as kernel storage, through a [`View`] that releases the mapped pages when the
    /// storage is dropped.
    pub(super) fn storage(&self) -> Storage {
        let view: Arc<dyn AsRef<[u8]> + Send + Sync> = Arc::new(View {
            backing: self.owner.clone(),
            offset: self.offset,
            len: self.len,
        });
        Storage::from_shared(view, 0, self.len).expect("a view covers its own range")
    }
    /// Read this range's mapped pages in ahead of use ([`Backing::prefetch`]).
    pub(super) fn prefetch(&self) {
        self.owner.prefetch(self.offset, self.len);
    }
    /// Give this range's mapped pages back (after the bytes were copied out).
    pub(super) fn release(&self) {
        self.owner.release(self.offset, self.len);
    }
    pub(super) fn owned(v: Vec<u8>) -> Bytes {
        let len = v.len();
        Bytes {
            owner: Backing::owned(v),
            offset: 0,
            len,
        }
    }
}

/// Open `path` read-only and map it.
pub(super) fn map_file(path: &Path) -> Result<Owner, CheckpointError> {
    let io = |source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    if len == 0 {
        return Err(CheckpointError::Malformed {
            path: path.to_path_buf(),
            kind: Malformed::Truncated {
                at: 0,
                needed: 8,
                len: 0,
            },
        });
    }
    // SAFETY: the file is opened read-only; like every mmap-based loader we rely on the checkpoint
    // not being truncated or rewritten by another process while it is mapped.
    let mmap = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
    Ok(Arc::new(Backing {
        kind: BackingKind::Map(mmap),
        released: AtomicUsize::new(0),
    }))
}
