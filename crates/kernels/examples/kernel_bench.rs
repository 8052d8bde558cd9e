//! Kernel microbenchmark:
//! `cargo run --release -p moshi-kernels --example kernel_bench [rounds] [working_set_mb] [matvec|conv|hot|pool|attn|all]`.

fn main() {
    let mut args = std::env::args().skip(1);
    let mut opts = kernels::bench::BenchOptions::default();
    if let Some(r) = args.next().and_then(|a| a.parse().ok()) {
        opts.rounds = r;
    }
    if let Some(w) = args.next().and_then(|a| a.parse().ok()) {
        opts.working_set_mb = w;
    }
    let what = args.next().unwrap_or_else(|| "all".into());
    eprintln!("simd level: {:?}; options: {opts:?}", kernels::kernel_set());
    if what == "all" || what == "conv" {
        let rows = kernels::bench::run_mimi_convs(&opts.threads, opts.rounds * 3);
        println!("| Mimi SEANet convs per frame | threads | ms median | ms min–max | GFLOP/s |\n|---|---|---|---|---|");
        for r in rows {
            println!(
                "| encoder+decoder | {} | {:.2} | {:.2}–{:.2} | {:.1} |",
                r.threads, r.ms_median, r.ms_range.0, r.ms_range.1, r.gflops
            );
        }
        println!();
    }
    if what == "all" || what == "pool" {
        let (wm, w9, im, i9) = kernels::bench::run_pool_latency(2, 2000);
        println!("| pool hand-off, 2 threads | median µs | p90 µs |\n|---|---|---|");
        println!("| back to back (worker spinning) | {wm:.2} | {w9:.2} |\n| after 2 ms idle (worker parked) | {im:.2} | {i9:.2} |\n");
    }
    if what == "all" || what == "attn" {
        let rows = kernels::bench::run_attention(3000, 8, opts.rounds);
        println!("| attention, 32 layers × 32 heads × 128, window 3000, 1 thread | path | ms median | ms min–max | KV GB/s |\n|---|---|---|---|---|");
        for r in rows {
            println!(
                "| {:?} | {} | {:.1} | {:.1}–{:.1} | {:.1} |",
                r.dtype, r.path, r.ms_per_frame, r.range.0, r.range.1, r.gbps
            );
        }
        println!();
    }
    if what == "all" || what == "hot" {
        if kernels::KernelSet::Avx512.available() {
            println!("hot kernels, AVX-512 (zmm VNNI pair kernels):");
            let rows = kernels::bench::run_hot(&opts.formats, &[1, 2, 4, 8], opts.rounds);
            println!("{}", kernels::bench::markdown_hot(&rows));
            kernels::set_avx512_allowed(false);
        }
        let vnni = kernels::KernelSet::Avx2Vnni.available();
        println!(
            "hot kernels, AVX-VNNI {}:",
            if vnni {
                "on"
            } else {
                "off (not available or disabled)"
            }
        );
        let rows = kernels::bench::run_hot(&opts.formats, &[1, 2, 4, 8], opts.rounds);
        println!("{}", kernels::bench::markdown_hot(&rows));
        if vnni {
            kernels::set_vnni_allowed(false);
            println!("hot kernels, AVX-VNNI off (plain AVX2 vpmaddubsw):");
            let rows = kernels::bench::run_hot(&opts.formats, &[1, 2, 4, 8], opts.rounds);
            println!("{}", kernels::bench::markdown_hot(&rows));
            kernels::set_vnni_allowed(true);
        }
        kernels::set_avx512_allowed(true);
    }
    if what == "all" || what == "matvec" {
        let rows = kernels::bench::run(&opts, &|s| eprintln!("{s}"));
        println!("{}", kernels::bench::markdown(&rows));
    }
}
