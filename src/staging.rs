//! Readback staging buffers kept for reuse (issue 17 §5): a readback takes a mappable
//! buffer from the pool and gives it back once unmapped, so a steady stream of small
//! reads (decode, one token at a time) creates a staging buffer per size class, not per
//! read. Sizes are rounded up to a power of two, at least [`MIN_BYTES`]; at most [`KEPT`]
//! buffers of at most [`MAX_KEPT_BYTES`] each are kept. Large reads are not pooled: a
//! kept buffer pins the allocator's memory block it sits in (a kept 2 MiB buffer raised
//! a `run --weights-out` peak by 35 MB on lavapipe), and their copy costs far more than
//! creating the buffer.

use std::sync::Mutex;

pub(crate) const MIN_BYTES: u64 = 256;
pub(crate) const MAX_KEPT_BYTES: u64 = 1 << 20;
pub(crate) const KEPT: usize = 4;

#[derive(Default)]
pub(crate) struct StagingPool {
    free: Mutex<Vec<wgpu::Buffer>>,
}

/// The size class of a read of `bytes`.
pub(crate) fn class_of(bytes: u64) -> u64 {
    bytes.max(MIN_BYTES).next_power_of_two()
}

impl StagingPool {
    /// A free buffer of exactly `class` bytes, if one is kept.
    pub(crate) fn take(&self, class: u64) -> Option<wgpu::Buffer> {
        let mut free = self.lock();
        let i = free.iter().position(|b| b.size() == class)?;
        Some(free.swap_remove(i))
    }

    /// Keeps an unmapped buffer for the next read of its class, unless it is too big or
    /// the pool is full (then the oldest is dropped).
    pub(crate) fn give(&self, buffer: wgpu::Buffer) {
        if buffer.size() > MAX_KEPT_BYTES {
            return;
        }
        let mut free = self.lock();
        if free.len() == KEPT {
            free.remove(0);
        }
        free.push(buffer);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<wgpu::Buffer>> {
        // Pushes and removes cannot leave the list half-changed, so a poisoned lock is fine.
        self.free.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Buffers kept now (for tests).
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_are_powers_of_two_from_256_bytes() {
        assert_eq!(class_of(0), 256);
        assert_eq!(class_of(4), 256);
        assert_eq!(class_of(256), 256);
        assert_eq!(class_of(257), 512);
        assert_eq!(class_of(5 << 20), 8 << 20);
    }
}
