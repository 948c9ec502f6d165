//! Surviving `fork()`: serial work in a child whose thread pool was lost, and model locks that fail
//! instead of hanging when the fork happened while another thread held them.
//!
//! `fork()` copies only the calling thread. If the parent had started rayon's global pool, the child
//! inherits a pool whose worker threads do not exist: the first parallel job would wait for them
//! forever. If another thread of the parent held a model's lock, the child inherits the lock held by a
//! thread that will never release it. A handler registered with `pthread_atfork` runs in every child
//! right after the fork and records both facts:
//!
//! * [`parallel_allowed`] — the gate every rayon call site checks — answers `false` in a child whose
//!   parent had used the pool, so the child runs every pass on the calling thread. The passes partition
//!   their work independently of the thread count and add partial results in a fixed order, so the
//!   child's results are bit-identical to the parent's parallel ones. A child whose parent never used
//!   the pool starts a fresh pool of its own as usual.
//! * [`Mutex`] tags its holder with the fork generation of the holding process. A child that finds a
//!   lock held under an older generation knows the holder is gone, and [`Mutex::lock`] reports
//!   [`LockFailure::HeldAtFork`] at once (that model's state may be half-updated in the child and is
//!   not usable there); a lock held by a thread of the child itself is waited for as usual.
//!
//! The handler is registered on first use of either function, which always comes before the pool is
//! started or a lock is taken, so every fork that matters happens after it.

use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Once;
use std::time::Duration;

/// Number of forks between the process that loaded the library and this one.
static GENERATION: AtomicU64 = AtomicU64::new(0);
/// Set before this process (or an ancestor) first asked rayon for parallel work.
static POOL_USED: AtomicBool = AtomicBool::new(false);
/// Set in a child forked after the pool was used: the inherited pool has no threads.
static POOL_LOST: AtomicBool = AtomicBool::new(false);
static REGISTER: Once = Once::new();

/// Runs in the child right after `fork()` (only async-signal-safe work: atomic stores).
#[cfg(unix)]
extern "C" fn after_fork_in_child() {
    GENERATION.fetch_add(1, Ordering::SeqCst);
    if POOL_USED.load(Ordering::SeqCst) {
        POOL_LOST.store(true, Ordering::SeqCst);
    }
}

/// Register the at-fork handler once per process image.
fn register() {
    REGISTER.call_once(|| {
        #[cfg(unix)]
        // SAFETY: the handler is a plain `extern "C" fn()` that only touches atomics. A non-zero return
        // (ENOMEM) leaves fork detection off; nothing else depends on it.
        unsafe {
            libc::pthread_atfork(None, None, Some(after_fork_in_child));
        }
    });
}

/// Forks between the process that loaded the library and this one (0 in the original process).
pub fn fork_generation() -> u64 {
    register();
    GENERATION.load(Ordering::SeqCst)
}

/// Whether parallel work may go to rayon's global pool: more than one thread, and not a forked child
/// that inherited a used (hence threadless) pool. Call it before any rayon work (it may start the pool).
pub fn parallel_allowed() -> bool {
    register();
    if POOL_LOST.load(Ordering::SeqCst) {
        return false;
    }
    POOL_USED.store(true, Ordering::SeqCst);
    rayon::current_num_threads() > 1
}

/// Run `f`, whose rayon parallel iterators go to the global pool, so that it cannot hang in a forked
/// child: on the global pool as usual, except in a child that inherited a used (hence threadless) global
/// pool, where `f` runs on a one-thread pool of its own made for this call (new threads work in a child).
/// For call sites that use rayon's parallel iterators directly rather than asking [`parallel_allowed`];
/// their results must not depend on the number of threads (fixed partitions, partial results combined in
/// a fixed order), so the child's results equal the parent's.
pub fn in_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    register();
    if !POOL_LOST.load(Ordering::SeqCst) {
        POOL_USED.store(true, Ordering::SeqCst);
        return f();
    }
    match rayon::ThreadPoolBuilder::new().num_threads(1).build() {
        Ok(pool) => pool.install(f),
        // No thread could be started: the inherited pool would wait forever, so fail loudly instead.
        Err(err) => panic!("cannot start a thread for parallel work in this forked child: {err}"),
    }
}

/// Why [`Mutex::lock`] gave no guard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockFailure {
    /// A thread panicked while holding the lock; the data may be inconsistent.
    Poisoned,
    /// The process was forked while a thread (absent from this child) held the lock.
    HeldAtFork,
}

