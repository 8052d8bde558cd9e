//! Where LM tensors come from: a checkpoint ([`Weights`]), or (feature `bench`) synthetic random
//! values (`SyntheticSource`, in `synthetic.rs`).

use kernels::Matrix;

use super::LmError;
use crate::checkpoint::Weights;

/// A provider of named LM tensors (canonical Kyutai PyTorch names). The loader states the shape
/// it expects; implementations return a typed error on a mismatch.
pub trait TensorSource {
    /// The whole matrix `name` of shape `[rows, cols]`.
    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Matrix, LmError>;
    /// Rows `start..start + n` of the matrix `name` of shape `[rows, cols]` (per-step slices of the
    /// stacked Depformer attention weights).
    fn matrix_rows(
        &self,
        name: &str,
        rows: usize,
        cols: usize,
        start: usize,
        n: usize,
    ) -> Result<Matrix, LmError>;
    /// A vector of `len` values (norm weights; `[1, 1, len]` tensors are accepted).
    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, LmError>;
}

pub(super) fn shape_err(name: &str, expected: &[usize], got: &[usize]) -> LmError {
    LmError::Shape {
        name: name.to_string(),
        expected: expected.to_vec(),
        got: got.to_vec(),
    }
}

impl TensorSource for Weights {
    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Matrix, LmError> {
        let m = Weights::matrix(self, name)?;
        if m.rows() != rows || m.cols() != cols {
            return Err(shape_err(name, &[rows, cols], &[m.rows(), m.cols()]));
        }
        Ok(m)
    }

    fn matrix_rows(
        &self,
        name: &str,
        rows: usize,
        cols: usize,
        start: usize,
        n: usize,
    ) -> Result<Matrix, LmError> {
        let shape = self.shape(name).map(|s| s.to_vec()).unwrap_or_default();
        let flat_cols: usize = shape.iter().skip(1).product();
        if shape.first() != Some(&rows) || flat_cols != cols || start + n > rows {
            return Err(shape_err(name, &[rows, cols], &shape));
        }
        let m = Weights::matrix_rows(self, name, start, n)?;
        if m.rows() != n || m.cols() != cols {
            return Err(shape_err(name, &[n, cols], &[m.rows(), m.cols()]));
        }
        Ok(m)
    }

    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, LmError> {
        let (v, shape) = Weights::f32(self, name)?;
        if v.len() != len {
            return Err(shape_err(name, &[1, 1, len], &shape));
        }
        Ok(v)
    }
}
