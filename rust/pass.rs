//! Former home of the engine's shared plumbing, now in `crate::engine`; re-exports what `vifa` still imports
//! from here.

pub(crate) use crate::engine::{block_times, use_parallel, validate_batch};
