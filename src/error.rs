//! The crate's single error type. Every variant names what was wrong and, where it
//! applies, the value found and the value expected, so a CLI can print it as one line.

/// Everything that can go wrong in this crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No adapter matched the requested name/backend.
    #[error("no GPU adapter matches {wanted}; adapters found: {available}")]
    NoAdapter {
        /// The filter that matched nothing: a name substring, a backend, or both.
        wanted: String,
        /// The names of every adapter found, comma-separated, or a hint if there were none.
        available: String,
    },

    /// The adapter refused to create a device.
    #[error("could not create a device on adapter '{adapter}': {reason}")]
    RequestDevice {
        /// The adapter's name.
        adapter: String,
        /// wgpu's error message.
        reason: String,
    },

    /// A tensor's shape does not fit the problem.
    #[error("shape mismatch for {what}: expected {expected}, got {got}")]
    Shape {
        /// The tensor or argument whose shape is wrong.
        what: String,
        /// The shape the problem requires.
        expected: String,
        /// The shape that was passed.
        got: String,
    },

    /// A value outside what the crate supports (head dim too big, zero lengths, ...).
    #[error("unsupported {what}: got {got}, supported {supported}")]
    Unsupported {
        /// The quantity or option that is out of range.
        what: String,
        /// The value that was passed.
        got: String,
        /// The values the crate supports.
        supported: String,
    },

    /// An argument that makes no sense (e.g. a non-finite scale).
    #[error("invalid {what}: {reason}")]
    Invalid {
        /// The argument's name.
        what: String,
        /// Why it was refused.
        reason: String,
    },

    /// The adapter lacks a feature the request needs.
    #[error("adapter '{adapter}' lacks {feature}, needed for {needed_for}")]
    MissingFeature {
        /// The adapter's name.
        adapter: String,
        /// The missing wgpu feature (or combination of features).
        feature: &'static str,
        /// What the feature would have been used for.
        needed_for: String,
    },

    /// The request is larger than a device limit allows.
    #[error("{what} needs {requested} {unit}, over the limit of {max} ({limit})")]
    LimitExceeded {
        /// What needed more than the limit allows.
        what: String,
        /// The limit: a [`wgpu::Limits`] field's name, or a description of another cap.
        limit: &'static str,
        /// What `requested` and `max` count: bytes, workgroups, loop iterations.
        unit: &'static str,
        /// The amount needed, in `unit`s.
        requested: u64,
        /// The device limit, in `unit`s.
        max: u64,
    },

    /// The request is larger than a capacity the caller chose, not a device limit: the
    /// rows a [`crate::KvCache`] holds, the free pages of a [`crate::PagedKvCache`].
    /// Nothing was changed; growing the cache (or freeing pages) makes room.
    #[error("{what} needs {requested} {unit} but {capacity} is {max} {unit}")]
    CapacityExceeded {
        /// What needed more than the capacity holds.
        what: String,
        /// The capacity, named as the sentence's subject: "the cache's capacity".
        capacity: &'static str,
        /// What `requested` and `max` count: rows, pages.
        unit: &'static str,
        /// The amount needed, in `unit`s.
        requested: u64,
        /// The capacity, in `unit`s.
        max: u64,
    },

    /// wgpu reported a validation or out-of-memory error while recording or submitting.
    #[error("GPU error during {during}: {message}")]
    Gpu {
        /// The operation (or label) that was running when wgpu reported the error.
        during: String,
        /// wgpu's error message.
        message: String,
    },

    /// Reading a buffer back, or waiting for the device, failed.
    #[error("GPU readback failed: {0}")]
    Readback(String),

    /// A file could not be read or written: what a caller's `std::fs::read(..)?` gives
    /// in a function returning this crate's [`Result`] (weights files, mostly).
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
}

/// Shorthand used throughout the crate.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub(crate) fn shape(what: impl Into<String>, expected: impl ToString, got: impl ToString) -> Self {
        Error::Shape {
            what: what.into(),
            expected: expected.to_string(),
            got: got.to_string(),
        }
    }

    /// An [`Error::Invalid`]: `what` (an argument's name) and why it was refused. Front
    /// ends (the web module) use it for their own arguments, so every refusal reads
    /// alike.
    pub fn invalid(what: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::Invalid {
            what: what.into(),
            reason: reason.into(),
        }
    }

    pub(crate) fn unsupported(what: impl Into<String>, got: impl ToString, supported: impl Into<String>) -> Self {
        Error::Unsupported {
            what: what.into(),
            got: got.to_string(),
            supported: supported.into(),
        }
    }
}

/// The product of `dims` (a shape's element count, or that times an element size), or
/// an error naming `what` if it overflows `usize`: a header claiming (2^30, 2^30, 16, 1)
/// must not wrap to 0 and pass every size check after it.
pub fn checked_product(what: &str, dims: &[usize]) -> Result<usize> {
    dims.iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| Error::LimitExceeded {
            what: format!("{what} {dims:?}"),
            limit: "the address space (the element count overflows 64 bits)",
            unit: "elements",
            requested: u64::MAX,
            max: usize::MAX as u64,
        })
}
