//! Kernel micro-benchmark (filled in below).
