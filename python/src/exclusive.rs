//! One call at a time on a class's state (the caches' device buffers and lengths): a
//! call from a second thread waits for the first instead of failing with PyO3's
//! "Already mutably borrowed" (the methods take `&self`, the state sits in a mutex).

use crate::value_error;
use pyo3::prelude::*;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{self, ThreadId};

/// A value that one call uses at a time. A call waits for its turn with the GIL
/// released: the call it waits for may be running GPU work without the GIL and need
/// the GIL back to finish, so waiting while holding it would deadlock.
pub(crate) struct Exclusive<T> {
    value: Mutex<T>,
    /// The thread whose call has the turn, if any.
    holder: Mutex<Option<ThreadId>>,
    released: Condvar,
}

/// A call's turn: the value is the call's alone until the turn is dropped.
pub(crate) struct Turn<'a, T> {
    owner: &'a Exclusive<T>,
}

impl<T: Send> Exclusive<T> {
    pub(crate) fn new(value: T) -> Self {
        Exclusive {
            value: Mutex::new(value),
            holder: Mutex::new(None),
            released: Condvar::new(),
        }
    }

    /// Waits until no other call has the turn, then takes it. `what` names the object
    /// for the error a call from within its own call gets (Python code run by a method,
    /// such as a sequence's `__iter__`, using the object again), which would otherwise
    /// wait for itself forever.
    pub(crate) fn turn(&self, py: Python<'_>, what: &str) -> PyResult<Turn<'_, T>> {
        let me = thread::current().id();
        let taken = py.detach(|| {
            let mut holder = self.holder.lock().unwrap_or_else(PoisonError::into_inner);
            while let Some(other) = *holder {
                if other == me {
                    return false;
                }
                holder = self.released.wait(holder).unwrap_or_else(PoisonError::into_inner);
            }
            *holder = Some(me);
            true
        });
        if !taken {
            return Err(value_error(
                what,
                "used again from within one of its own calls on this thread",
            ));
        }
        Ok(Turn { owner: self })
    }
}

impl<T> Turn<'_, T> {
    /// The value. Never contended: every other call waits for the turn first.
    pub(crate) fn get(&self) -> MutexGuard<'_, T> {
        self.owner.value.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T> Drop for Turn<'_, T> {
    fn drop(&mut self) {
        *self.owner.holder.lock().unwrap_or_else(PoisonError::into_inner) = None;
        self.owner.released.notify_one();
    }
}
