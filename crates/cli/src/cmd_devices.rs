//! `moshi-native devices`: the GPU adapters wgpu finds, their numbers for `--gpu N`, and what
//! `--device auto` would take.

use anyhow::Result;
use clap::Args;

/// Flags of `devices` (none).
#[derive(Args, Debug)]
pub struct DevicesArgs {}

/// Lists the adapters.
pub fn run(_a: &DevicesArgs) -> Result<()> {
    let list = crate::loader_noise::quiet(gpu::adapters);
    if list.is_empty() {
        println!("no GPU adapter (Vulkan, Metal or DX12): --device auto runs on the CPU");
        return Ok(());
    }
    let auto = gpu::choose_adapter(&list, gpu::AdapterChoice::Auto)?;
    for a in &list {
        let mark = if Some(a.index) == auto {
            "  <- --device auto"
        } else {
            ""
        };
        println!("{a}{mark}");
    }
    if auto.is_none() {
        println!("--device auto runs on the CPU (no discrete or integrated GPU; software adapters are not taken)");
    }
    Ok(())
}
