//! Checkpoint state: every model converts itself to and from a flat map of named arrays and scalars.
//!
//! The map is what the Python layer writes into a versioned `.npz` file, so a resumed model is
//! bit-identical to one that never stopped. `from_state` checks every length, dtype and value, and
//! returns [`FaError::InvalidState`] for anything inconsistent — never a silently wrong model.

use std::collections::BTreeMap;
use std::sync::Mutex;

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
    /// An array (an `F32` or `F64` value) that [`StateReader::array`] moves into the model instead of
    /// copying: a checkpoint read from disk straight into the model's memory (peak 1× the state).
    Adopted(Adoptable),
}

impl StateValue {
    /// Whether this is a float32 array (held or adopted).
    pub fn is_f32(&self) -> bool {
        match self {
            StateValue::F32(..) => true,
            StateValue::Adopted(a) => a.with(|v| matches!(v, Some(StateValue::F32(..)))),
            _ => false,
        }
    }
}

/// An array entry the first reader takes (moves out); a second read finds it missing.
#[derive(Debug, Default)]
pub struct Adoptable(Mutex<Option<Box<StateValue>>>);

impl Adoptable {
    /// Wrap an `F32` or `F64` array value.
    pub fn new(value: StateValue) -> Self {
        Adoptable(Mutex::new(Some(Box::new(value))))
    }

    pub(crate) fn with<R>(&self, f: impl FnOnce(Option<&StateValue>) -> R) -> R {
        let guard = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        f(guard.as_deref())
    }

    /// Move the array out if it holds `T` (left in place otherwise).
    fn take<T: StateReal>(&self) -> Option<(Vec<usize>, Vec<T>)> {
        let mut guard = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let value = *guard.take()?;
        match T::into_parts(value) {
            Ok(parts) => Some(parts),
            Err(other) => {
                *guard = Some(Box::new(other));
                None
            }
        }
    }
}

impl Clone for Adoptable {
    fn clone(&self) -> Self {
        Adoptable(Mutex::new(self.with(|v| v.cloned().map(Box::new))))
    }
}

impl PartialEq for Adoptable {
    fn eq(&self, other: &Self) -> bool {
        self.with(|a| other.with(|b| a == b))
    }
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
    /// Take the shape and vector out of an entry of this type (the entry back if it holds another).
    fn into_parts(value: StateValue) -> std::result::Result<(Vec<usize>, Vec<Self>), StateValue>;
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
    fn into_parts(value: StateValue) -> std::result::Result<(Vec<usize>, Vec<Self>), StateValue> {
        match value {
            StateValue::F32(s, d) => Ok((s, d)),
            other => Err(other),
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
    fn into_parts(value: StateValue) -> std::result::Result<(Vec<usize>, Vec<Self>), StateValue> {
        match value {
            StateValue::F64(s, d) => Ok((s, d)),
            other => Err(other),
        }
    }
}

fn missing(key: &str) -> FaError {
    FaError::InvalidState(format!("entry `{key}` is missing or has the wrong type"))
}

/// Check an array entry's shape and that every value is finite.
fn check_array<T: StateReal>(key: &str, stored: &[usize], data: &[T], shape: &[usize]) -> Result<()> {
    let len: usize = shape.iter().product();
    if stored != shape || data.len() != len {
        return Err(FaError::InvalidState(format!(
            "entry `{key}` has shape {stored:?}, expected {shape:?}"
        )));
    }
    if data.iter().any(|v| !v.to_f64().is_finite()) {
        return Err(FaError::InvalidState(format!(
            "entry `{key}` contains non-finite values"
        )));
    }
    Ok(())
}

/// The shape of a float64 array entry (stored, or adopted from a checkpoint file), if `key` holds one.
pub fn f64_shape(state: &StateMap, key: &str) -> Option<Vec<usize>> {
    let shape = |value: Option<&StateValue>| match value {
        Some(StateValue::F64(shape, _)) => Some(shape.clone()),
        _ => None,
    };
    match state.get(key) {
        Some(StateValue::Adopted(cell)) => cell.with(shape),
        other => shape(other),
    }
}

/// Builder/reader helpers over a [`StateMap`].
pub struct StateReader<'a>(pub &'a StateMap);

impl StateReader<'_> {
    /// A stored array of `T` with exactly `shape`, all values finite: a copy of an `F32`/`F64` entry, or
    /// the vector itself, moved without a copy, of an [`StateValue::Adopted`] one.
    pub fn array<T: StateReal>(&self, key: &str, shape: &[usize]) -> Result<Vec<T>> {
        match self.0.get(key) {
            Some(StateValue::Adopted(cell)) => {
                let (s, d) = cell.take::<T>().ok_or_else(|| missing(key))?;
                check_array(key, &s, &d, shape)?;
                Ok(d)
            }
            Some(value) => {
                let (s, d) = T::unwrap(value).ok_or_else(|| missing(key))?;
                check_array(key, s, d, shape)?;
                Ok(d.to_vec())
            }
            None => Err(missing(key)),
        }
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
    /// Store an array of `T` with its shape, taking the vector (no copy).
    pub fn owned_array<T: StateReal>(&mut self, key: &str, shape: Vec<usize>, data: Vec<T>) {
        self.0.insert(key.into(), T::wrap(shape, data));
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

#[cfg(test)]
mod tests {
    use super::*;

    fn map_with(value: StateValue) -> StateMap {
        let mut map = StateMap::new();
        map.insert("a".into(), value);
        map
    }

    #[test]
    fn adopted_array_is_moved_not_copied_and_read_once() {
        let data = vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        let address = data.as_ptr();
        let map = map_with(StateValue::Adopted(Adoptable::new(StateValue::F32(vec![2, 3], data))));
        assert!(map["a"].is_f32());
        let reader = StateReader(&map);
        assert!(reader.array::<f64>("a", &[2, 3]).is_err(), "wrong dtype");
        let taken = reader.array::<f32>("a", &[2, 3]).expect("adopted array");
        assert_eq!(taken.as_ptr(), address, "the vector must be moved, not copied");
        assert_eq!(taken, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        assert!(
            reader.array::<f32>("a", &[2, 3]).is_err(),
            "an adopted array is read once"
        );
    }

    #[test]
    fn adopted_array_is_validated_like_a_held_one() {
        for (value, shape) in [
            (StateValue::F64(vec![3], vec![1.0, f64::NAN, 0.0]), vec![3]),
            (StateValue::F64(vec![3], vec![1.0, 2.0, 3.0]), vec![4]),
        ] {
            let held = map_with(value.clone());
            let adopted = map_with(StateValue::Adopted(Adoptable::new(value)));
            assert!(StateReader(&held).array::<f64>("a", &shape).is_err());
            assert!(StateReader(&adopted).array::<f64>("a", &shape).is_err());
        }
    }
}
