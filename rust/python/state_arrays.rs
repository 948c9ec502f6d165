//! Checkpoint arrays read straight into the engines' memory.

use ndarray::{Array, Dimension};
use pyo3::exceptions::{PyMemoryError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::common::*;
use crate::fork::Mutex;
use crate::scalar::Real;
use crate::state::StateValue;

// ---- checkpoint arrays read straight into the engines' memory ----
// `onlinefa.checkpoint` streams each float array of a checkpoint into a `StateArray`; an engine's
// `from_state` then moves the vector into the model instead of copying it, so loading peaks at about
// 1× the state instead of 3× (Python copy, state-map copy, model copy).

/// A float32/float64 array of a checkpoint, filled in chunks by `write` and moved (not copied) into the
/// engine by the first `from_state` that reads it.
#[pyclass(frozen, module = "onlinefa._core")]
pub struct StateArray {
    value: Mutex<Option<StateValue>>,
    shape: Vec<usize>,
    dtype: &'static str,
}

/// A zero-filled vector of `len` items; MemoryError instead of an abort when it cannot be allocated.
pub(crate) fn zeroed_vec<T: Clone + Default>(len: usize) -> PyResult<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len)
        .map_err(|_| PyMemoryError::new_err(format!("cannot allocate a state array of {len} items")))?;
    v.resize(len, T::default());
    Ok(v)
}

/// The bytes of a float vector (every bit pattern is a valid float).
pub(crate) fn float_bytes_mut<T: Real>(v: &mut [T]) -> &mut [u8] {
    let len = std::mem::size_of_val(v);
    // SAFETY: f32/f64 are plain old data without padding; any byte pattern is a valid value, and the
    // returned slice borrows `v` mutably for its whole lifetime.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), len) }
}

impl StateArray {
    /// Move the filled array out (converted from little-endian); ValueError if it was taken already.
    pub(crate) fn take(&self, key: &str) -> PyResult<StateValue> {
        let value = lock(&self.value)?.take();
        let value = value.ok_or_else(|| {
            PyValueError::new_err(format!(
                "invalid state: entry `{key}` was already used by another model"
            ))
        })?;
        Ok(match value {
            StateValue::F32(s, d) if cfg!(target_endian = "big") => StateValue::F32(
                s,
                d.into_iter()
                    .map(|v| f32::from_bits(u32::from_le(v.to_bits())))
                    .collect(),
            ),
            StateValue::F64(s, d) if cfg!(target_endian = "big") => StateValue::F64(
                s,
                d.into_iter()
                    .map(|v| f64::from_bits(u64::from_le(v.to_bits())))
                    .collect(),
            ),
            other => other,
        })
    }
}

#[pymethods]
impl StateArray {
    /// A zero-filled array of `dtype` ("float32" or "float64") and `shape`.
    #[new]
    fn new(dtype: &str, shape: Vec<usize>) -> PyResult<Self> {
        let len = shape
            .iter()
            .try_fold(1usize, |acc, &n| acc.checked_mul(n))
            .ok_or_else(|| PyValueError::new_err(format!("state array shape {shape:?} is too large")))?;
        let (value, dtype) = match dtype {
            "float32" => (StateValue::F32(shape.clone(), zeroed_vec(len)?), "float32"),
            "float64" => (StateValue::F64(shape.clone(), zeroed_vec(len)?), "float64"),
            other => {
                return Err(PyValueError::new_err(format!(
                    "state arrays are float32 or float64, got {other:?}"
                )))
            }
        };
        Ok(StateArray {
            value: Mutex::new(Some(value)),
            shape,
            dtype,
        })
    }

    /// Copy `data` (little-endian item bytes) to byte `offset` of the array.
    fn write(&self, offset: usize, data: &[u8]) -> PyResult<()> {
        let mut guard = lock(&self.value)?;
        let bytes = match guard.as_mut() {
            Some(StateValue::F32(_, v)) => float_bytes_mut(v),
            Some(StateValue::F64(_, v)) => float_bytes_mut(v),
            _ => return Err(PyValueError::new_err("the state array was already used")),
        };
        let end = offset
            .checked_add(data.len())
            .filter(|&end| end <= bytes.len())
            .ok_or_else(|| PyValueError::new_err("write past the end of the state array"))?;
        bytes[offset..end].copy_from_slice(data);
        Ok(())
    }

    #[getter]
    fn shape(&self) -> Vec<usize> {
        self.shape.clone()
    }

    #[getter]
    fn dtype(&self) -> &'static str {
        self.dtype
    }

    /// Size of the data in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        let item = if self.dtype == "float32" { 4 } else { 8 };
        self.shape.iter().product::<usize>() * item
    }
}

/// The float64 array of a `StateArray` entry `key`, taken without a copy (None for any other value).
pub(crate) fn adopted_f64(state: &Bound<'_, PyDict>, key: &str) -> PyResult<Option<ndarray::ArrayD<f64>>> {
    let Some(value) = state.get_item(key)? else {
        return Ok(None);
    };
    let Ok(array) = value.cast::<StateArray>() else {
        return Ok(None);
    };
    match array.get().take(key)? {
        StateValue::F64(shape, data) => ndarray::ArrayD::from_shape_vec(shape, data)
            .map(Some)
            .map_err(|e| PyValueError::new_err(format!("invalid state: entry `{key}`: {e}"))),
        _ => Err(PyValueError::new_err(format!(
            "invalid state: entry `{key}` must be float64"
        ))),
    }
}

/// `a` with `D` dimensions (ValueError naming `key` otherwise).
pub(crate) fn into_dim<D: Dimension>(a: ndarray::ArrayD<f64>, key: &str) -> PyResult<Array<f64, D>> {
    a.into_dimensionality::<D>().map_err(|_| {
        PyValueError::new_err(format!(
            "invalid state: entry `{key}` has the wrong number of dimensions"
        ))
    })
}
