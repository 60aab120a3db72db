//! A value that a wgpu callback delivers later, as a future. `Buffer::map_async` takes
//! a callback; native code could block on a channel until it runs, but a browser's one
//! thread cannot block (docs/design.md, "The web"), so readback awaits this instead.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

struct Slot<T> {
    value: Option<T>,
    waker: Option<Waker>,
    /// The sender is gone: no value will come after the one (if any) in `value`.
    closed: bool,
}

/// The sending half: moved into the callback.
pub(crate) struct Sender<T>(Arc<Mutex<Slot<T>>>);

/// The receiving half: a future of the sent value, or `None` if the sender was dropped
/// without sending (wgpu dropped the callback).
pub(crate) struct Receiver<T>(Arc<Mutex<Slot<T>>>);

/// A channel for one value.
pub(crate) fn oneshot<T>() -> (Sender<T>, Receiver<T>) {
    let slot = Arc::new(Mutex::new(Slot {
        value: None,
        waker: None,
        closed: false,
    }));
    (Sender(slot.clone()), Receiver(slot))
}

fn lock<T>(slot: &Mutex<Slot<T>>) -> MutexGuard<'_, Slot<T>> {
    // The critical sections cannot panic, so a poisoned lock still holds a whole slot.
    slot.lock().unwrap_or_else(|p| p.into_inner())
}

impl<T> Sender<T> {
    pub(crate) fn send(self, value: T) {
        lock(&self.0).value = Some(value);
        // Dropping self closes the slot and wakes the receiver.
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let waker = {
            let mut slot = lock(&self.0);
            slot.closed = true;
            slot.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

impl<T> Future for Receiver<T> {
    type Output = Option<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let mut slot = lock(&self.0);
        if let Some(value) = slot.value.take() {
            return Poll::Ready(Some(value));
        }
        if slot.closed {
            return Poll::Ready(None);
        }
        slot.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::oneshot;

    #[test]
    fn a_value_sent_before_or_after_the_first_poll_arrives() {
        let (tx, rx) = oneshot();
        tx.send(7);
        assert_eq!(pollster::block_on(rx), Some(7));

        let (tx, rx) = oneshot();
        let sender = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            tx.send("late");
        });
        assert_eq!(pollster::block_on(rx), Some("late"));
        sender.join().expect("the sender thread ends");
    }

    #[test]
    fn a_dropped_sender_ends_the_wait_with_none() {
        let (tx, rx) = oneshot::<u32>();
        drop(tx);
        assert_eq!(pollster::block_on(rx), None);
    }
}
