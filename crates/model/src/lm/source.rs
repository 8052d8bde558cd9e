//! Where LM tensors come from: a checkpoint ([`Weights`]), or (tests, feature `testing`) any source
//! dequantized to f32 (`DequantizedSource`). Synthetic random weights are `bench::lm::SyntheticSource`
//! (crate `moshi-bench`).

use std::ops::Range;

use kernels::{CheckpointParts, Matrix, WeightFormat};

use super::table::MatrixRef;
use super::LmError;
use crate::checkpoint::Weights;

/// The results of a [`TensorSource`].
pub(super) type Result<T> = std::result::Result<T, LmError>;

/// A provider of named LM tensors (canonical Kyutai PyTorch names). The loader states the shape
/// it expects; implementations return a typed error on a mismatch.
pub trait TensorSource {
    /// The whole matrix `name` of shape `[rows, cols]`.
    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Matrix>;
    /// Rows `take` of the matrix `name` of shape `[rows, cols]` (per-step slices of the stacked
    /// Depformer attention weights).
    fn matrix_rows(&self, name: &str, shape: [usize; 2], take: Range<usize>) -> Result<Matrix>;
    /// A vector of `len` values (norm weights; `[1, 1, len]` tensors are accepted).
    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>>;

    /// The matrix `m` of the weight table, for the CPU kernels.
    fn load(&self, m: &MatrixRef) -> Result<Matrix> {
        match &m.take {
            None => self.matrix(&m.name, m.shape[0], m.shape[1]),
            Some(take) => self.matrix_rows(&m.name, m.shape, take.clone()),
        }
    }

    /// The matrix `m` in its checkpoint layout, for a device that packs it itself. By default the
    /// CPU matrix un-packed ([`Matrix::checkpoint_parts`]); a checkpoint ([`Weights`]) reads its
    /// bytes directly, building no CPU matrix.
    fn checkpoint_parts(&self, m: &MatrixRef) -> Result<(WeightFormat, CheckpointParts)> {
        let mat = self.load(m)?;
        Ok((mat.format(), mat.checkpoint_parts()))
    }
}

pub(super) fn shape_err(name: &str, expected: &[usize], got: &[usize]) -> LmError {
    LmError::Shape {
        name: name.to_string(),
        expected: expected.to_vec(),
        got: got.to_vec(),
    }
}

impl TensorSource for Weights {
    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Matrix> {
        let m = Weights::matrix(self, name)?;
        if m.rows() != rows || m.cols() != cols {
            return Err(shape_err(name, &[rows, cols], &[m.rows(), m.cols()]));
        }
        Ok(m)
    }

    fn matrix_rows(&self, name: &str, shape: [usize; 2], take: Range<usize>) -> Result<Matrix> {
        let ([rows, cols], start, n) = (shape, take.start, take.len());
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

    fn checkpoint_parts(&self, m: &MatrixRef) -> Result<(WeightFormat, CheckpointParts)> {
        let [rows, cols] = m.shape;
        let take = m.take.clone().unwrap_or(0..rows);
        let shape = self.shape(&m.name).map(|s| s.to_vec()).unwrap_or_default();
        let flat_cols: usize = shape.iter().skip(1).product();
        if shape.first() != Some(&rows) || flat_cols != cols || take.end > rows {
            return Err(shape_err(&m.name, &[rows, cols], &shape));
        }
        Ok(Weights::checkpoint_parts(
            self,
            &m.name,
            take.start,
            take.len(),
        )?)
    }

    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        let (v, shape) = Weights::f32(self, name)?;
        if v.len() != len {
            return Err(shape_err(name, &[1, 1, len], &shape));
        }
        Ok(v)
    }
}

/// Every matrix of another source dequantized to f32: a run on it isolates loading and name mapping
/// from the kernels' activation quantization (tests; feature `testing`).
#[cfg(any(test, feature = "testing"))]
#[derive(Debug, Clone, Copy)]
pub struct DequantizedSource<'a, S: ?Sized>(pub &'a S);

#[cfg(any(test, feature = "testing"))]
impl<S: TensorSource + ?Sized> DequantizedSource<'_, S> {
    fn dequantize(m: Matrix) -> Result<Matrix> {
        let (r, c) = (m.rows(), m.cols());
        let mut v = vec![0.0; r * c];
        for (i, row) in v.chunks_exact_mut(c).enumerate() {
            m.row_f32(i, row);
        }
        Ok(Matrix::from_f32(r, c, v)?)
    }
}

#[cfg(any(test, feature = "testing"))]
impl<S: TensorSource + ?Sized> TensorSource for DequantizedSource<'_, S> {
    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Matrix> {
        Self::dequantize(self.0.matrix(name, rows, cols)?)
    }

    fn matrix_rows(&self, name: &str, shape: [usize; 2], take: Range<usize>) -> Result<Matrix> {
        Self::dequantize(self.0.matrix_rows(name, shape, take)?)
    }

    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        self.0.vector(name, len)
    }
}
