//! The state-map conversion between the engines and Python (dicts of NumPy arrays and scalars), and
//! checkpoint arrays read straight into the engines' memory.

use ndarray::{Array, Dimension};
use numpy::{PyArray1, PyArrayDyn, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::exceptions::{PyMemoryError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyString};

use super::common::*;
use crate::fork::Mutex;
use crate::scalar::Real;
use crate::state::{Adoptable, StateMap, StateValue};

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

/// Convert a checkpoint map to a dict of NumPy arrays and Python scalars.
pub(crate) fn state_to_dict<'py>(py: Python<'py>, state: StateMap) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    for (key, value) in state {
        match value {
            StateValue::F32(shape, data) => dict.set_item(key, PyArray1::from_vec(py, data).reshape(shape)?)?,
            StateValue::F64(shape, data) => dict.set_item(key, PyArray1::from_vec(py, data).reshape(shape)?)?,
            StateValue::Int(v) => dict.set_item(key, v)?,
            StateValue::Float(v) => dict.set_item(key, v)?,
            StateValue::Bool(v) => dict.set_item(key, v)?,
            StateValue::Text(v) => dict.set_item(key, v)?,
            StateValue::Adopted(_) => {
                return Err(PyValueError::new_err(format!("state entry `{key}` was not read out")));
            }
        }
    }
    Ok(dict)
}

/// The items of `a` in C order, reusing its buffer when it is laid out so (one copy of a state entry, not two).
pub(crate) fn into_vec<T: Clone, D: Dimension>(a: Array<T, D>) -> Vec<T> {
    if a.is_standard_layout() {
        let len = a.len();
        let (data, offset) = a.into_raw_vec_and_offset();
        if offset.unwrap_or(0) == 0 && data.len() == len {
            return data;
        }
        return data[offset.unwrap_or(0)..][..len].to_vec();
    }
    a.iter().cloned().collect()
}

/// Convert a dict written by `state_to_dict` (or read back from a checkpoint file) into a map.
pub(crate) fn dict_to_state(dict: &Bound<'_, PyDict>) -> PyResult<StateMap> {
    let mut state = StateMap::new();
    for (key, value) in dict.iter() {
        let key: String = key.extract()?;
        let entry = if value.is_instance_of::<PyBool>() {
            StateValue::Bool(value.extract()?)
        } else if value.is_instance_of::<PyInt>() {
            StateValue::Int(value.extract()?)
        } else if value.is_instance_of::<PyFloat>() {
            StateValue::Float(value.extract()?)
        } else if value.is_instance_of::<PyString>() {
            StateValue::Text(value.extract()?)
        } else if let Ok(a) = value.cast::<StateArray>() {
            StateValue::Adopted(Adoptable::new(a.get().take(&key)?))
        } else if let Ok(a) = value.cast::<PyArrayDyn<f64>>() {
            // One copy, which the model then adopts (moves) instead of copying it again.
            StateValue::Adopted(Adoptable::new(StateValue::F64(
                a.shape().to_vec(),
                into_vec(owned_copy(a)?),
            )))
        } else if let Ok(a) = value.cast::<PyArrayDyn<f32>>() {
            StateValue::Adopted(Adoptable::new(StateValue::F32(
                a.shape().to_vec(),
                into_vec(owned_copy(a)?),
            )))
        } else {
            return Err(PyValueError::new_err(format!(
                "invalid state: entry `{key}` must be a float32/float64 array or a Python scalar"
            )));
        };
        state.insert(key, entry);
    }
    Ok(state)
}
