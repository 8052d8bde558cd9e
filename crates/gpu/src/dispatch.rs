//! One recorded kernel launch ([`Dispatch`]) and how many workgroups it runs ([`Grid`]): every
//! kernel of the backend is recorded through [`Dispatch::record`], so a profiler or a change of
//! launch shape has one place to look.

/// How many workgroups a dispatch runs.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Grid {
    /// `r` workgroups over a matrix's rows (the matmul's: [`crate::shaders::MATMUL_ROWS`] rows
    /// each), folded into 2-D past the 65 535 limit of one dimension: the kernel numbers its
    /// workgroups `x + y · width` and skips those past the end.
    Rows(u32),
    /// `x` workgroups for each active row (`y` = rows of the step).
    PerRow(u32),
    /// A fixed `x` times the active rows.
    HeadsPerRow(u32),
}

/// One recorded kernel launch, created at load.
#[derive(Debug)]
pub(crate) struct Dispatch {
    pub(crate) pipeline: std::sync::Arc<wgpu::ComputePipeline>,
    pub(crate) bind: wgpu::BindGroup,
    pub(crate) grid: Grid,
    pub(crate) _uniform: wgpu::Buffer,
}

impl Dispatch {
    /// Records the launch for `n` active rows.
    pub(crate) fn record(&self, pass: &mut wgpu::ComputePass<'_>, n: u32) {
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, &self.bind, &[]);
        let (x, y) = match self.grid {
            Grid::Rows(r) => {
                let x = r.min(32768);
                (x, r.div_ceil(x))
            }
            Grid::PerRow(x) | Grid::HeadsPerRow(x) => (x, n),
        };
        let mark = crate::profile::before(pass, &self.pipeline, &self.bind, [x, y, 1]);
        pass.dispatch_workgroups(x, y, 1);
        crate::profile::after(pass, mark);
    }
}
