//! What [`super::Conv1d`] and [`super::ConvTranspose1d`] share: the argument checks and the public
//! entry points (a macro, expanded in each type's `impl`).

use crate::KernelError;

pub(super) fn bad(msg: String) -> KernelError {
    KernelError::BadShape(msg)
}

/// The public entry points and the argument checks shared by [`Conv1d`] and
/// [`ConvTranspose1d`] (both have `in_ch`, `out_ch`, `out_len`, a private
/// `run(table, input, t_in, t_out, output, pool)` and a private scalar
/// `reference(input, t_in, t_out, output)`).
macro_rules! entry_points {
    ($what:literal, $doc:literal) => {
        /// The checks both constructors make once the sizes are known to be non-zero: channels
        /// divisible by `groups`, a weight of `weight_len` values and a bias of `out_ch` values.
        /// Returns the bias, zeros when none is given.
        fn checked_bias(
            (in_ch, out_ch, groups): (usize, usize, usize),
            weight: &[f32],
            weight_len: usize,
            bias: Option<Vec<f32>>,
        ) -> Result<Vec<f32>, KernelError> {
            if !in_ch.is_multiple_of(groups) || !out_ch.is_multiple_of(groups) {
                return Err(bad(format!(
                    "{} channels {in_ch}/{out_ch} not divisible by groups {groups}",
                    $what
                )));
            }
            crate::check_len(concat!($what, " weight"), weight_len, weight.len())?;
            match bias {
                Some(b) => {
                    crate::check_len(concat!($what, " bias"), out_ch, b.len())?;
                    Ok(b)
                }
                None => Ok(vec![0.0; out_ch]),
            }
        }

        /// Input channels.
        pub fn in_channels(&self) -> usize {
            self.in_ch
        }
        /// Output channels.
        pub fn out_channels(&self) -> usize {
            self.out_ch
        }
        /// Kernel size.
        pub fn kernel_size(&self) -> usize {
            self.k
        }
        /// Stride.
        pub fn stride(&self) -> usize {
            self.stride
        }
        /// Groups.
        pub fn groups(&self) -> usize {
            self.groups
        }

        /// `(t_in, t_out)` of a call of `m` streams side by side (`forward_streams`).
        fn stream_dims(
            &self,
            input: &[f32],
            m: usize,
            output: &[f32],
        ) -> Result<(usize, usize), KernelError> {
            if m == 0 || !input.len().is_multiple_of(self.in_ch * m) {
                return Err(bad(format!(
                    "{} input of {} values for {} channels × {m} streams",
                    $what,
                    input.len(),
                    self.in_ch
                )));
            }
            let t_in = input.len() / (self.in_ch * m);
            let t_out = self.out_len(t_in);
            crate::check_len(
                concat!($what, " output"),
                self.out_ch * m * t_out,
                output.len(),
            )?;
            Ok((t_in, t_out))
        }

        fn dims(&self, input: &[f32], output: &[f32]) -> Result<(usize, usize), KernelError> {
            if !input.len().is_multiple_of(self.in_ch) {
                return Err(bad(format!(
                    "{} input of {} values for {} channels",
                    $what,
                    input.len(),
                    self.in_ch
                )));
            }
            let t_in = input.len() / self.in_ch;
            let t_out = self.out_len(t_in);
            crate::check_len(concat!($what, " output"), self.out_ch * t_out, output.len())?;
            Ok((t_in, t_out))
        }

        #[doc = $doc]
        /// on the calling thread. Returns `t_out`.
        pub fn forward(&self, input: &[f32], output: &mut [f32]) -> Result<usize, KernelError> {
            self.forward_with(arch::active(), input, output, None)
        }

        /// Like [`Self::forward`], split over the pool's threads.
        pub fn forward_pool(
            &self,
            input: &[f32],
            output: &mut [f32],
            pool: &Pool,
        ) -> Result<usize, KernelError> {
            self.forward_with(arch::active(), input, output, Some(pool))
        }

        /// The same GEMM path with the scalar micro-kernel (reference for the SIMD kernel).
        pub fn forward_scalar_gemm(
            &self,
            input: &[f32],
            output: &mut [f32],
        ) -> Result<usize, KernelError> {
            self.forward_with(arch::table(KernelSet::Scalar), input, output, None)
        }

        /// [`Self::forward`] with the kernels of an explicit set, on `pool` when given. Refuses
        /// a set this CPU cannot run ([`KernelError::Unsupported`]).
        pub fn forward_kernel(
            &self,
            kernel: KernelSet,
            input: &[f32],
            output: &mut [f32],
            pool: Option<&Pool>,
        ) -> Result<usize, KernelError> {
            self.forward_with(arch::checked_table(kernel)?, input, output, pool)
        }

        /// Plain scalar definition (direct loops) for tests.
        pub fn forward_reference(
            &self,
            input: &[f32],
            output: &mut [f32],
        ) -> Result<usize, KernelError> {
            let (t_in, t_out) = self.dims(input, output)?;
            self.reference(input, t_in, t_out, output);
            Ok(t_out)
        }

        fn forward_with(
            &self,
            kern: &Kernels,
            input: &[f32],
            output: &mut [f32],
            pool: Option<&Pool>,
        ) -> Result<usize, KernelError> {
            let (t_in, t_out) = self.dims(input, output)?;
            self.run(kern, input, t_in, t_out, output, pool);
            Ok(t_out)
        }
    };
}

pub(super) use entry_points;
