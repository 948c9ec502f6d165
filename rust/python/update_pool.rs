//! A per-thread limit on the threads of the streaming models' updates (`limit_update_threads`).
//!
//! A background thread that fits snapshots while training runs on the other cores (the asynchronous
//! `SnapshotCollector`) asks for its updates to use few threads, so that they do not compete with training
//! for every core. The limit belongs to the calling OS thread; other threads keep rayon's global pool.
//! Results do not depend on it: the engine's partitions and the order of its sums are fixed.

use std::cell::RefCell;
use std::sync::Arc;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

thread_local! {
    /// The pool this thread's updates run in, with the fork generation it was made in (a pool made before a
    /// fork has no threads in the child, so it is remade there), or None for the global pool.
    static UPDATE_POOL: RefCell<Option<(Arc<rayon::ThreadPool>, u64)>> = const { RefCell::new(None) };
}

/// Run `f` in the calling thread's update pool, if one was set with `limit_update_threads`.
pub(crate) fn in_update_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    let pool = UPDATE_POOL.with(|cell| {
        let mut slot = cell.borrow_mut();
        let generation = crate::fork::fork_generation();
        match slot.as_ref() {
            Some((pool, made_in)) if *made_in != generation => {
                let threads = pool.current_num_threads();
                *slot = build(threads).ok().map(|pool| (Arc::new(pool), generation));
            }
            _ => {}
        }
        slot.as_ref().map(|(pool, _)| Arc::clone(pool))
    });
    match pool {
        Some(pool) => pool.install(f),
        None => f(),
    }
}

fn build(n_threads: usize) -> Result<rayon::ThreadPool, rayon::ThreadPoolBuildError> {
    rayon::ThreadPoolBuilder::new().num_threads(n_threads).build()
}

/// Run the updates of `OnlineEM` / `OnlineSGA` models called from this thread on `n_threads` threads
/// (0: rayon's global pool again). Results are the same for every thread count.
#[pyfunction]
pub(crate) fn limit_update_threads(n_threads: usize) -> PyResult<()> {
    if n_threads > 4096 {
        return Err(PyValueError::new_err(format!(
            "n_threads must be at most 4096, got {n_threads}"
        )));
    }
    let pool = if n_threads == 0 {
        None
    } else {
        let pool = build(n_threads).map_err(|err| PyRuntimeError::new_err(format!("cannot start threads: {err}")))?;
        Some((Arc::new(pool), crate::fork::fork_generation()))
    };
    UPDATE_POOL.with(|cell| *cell.borrow_mut() = pool);
    Ok(())
}