/// Tag of an unheld lock.
const FREE: u64 = 0;

/// A mutual-exclusion lock that recognises, in a forked child, a lock held across the fork.
///
/// Ownership is one atomic tag (fork generation of the holder's process + 1), taken by compare-and-swap;
/// the data sits in a `std::sync::Mutex` that only the tag's owner touches (so it never blocks) and that
/// keeps std's poisoning. Waiting for a live holder spins briefly, then sleeps in short steps.
#[derive(Debug, Default)]
pub struct Mutex<T> {
    owner: AtomicU64,
    data: std::sync::Mutex<T>,
}

/// Access to the data of a locked [`Mutex`]; unlocks when dropped.
pub struct MutexGuard<'a, T> {
    guard: ManuallyDrop<std::sync::MutexGuard<'a, T>>,
    owner: &'a AtomicU64,
}

impl<T> Mutex<T> {
    /// A new unlocked lock holding `value`.
    pub fn new(value: T) -> Self {
        Mutex {
            owner: AtomicU64::new(FREE),
            data: std::sync::Mutex::new(value),
        }
    }

    /// Wait for the lock and return a guard; fails at once if it was held across a fork or is poisoned.
    pub fn lock(&self) -> Result<MutexGuard<'_, T>, LockFailure> {
        let me = fork_generation() + 1;
        let mut attempts = 0u32;
        loop {
            match self
                .owner
                .compare_exchange_weak(FREE, me, Ordering::Acquire, Ordering::Relaxed)
            {
                Ok(_) => break,
                Err(FREE) => continue,
                Err(holder) if holder != me => return Err(LockFailure::HeldAtFork),
                Err(_) => wait_a_little(&mut attempts),
            }
        }
        match self.data.lock() {
            Ok(guard) => Ok(MutexGuard {
                guard: ManuallyDrop::new(guard),
                owner: &self.owner,
            }),
            Err(poisoned) => {
                drop(poisoned);
                self.owner.store(FREE, Ordering::Release);
                Err(LockFailure::Poisoned)
            }
        }
    }
}

/// Back-off while another live thread holds the lock: spin, then yield, then sleep up to 1 ms.
fn wait_a_little(attempts: &mut u32) {
    *attempts = attempts.saturating_add(1);
    if *attempts < 64 {
        std::hint::spin_loop();
    } else if *attempts < 128 {
        std::thread::yield_now();
    } else {
        let micros = 10u64 << (*attempts - 128).min(7);
        std::thread::sleep(Duration::from_micros(micros.min(1000)));
    }
}

impl<T> Deref for MutexGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T> DerefMut for MutexGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.guard
    }
}

impl<T> Drop for MutexGuard<'_, T> {
    fn drop(&mut self) {
        // SAFETY: `guard` is dropped exactly once, here, and never used afterwards. It is released (and
        // poisoned if this thread is panicking) before the tag is cleared, so the next owner finds the
        // std mutex free.
        unsafe { ManuallyDrop::drop(&mut self.guard) };
        self.owner.store(FREE, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn lock_serialises_threads() {
        let counter = Arc::new(Mutex::new(0u64));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let counter = Arc::clone(&counter);
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        let mut guard = counter.lock().expect("lock");
                        let seen = *guard;
                        std::hint::black_box(&seen);
                        *guard = seen + 1;
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().expect("thread");
        }
        assert_eq!(*counter.lock().expect("lock"), 40_000);
    }

    #[test]
    fn a_panic_while_locked_poisons() {
        let shared = Arc::new(Mutex::new(1));
        let clone = Arc::clone(&shared);
        let result = std::thread::spawn(move || {
            let _guard = clone.lock().expect("lock");
            panic!("inside the lock");
        })
        .join();
        assert!(result.is_err());
        assert_eq!(shared.lock().err(), Some(LockFailure::Poisoned));
        assert_eq!(shared.lock().err(), Some(LockFailure::Poisoned));
    }

    #[test]
    fn a_lock_tagged_by_an_earlier_generation_is_reported() {
        // What a forked child sees: the tag of a holder from the parent's generation.
        let lock = Mutex::new(());
        let me = fork_generation() + 1;
        lock.owner.store(me + 1, Ordering::SeqCst);
        assert_eq!(lock.lock().err(), Some(LockFailure::HeldAtFork));
        lock.owner.store(FREE, Ordering::SeqCst);
        assert!(lock.lock().is_ok());
    }
}
