//! Mimi frame timing at released dimensions with synthetic weights.
//!
//! `cargo run --release -p moshi-bench --example mimi_bench -- [frames] [rounds] [stages] [bf16]`
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let frames: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(20);
    let rounds: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(3);
    let opts = model::mimi::MimiOptions {
        bf16_transformers: args.iter().any(|a| a == "bf16"),
    };
    if args.iter().any(|a| a == "stages") {
        let mimi = bench::mimi::synthetic_mimi_with(8, 42, &opts)?;
        println!("options: {opts:?}");
        for threads in [1usize, 2] {
            let pool = (threads > 1).then(|| model::mimi::Pool::new(threads));
            let _ = bench::mimi::stage_breakdown(&mimi, 2, pool.as_ref())?;
            println!("{threads} thread(s):");
            for (n, ms) in bench::mimi::stage_breakdown(&mimi, frames, pool.as_ref())? {
                println!("{n:>16}: {ms:7.2} ms/frame");
            }
        }
        return Ok(());
    }
    print!("{}", bench::mimi::run(frames, rounds, &[1, 2])?);
    Ok(())
}
