//! Running work: error scopes around every step, submission, waiting, and reading
//! buffers back through reused staging buffers.

use super::Gpu;
use crate::error::{Error, Result};
use crate::staging;

/// The error scopes every step runs in.
struct ErrorScopes {
    internal: wgpu::ErrorScopeGuard,
    oom: wgpu::ErrorScopeGuard,
    validation: wgpu::ErrorScopeGuard,
}

impl ErrorScopes {
    /// The first error caught, validation first. All three scopes leave the device's
    /// stack before the first await: on the web another call may run while this one
    /// waits, and a pop that is not of the top scope panics there.
    async fn pop(self) -> Option<wgpu::Error> {
        // Scopes pop in the reverse order of their pushes.
        let (validation, oom, internal) = (self.validation.pop(), self.oom.pop(), self.internal.pop());
        let validation = validation.await;
        let oom = oom.await;
        let internal = internal.await;
        validation.or(oom).or(internal)
    }
}

impl Gpu {
    /// Runs `f` inside validation, out-of-memory and internal error scopes and turns
    /// anything wgpu reports into [`Error::Gpu`].
    #[cfg(not(target_arch = "wasm32"))]
    pub(crate) fn scoped<T>(&self, during: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        self.check_usable(during)?;
        let scopes = self.push_scopes();
        let out = f();
        // Natively a popped scope is ready at once.
        let error = pollster::block_on(scopes.pop());
        self.settle(during, out, error)
    }

    /// On the web an error scope is popped by awaiting it, which a synchronous step
    /// cannot do: `f` runs bare, and the scopes of the async entry point around it
    /// ([`Gpu::scoped_async`]: `sdpa_async`, `forward_async`, readback) catch what
    /// it raises.
    #[cfg(target_arch = "wasm32")]
    pub(crate) fn scoped<T>(&self, during: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        self.check_usable(during)?;
        f()
    }

    /// [`Gpu::scoped`], with the scopes awaited.
    pub(crate) async fn scoped_async<T>(&self, during: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        self.check_usable(during)?;
        let scopes = self.push_scopes();
        let out = f();
        let error = scopes.pop().await;
        self.settle(during, out, error)
    }

    /// An error from before this call: the device was lost, or an error escaped every
    /// scope (kept by the uncaptured-error handler).
    pub(crate) fn check_usable(&self, during: &str) -> Result<()> {
        if self.is_lost() {
            return Err(Self::lost_error(during));
        }
        if let Some(message) = self.watch.take_escaped() {
            return Err(Error::Gpu {
                during: escaped_during(during),
                message,
            });
        }
        Ok(())
    }

    fn lost_error(during: &str) -> Error {
        Error::Gpu {
            during: during.into(),
            message: "the device was lost (destroyed, reset or removed); make a new Context".into(),
        }
    }

