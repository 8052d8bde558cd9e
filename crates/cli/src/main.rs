//! The `moshi-native` binary.

fn main() -> anyhow::Result<()> {
    println!("moshi-native {}", env!("CARGO_PKG_VERSION"));
    Ok(())
}
