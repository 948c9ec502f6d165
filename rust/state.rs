//! Checkpoint state: every model converts itself to and from a flat map of named arrays and scalars.
//!
//! The map is what the Python layer writes into a versioned `.npz` file, so a resumed model is
//! bit-identical to one that never stopped. `from_state` checks every length, dtype and value, and
//! returns [`FaError::InvalidState`] for anything inconsistent — never a silently wrong model.

use std::collections::BTreeMap;

use ndarray::{Array1, Array2};

use crate::error::{FaError, Result};
use crate::scalar::Real;

/// One entry of a state map.
#[derive(Debug, Clone, PartialEq)]
pub enum StateValue {
    /// float32 array with its shape.
    F32(Vec<usize>, Vec<f32>),
    /// float64 array with its shape.
    F64(Vec<usize>, Vec<f64>),
    /// Unsigned integer.
    Int(u64),
    /// Float scalar.
    Float(f64),
    /// Boolean.
    Bool(bool),
    /// Short string.
    Text(String),
}

/// Named state entries.
pub type StateMap = BTreeMap<String, StateValue>;

/// Models that can be checkpointed exactly.
pub trait Checkpoint: Sized {
    /// Name stored in the checkpoint ("OnlineEM", ...).
    const KIND: &'static str;
    /// Everything needed to continue exactly.
    fn to_state(&self) -> StateMap;
    /// Rebuild from [`Checkpoint::to_state`]'s output, validating it.
    fn from_state(state: &StateMap) -> Result<Self>;
}

/// Storage types that have a [`StateValue`] array variant.
pub trait StateReal: Real {
    /// Wrap a vector of this type.
    fn wrap(shape: Vec<usize>, data: Vec<Self>) -> StateValue;
    /// Unwrap a vector of this type (None if the entry holds another type).
    fn unwrap(value: &StateValue) -> Option<(&[usize], &[Self])>;
}

impl StateReal for f32 {
    fn wrap(shape: Vec<usize>, data: Vec<Self>) -> StateValue {
        StateValue::F32(shape, data)
    }
    fn unwrap(value: &StateValue) -> Option<(&[usize], &[Self])> {
        match value {
            StateValue::F32(s, d) => Some((s, d)),
            _ => None,
        }
    }
}

impl StateReal for f64 {
    fn wrap(shape: Vec<usize>, data: Vec<Self>) -> StateValue {
        StateValue::F64(shape, data)
    }
    fn unwrap(value: &StateValue) -> Option<(&[usize], &[Self])> {
        match value {
            StateValue::F64(s, d) => Some((s, d)),
            _ => None,
        }
    }
}

fn missing(key: &str) -> FaError {
    FaError::InvalidState(format!("entry `{key}` is missing or has the wrong type"))
}

/// Builder/reader helpers over a [`StateMap`].
pub struct StateReader<'a>(pub &'a StateMap);

impl StateReader<'_> {
    /// A stored array of `T` with exactly `shape`, all values finite.
    pub fn array<T: StateReal>(&self, key: &str, shape: &[usize]) -> Result<Vec<T>> {
        let (s, d) = self.0.get(key).and_then(T::unwrap).ok_or_else(|| missing(key))?;
        let len: usize = shape.iter().product();
        if s != shape || d.len() != len {
            return Err(FaError::InvalidState(format!(
                "entry `{key}` has shape {s:?}, expected {shape:?}"
            )));
        }
        if d.iter().any(|v| !v.to_f64().is_finite()) {
            return Err(FaError::InvalidState(format!(
                "entry `{key}` contains non-finite values"
            )));
        }
        Ok(d.to_vec())
    }

    /// A K×K (or any 2-D) float64 matrix.
    pub fn matrix(&self, key: &str, rows: usize, cols: usize) -> Result<Array2<f64>> {
        let v = self.array::<f64>(key, &[rows, cols])?;
        Array2::from_shape_vec((rows, cols), v).map_err(|e| FaError::InvalidState(e.to_string()))
    }

    /// A float64 vector.
    pub fn vector(&self, key: &str, len: usize) -> Result<Array1<f64>> {
        Ok(Array1::from(self.array::<f64>(key, &[len])?))
    }

    /// An integer.
    pub fn int(&self, key: &str) -> Result<u64> {
        match self.0.get(key) {
            Some(StateValue::Int(v)) => Ok(*v),
            _ => Err(missing(key)),
        }
    }

    /// A finite float.
    pub fn float(&self, key: &str) -> Result<f64> {
        match self.0.get(key) {
            Some(StateValue::Float(v)) if v.is_finite() => Ok(*v),
            _ => Err(missing(key)),
        }
    }

    /// A boolean.
    pub fn bool(&self, key: &str) -> Result<bool> {
        match self.0.get(key) {
            Some(StateValue::Bool(v)) => Ok(*v),
            _ => Err(missing(key)),
        }
    }

    /// A string.
    pub fn text(&self, key: &str) -> Result<&str> {
        match self.0.get(key) {
            Some(StateValue::Text(v)) => Ok(v),
            _ => Err(missing(key)),
        }
    }

    /// Whether `key` is present.
    pub fn has(&self, key: &str) -> bool {
        self.0.contains_key(key)
    }

    /// A usize stored as an integer.
    pub fn usize(&self, key: &str) -> Result<usize> {
        usize::try_from(self.int(key)?).map_err(|_| FaError::InvalidState(format!("entry `{key}` is too large")))
    }
}

/// Helpers to fill a [`StateMap`].
pub struct StateWriter(pub StateMap);

impl StateWriter {
    /// Empty map tagged with the model kind.
    pub fn new(kind: &str) -> Self {
        let mut m = StateMap::new();
        m.insert("kind".into(), StateValue::Text(kind.into()));
        StateWriter(m)
    }
    /// Store an array of `T` with its shape.
    pub fn array<T: StateReal>(&mut self, key: &str, shape: Vec<usize>, data: &[T]) {
        self.0.insert(key.into(), T::wrap(shape, data.to_vec()));
    }
    /// Store a 2-D float64 matrix.
    pub fn matrix(&mut self, key: &str, m: &Array2<f64>) {
        let shape = m.shape().to_vec();
        self.0
            .insert(key.into(), StateValue::F64(shape, m.iter().copied().collect()));
    }
    /// Store a float64 vector.
    pub fn vector(&mut self, key: &str, v: &Array1<f64>) {
        self.0.insert(key.into(), StateValue::F64(vec![v.len()], v.to_vec()));
    }
    /// Store a scalar.
    pub fn put(&mut self, key: &str, value: StateValue) {
        self.0.insert(key.into(), value);
    }
}

/// Check the `kind` tag.
pub fn expect_kind(state: &StateMap, kind: &str) -> Result<()> {
    match StateReader(state).text("kind")? {
        k if k == kind => Ok(()),
        other => Err(FaError::InvalidState(format!(
            "checkpoint holds a {other}, not a {kind}"
        ))),
    }
}
