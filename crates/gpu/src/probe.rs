//! Device memory bandwidth for the roofline of the GPU benchmarks: a copy kernel (each thread a
//! grid-stride loop of 16-byte words) over a buffer well above the device's caches, timed on the
//! host from submission to completion, as GB/s of bytes read plus written.

use std::time::Instant;

use crate::context::GpuContext;
use crate::dispatch::{Dispatch, Grid};
use crate::shaders::Module;
use crate::uniforms::CopyParams;
use crate::GpuError;

/// Workgroups of one copy (enough to fill any current GPU; the loop covers the rest).
const COPY_GROUPS: u32 = 4096;

/// Two device buffers of the same size and the recorded copy between them.
#[derive(Debug)]
pub struct BandwidthProbe {
    ctx: GpuContext,
    bytes: u64,
    copy: Dispatch,
    src: wgpu::Buffer,
    dst: wgpu::Buffer,
}

impl BandwidthProbe {
    /// A probe copying `mib` MiB (at most the device's largest binding, a multiple of 16 bytes).
    pub fn new(ctx: &GpuContext, mib: usize) -> Result<BandwidthProbe, GpuError> {
        let bytes = ((mib as u64) << 20).min(ctx.max_binding()) / 16 * 16;
        if bytes == 0 {
            return Err(GpuError::Unsupported {
                format: format!("a bandwidth probe of {mib} MiB"),
                why: "the probe needs at least 16 bytes".into(),
            });
        }
        let usage = wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_DST
            | wgpu::BufferUsages::COPY_SRC;
        let src = ctx.buffer("probe_src", bytes, usage)?;
        let dst = ctx.buffer("probe_dst", bytes, usage)?;
        let words = (bytes / 16) as u32;
        let uni = ctx.uniform("probe", &CopyParams { n: words }.bytes());
        let copy = Dispatch {
            pipeline: ctx.pipeline(Module::Copy),
            bind: ctx.bind(Module::Copy, &[&uni, &src, &dst]),
            grid: Grid::PerRow(COPY_GROUPS.min(words.div_ceil(256))),
            _uniform: uni,
        };
        Ok(BandwidthProbe {
            ctx: ctx.clone(),
            bytes,
            copy,
            src,
            dst,
        })
    }

    /// Bytes of one buffer (a pass reads and writes this many).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Fills the source with `words` repeated (tests).
    pub fn fill_source(&self, words: &[u32]) {
        let bytes: Vec<u8> = words
            .iter()
            .cycle()
            .take((self.bytes / 4) as usize)
            .flat_map(|w| w.to_le_bytes())
            .collect();
        self.ctx.queue().write_buffer(&self.src, 0, &bytes);
    }

    /// The destination's first `n` words (tests).
    pub fn read_destination(&self, n: usize) -> Result<Vec<u32>, GpuError> {
        let len = ((n * 4) as u64).min(self.bytes);
        let rb = self.ctx.buffer(
            "probe_readback",
            len.max(4),
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        )?;
        let mut enc = self
            .ctx
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        enc.copy_buffer_to_buffer(&self.dst, 0, &rb, 0, len);
        self.ctx.submit(enc.finish());
        let mut out = vec![0f32; len as usize / 4];
        crate::context::read_mapped(&self.ctx, &rb, &mut out)?;
        Ok(out.iter().map(|v| v.to_bits()).collect())
    }

    /// One timed copy: GB/s of the bytes read and written (2 × [`BandwidthProbe::bytes`]), from
    /// submission to completion.
    pub fn measure(&self) -> Result<f64, GpuError> {
        let mut enc = self
            .ctx
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
            self.copy.record(&mut pass, 1);
        }
        let t = Instant::now();
        self.ctx.submit(enc.finish());
        self.ctx.wait()?;
        let s = t.elapsed().as_secs_f64();
        Ok(2.0 * self.bytes as f64 / s / 1e9)
    }
}
