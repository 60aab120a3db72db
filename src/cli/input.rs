//! Input files for every command: each is opened once (a FIFO or `/dev/stdin` works),
//! and no read or allocation goes past what the file's own header declares, nor past
//! the host memory budget (a hostile header, or `/dev/zero`, cannot exhaust memory).

use super::CliError;
use std::io::Read;
use std::path::Path;

/// Refuses `bytes` of host memory for `what` beyond the library's host budget
/// ([`wgpu_attention::bench::check_host_bytes`], the one check `bench` uses too).
pub fn check_host_bytes(what: &str, bytes: u128) -> Result<(), CliError> {
    Ok(wgpu_attention::bench::check_host_bytes(what, bytes)?)
}

/// An input file opened once: its path for messages, and its length where it is a
/// regular file (a FIFO or device has none).
pub struct Input {
    pub file: std::io::BufReader<std::fs::File>,
    pub regular_len: Option<u64>,
}

pub fn open(path: &Path) -> Result<Input, CliError> {
    let file = std::fs::File::open(path).map_err(|e| CliError::bad(format!("cannot open {}: {e}", path.display())))?;
    let meta = file
        .metadata()
        .map_err(|e| CliError::bad(format!("cannot open {}: {e}", path.display())))?;
    if meta.is_dir() {
        return Err(CliError::bad(format!(
            "cannot read {}: it is a directory",
            path.display()
        )));
    }
    Ok(Input {
        file: std::io::BufReader::new(file),
        regular_len: meta.is_file().then_some(meta.len()),
    })
}

/// Appends exactly `len` bytes of `what` (the part of a file a header declared) to
/// `bytes`: refused beyond the host budget, and an error if the stream ends early.
pub fn read_exact_into(
    input: &mut Input,
    path: &Path,
    what: &str,
    len: u64,
    bytes: &mut Vec<u8>,
) -> Result<(), CliError> {
    check_host_bytes(&format!("{} ({what})", path.display()), u128::from(len))?;
    let start = bytes.len();
    bytes.reserve(usize::try_from(len).unwrap_or(usize::MAX));
    (&mut input.file)
        .take(len)
        .read_to_end(bytes)
        .map_err(|e| CliError::bad(format!("cannot read {}: {e}", path.display())))?;
    let got = (bytes.len() - start) as u64;
    if got < len {
        return Err(CliError::bad(format!(
            "{}: the file ends after {got} bytes of {what}, but its header declares {len}",
            path.display()
        )));
    }
    Ok(())
}

/// Whether anything follows what was read (checked by reading one byte).
pub fn has_more(input: &mut Input) -> bool {
    let mut byte = [0u8; 1];
    matches!(input.file.read(&mut byte), Ok(1))
}

/// The largest safetensors header the format allows (the reference implementation's
/// limit).
const MAX_SAFETENSORS_HEADER: u64 = 100_000_000;

/// Reads a `.safetensors` file: its 8-byte header length, the JSON header, then exactly
/// the data the header's offsets declare. A header that lies about the data, a file
/// with bytes after it, and endless inputs such as `/dev/zero` are refused.
pub fn read_safetensors(path: &Path) -> Result<Vec<u8>, CliError> {
    let bad = |why: String| CliError::bad(format!("{}: not a safetensors file: {why}", path.display()));
    let mut input = open(path)?;
    let mut prefix = [0u8; 8];
    input
        .file
        .read_exact(&mut prefix)
        .map_err(|e| bad(format!("cannot read its 8-byte header length: {e}")))?;
    let header_len = u64::from_le_bytes(prefix);
    if header_len > MAX_SAFETENSORS_HEADER {
        return Err(bad(format!(
            "its header length {header_len} is beyond the format's {MAX_SAFETENSORS_HEADER} bytes"
        )));
    }
    if let Some(len) = input.regular_len {
        if 8 + header_len > len {
            return Err(bad(format!(
                "its header length {header_len} is past the file's end ({len} bytes)"
            )));
        }
    }
    let mut bytes = prefix.to_vec();
    read_exact_into(&mut input, path, "header", header_len, &mut bytes)?;
    let json: serde_json::Value =
        serde_json::from_slice(&bytes[8..]).map_err(|e| bad(format!("its header is not JSON: {e}")))?;
    let object = json
        .as_object()
        .ok_or_else(|| bad("its header is not a JSON object".into()))?;
    let mut data_len = 0u64;
    for (name, entry) in object.iter().filter(|(name, _)| name.as_str() != "__metadata__") {
        let end = entry
            .get("data_offsets")
            .and_then(|o| o.get(1))
            .and_then(serde_json::Value::as_u64)
            .ok_or_else(|| bad(format!("tensor '{name}' has no data_offsets [begin, end]")))?;
        data_len = data_len.max(end);
    }
    if let Some(len) = input.regular_len {
        // In u128: a hostile data_offsets end near 2^64 must not wrap.
        let declared = 8 + u128::from(header_len) + u128::from(data_len);
        if declared != u128::from(len) {
            return Err(bad(format!(
                "its header declares {declared} bytes in all, but the file holds {len}"
            )));
        }
    }
    read_exact_into(&mut input, path, "tensor data", data_len, &mut bytes)?;
    if has_more(&mut input) {
        return Err(bad(format!(
            "it holds more than the {data_len} bytes of data its header declares"
        )));
    }
    Ok(bytes)
}
