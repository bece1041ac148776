//! The part of ndarray's API that the seed's kv_cache.rs uses: `Array4::from_shape_vec`, a
//! 4-D array over a row-major Vec. Written for this replay; the seed's get_layer_as_onnx is
//! the only caller and the replay never calls it.

/// A row-major 4-D array.
#[derive(Debug, Clone, PartialEq)]
pub struct Array4<T> {
    shape: [usize; 4],
    data: Vec<T>,
}

/// The shape did not match the data's length.
#[derive(Debug)]
pub struct ShapeError;

impl<T> Array4<T> {
    /// As ndarray's: Err unless the shape's product is `data.len()`.
    pub fn from_shape_vec(
        shape: (usize, usize, usize, usize),
        data: Vec<T>,
    ) -> Result<Self, ShapeError> {
        let (a, b, c, d) = shape;
        if a * b * c * d != data.len() {
            return Err(ShapeError);
        }
        Ok(Self {
            shape: [a, b, c, d],
            data,
        })
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    pub fn as_slice(&self) -> Option<&[T]> {
        Some(&self.data)
    }
}