    fn push_scopes(&self) -> ErrorScopes {
        // Internal errors too (a backend failing to translate a shader): one no scope
        // caught would reach the uncaptured handler and be blamed on the next call.
        ErrorScopes {
            internal: self.device.push_error_scope(wgpu::ErrorFilter::Internal),
            oom: self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory),
            validation: self.device.push_error_scope(wgpu::ErrorFilter::Validation),
        }
    }

    /// What a step's result and the error its scopes caught make of the call.
    fn settle<T>(&self, during: &str, out: Result<T>, error: Option<wgpu::Error>) -> Result<T> {
        if error.is_some() || out.is_err() {
            // wgpu reports a loss through a callback it runs when polled: a failure is
            // the moment to ask, so the error names the cause rather than its symptom.
            let _ = self.device.poll(wgpu::PollType::Poll);
            if self.is_lost() {
                return Err(Self::lost_error(during));
            }
        }
        if let Some(e) = error {
            return Err(Error::Gpu {
                during: during.into(),
                message: e.to_string(),
            });
        }
        out
    }

    /// Finishes `encoder` and submits it, returning any GPU error in the recorded work
    /// as [`Error::Gpu`]. wgpu validates much of a recording only when it is finished,
    /// so work recorded by the `encode_*` functions should be submitted this way (or
    /// finished and submitted inside the caller's own error scopes).
    pub fn submit(&self, encoder: wgpu::CommandEncoder) -> Result<()> {
        self.submit_as("submitting recorded work", encoder)
    }

    /// Records work into a new encoder with `record` and submits it as
    /// [`Gpu::submit`] does; returns what `record` returned.
    pub(crate) fn record_and_submit<T>(
        &self,
        during: &str,
        record: impl FnOnce(&mut wgpu::CommandEncoder) -> Result<T>,
    ) -> Result<T> {
        let mut encoder = self.device.create_command_encoder(&Default::default());
        let out = record(&mut encoder)?;
        self.submit_as(during, encoder)?;
        Ok(out)
    }

    /// [`Gpu::submit`], naming what was recorded in an error.
    fn submit_as(&self, during: &str, encoder: wgpu::CommandEncoder) -> Result<()> {
        self.scoped(during, || {
            self.queue.submit([encoder.finish()]);
            Ok(())
        })
    }

    /// Blocks until all submitted work is done. Native targets only: a browser cannot
    /// block (await a readback instead).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn wait_idle(&self) -> Result<()> {
        self.device
            .poll(wgpu::PollType::Wait {
                submission_index: None,
                timeout: None,
            })
            .map(|_| ())
            .map_err(|e| Error::Readback(e.to_string()))
    }

    /// Resolves once the GPU has finished all work submitted so far: what a benchmark
    /// awaits between timed calls (on the web, where [`Gpu::wait_idle`] cannot block).
    pub async fn finished_async(&self) -> Result<()> {
        let (tx, rx) = crate::wait::oneshot();
        self.queue.on_submitted_work_done(move || tx.send(()));
        // Native devices run callbacks when polled; a browser runs them by itself.
        #[cfg(not(target_arch = "wasm32"))]
        self.wait_idle()?;
        rx.await
            .ok_or_else(|| Error::Readback("the work-done callback was dropped".into()))
    }

    /// Copies the first `bytes` of `buffer` to the host, through a staging buffer from
    /// the pool (returned to it once unmapped); natively waits for exactly the copy's
    /// submission.
    pub(crate) async fn read_buffer_async(&self, buffer: &wgpu::Buffer, bytes: u64) -> Result<Vec<u8>> {
        let ((), data) = self
            .record_and_read_async("readback copy", |_| Ok(()), |()| (buffer.clone(), bytes))
            .await?;
        Ok(data)
    }

    /// Records work with `record`, then a copy of the first bytes of the buffer `read`
    /// names in its result, and submits both as one: one submission and one wait,
    /// where submitting and then reading back take two (issue 17 §5).
    pub(crate) async fn record_and_read_async<T>(
        &self,
        during: &str,
        record: impl FnOnce(&mut wgpu::CommandEncoder) -> Result<T>,
        read: impl FnOnce(&T) -> (wgpu::Buffer, u64),
    ) -> Result<(T, Vec<u8>)> {
        let mut staged = None;
        let out = self
            .scoped_async(during, || {
                let mut encoder = self.device.create_command_encoder(&Default::default());
                let out = record(&mut encoder)?;
                let (buffer, bytes) = read(&out);
                // A copy is whole 4-byte words, all inside the buffer.
                let padded = bytes
                    .max(4)
                    .checked_next_multiple_of(4)
                    .filter(|&padded| padded <= buffer.size())
                    .ok_or_else(|| {
                        Error::Readback(format!("{bytes} bytes asked of a buffer of {} bytes", buffer.size()))
                    })?;
                let class = staging::class_of(padded);
                let staging = match self.staging.take(class) {
                    Some(b) => b,
                    None => self.create_buffer(
                        "wgpu-attention readback",
                        class,
                        wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                    )?,
                };
                encoder.copy_buffer_to_buffer(&buffer, 0, &staging, 0, padded);
                let submitted = self.queue.submit([encoder.finish()]);
                staged = Some((staging, padded, bytes, submitted));
                Ok(out)
            })
            .await?;
        let (staging, padded, bytes, submitted) =
            staged.ok_or_else(|| Error::Readback("nothing was staged for reading".into()))?;
        let (tx, rx) = crate::wait::oneshot();
        staging
            .slice(..padded)
            .map_async(wgpu::MapMode::Read, move |r| tx.send(r));
        // Native devices run callbacks when polled; a browser runs them by itself.
        #[cfg(not(target_arch = "wasm32"))]
        self.device
            .poll(wgpu::PollType::Wait {
                submission_index: Some(submitted),
                timeout: None,
            })
            .map_err(|e| Error::Readback(e.to_string()))?;
        #[cfg(target_arch = "wasm32")]
        let _ = submitted;
        rx.await
            .ok_or_else(|| Error::Readback("the mapping callback was dropped".into()))?
            .map_err(|e| Error::Readback(e.to_string()))?;
        let data = {
            let view = staging
                .slice(..padded)
                .get_mapped_range()
                .map_err(|e| Error::Readback(e.to_string()))?;
            // `bytes` <= `padded`, the view's length, which fits in memory.
            let len = usize::try_from(bytes).map_err(|e| Error::Readback(e.to_string()))?;
            view[..len].to_vec()
        };
        staging.unmap();
        self.staging.give(staging);
        Ok((out, data))
    }

    /// Readback buffers the pool keeps now (for tests).
    #[doc(hidden)]
    pub fn kept_staging_buffers(&self) -> usize {
        self.staging.len()
    }
}

/// What an escaped error's [`Error::Gpu`] says it happened during: natively the
/// calling thread's own work (wgpu raised it on this thread, in a call made outside
/// every error scope).
#[cfg(not(target_arch = "wasm32"))]
fn escaped_during(during: &str) -> String {
    format!("work submitted on this thread before {during}, outside an error scope (Context::submit scopes it)")
}

/// [`escaped_during`] on the web, where errors arrive after their call has returned,
/// so the one kept may be another call's.
#[cfg(target_arch = "wasm32")]
fn escaped_during(during: &str) -> String {
    format!(
        "work submitted before {during}, outside an error scope (Context::submit scopes it); \
         it may belong to another call than this one"
    )
}
