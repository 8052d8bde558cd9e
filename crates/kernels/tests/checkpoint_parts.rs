//! `CheckpointParts` read straight from on-disk bytes equal the parts un-packed from the matrix the
//! CPU builds from the same bytes, for every format: a device loading from the checkpoint uploads
//! exactly what it uploaded when it went through the CPU matrix.

use kernels::quant::{encode_q4_0, encode_q8_0};
use kernels::{CheckpointParts, Matrix, Storage, WeightFormat};
use testkit::rng::values;

#[test]
fn parts_from_bytes_are_the_unpacked_matrix() {
    // 20 rows: two whole 8-row tiles and a partial one.
    let (rows, cols) = (20, 96);
    let v = values(7, rows * cols);
    let half = |f: fn(f32) -> [u8; 2]| -> Vec<u8> { v.iter().flat_map(|&x| f(x)).collect() };
    let dense: [(WeightFormat, Vec<u8>); 5] = [
        (
            WeightFormat::F32,
            v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        ),
        (
            WeightFormat::Bf16,
            half(|x| half::bf16::from_f32(x).to_le_bytes()),
        ),
        (
            WeightFormat::F16,
            half(|x| half::f16::from_f32(x).to_le_bytes()),
        ),
        (WeightFormat::Q8_0, encode_q8_0(&v).unwrap()),
        (WeightFormat::Q4_0, encode_q4_0(&v).unwrap()),
    ];
    for (format, bytes) in dense {
        let m = Matrix::from_bytes(format, rows, cols, Storage::from_vec(bytes.clone())).unwrap();
        let parts = CheckpointParts::from_bytes(format, rows, cols, &bytes).unwrap();
        assert_eq!(parts, m.checkpoint_parts(), "{format:?}");
        // A byte short is refused, not read past.
        assert!(CheckpointParts::from_bytes(format, rows, cols, &bytes[1..]).is_err());
    }
    for (bits, group) in [(4u8, 32usize), (8, 32), (4, 96)] {
        let (m, [c, s, b]) = testkit::mlx_matrix(bits, group, rows, cols, &v);
        let parts = CheckpointParts::from_mlx(bits, group, rows, cols, &c, &s, &b).unwrap();
        assert_eq!(
            parts,
            m.checkpoint_parts(),
            "mlx {bits} bits, groups of {group}"
        );
        assert!(CheckpointParts::from_mlx(bits, group, rows, cols, &c, &s, &b[2..]).is_err());
    }
}
