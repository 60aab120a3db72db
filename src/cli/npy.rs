//! `.npy` arrays for the CLI: typed reads with clear errors (each file read once, no
//! further than its header declares) and float32 encoding; files are written by
//! [`super::output`].

use super::{input, CliError};
use half::f16;
use std::path::Path;

/// An array read from a `.npy` file, with its C-order shape.
pub struct Array<T> {
    pub shape: Vec<usize>,
    pub data: Vec<T>,
}

/// The reader of an opened `.npy` file's data: exactly the bytes its header declares.
type Data = std::io::Take<std::io::BufReader<std::fs::File>>;

/// The largest `.npy` header read (NumPy writes a few hundred bytes; version 1 allows
/// 64 KiB).
const MAX_HEADER: u64 = 1 << 20;

/// Opens a `.npy` file once (FIFOs and `/dev/stdin` work) and parses its header; the
/// data that follows is bounded by what the header declares, by the file's length for
/// a regular file, and by the host memory budget.
fn open(path: &Path) -> Result<npyz::NpyFile<Data>, CliError> {
    use std::io::Read;
    let invalid = |why: String| CliError::bad(format!("{} is not a valid .npy file: {why}", path.display()));
    let mut input = input::open(path)?;
    // Magic (6 bytes), version (2), header length (u16 in version 1, else u32).
    let mut head = vec![0u8; 10];
    input
        .file
        .read_exact(&mut head)
        .map_err(|e| invalid(format!("cannot read its preamble: {e}")))?;
    if &head[..6] != b"\x93NUMPY" {
        return Err(invalid("it does not start with the .npy magic string".into()));
    }
    let header_len = if head[6] == 1 {
        u64::from(u16::from_le_bytes([head[8], head[9]]))
    } else {
        let mut rest = [0u8; 2];
        input
            .file
            .read_exact(&mut rest)
            .map_err(|e| invalid(format!("cannot read its preamble: {e}")))?;
        head.extend_from_slice(&rest);
        u64::from(u32::from_le_bytes([head[8], head[9], rest[0], rest[1]]))
    };
    if header_len > MAX_HEADER {
        return Err(invalid(format!(
            "a header of {header_len} bytes (at most {MAX_HEADER} read)"
        )));
    }
    let preamble = head.len() as u64;
    input::read_exact_into(&mut input, path, "header", header_len, &mut head)?;
    let header = npyz::NpyHeader::from_reader(std::io::Cursor::new(&head)).map_err(|e| invalid(e.to_string()))?;
    let npy = npyz::NpyFile::with_header(header, input.file.take(0));
    // The header's element count must not overflow, and its data must fit in the file
    // and the host budget: never allocate more than the input justifies.
    let dims: Vec<usize> = npy
        .shape()
        .iter()
        .map(|&n| usize::try_from(n).unwrap_or(usize::MAX))
        .collect();
    let count = wgpu_attention::checked_product("array shape", &dims)
        .map_err(|e| CliError::bad(format!("{}: {e}", path.display())))?;
    let item = match npy.dtype() {
        npyz::DType::Plain(t) => t.num_bytes().unwrap_or(1),
        _ => 1,
    };
    let needed = (count as u128) * (item as u128);
    if let Some(len) = input.regular_len {
        let data_len = len.saturating_sub(preamble + header_len);
        if needed > u128::from(data_len) {
            return Err(CliError::bad(format!(
                "{}: the header claims {dims:?} ({count} elements of {item} bytes) but the file holds {data_len} bytes of data",
                path.display()
            )));
        }
    }
    input::check_host_bytes(
        &format!("{} ({dims:?} of {item}-byte elements)", path.display()),
        needed,
    )?;
    if npy.order() != npyz::Order::C {
        return Err(CliError::bad(format!(
            "{}: Fortran-order arrays are not supported; save it in C order",
            path.display()
        )));
    }
    let header = npy.header().clone();
    let mut data = npy.into_inner();
    data.set_limit(needed as u64);
    Ok(npyz::NpyFile::with_header(header, data))
}

/// The dtype string without its byte-order character (`f4`, `f2`, `b1`, `i4`, `i8`).
fn kind(npy: &npyz::NpyFile<Data>) -> String {
    match npy.dtype() {
        npyz::DType::Plain(t) => t.to_string().chars().skip(1).collect(),
        other => format!("{other:?}"),
    }
}

fn read_as<T: npyz::Deserialize>(path: &Path, npy: npyz::NpyFile<Data>) -> Result<Array<T>, CliError> {
    let shape = npy.shape().iter().map(|&n| n as usize).collect();
    let data = npy
        .into_vec::<T>()
        .map_err(|e| CliError::bad(format!("cannot read data of {}: {e}", path.display())))?;
    Ok(Array { shape, data })
}

/// Reads a float32 or float16 array as f32.
pub fn read_float(path: &Path) -> Result<Array<f32>, CliError> {
    Ok(read_float_noting_f16(path)?.0)
}

/// [`read_float`], and whether the file held float16 (read once: the path may be a
/// FIFO or standard input).
pub fn read_float_noting_f16(path: &Path) -> Result<(Array<f32>, bool), CliError> {
    let npy = open(path)?;
    match kind(&npy).as_str() {
        "f4" => Ok((read_as::<f32>(path, npy)?, false)),
        "f2" => {
            let a = read_as::<f16>(path, npy)?;
            let widened = Array {
                shape: a.shape,
                data: a.data.into_iter().map(f16::to_f32).collect(),
            };
            Ok((widened, true))
        }
        other => Err(CliError::bad(format!(
            "{}: dtype {other} is not float32 or float16",
            path.display()
        ))),
    }
}

/// Reads an int32 or int64 array as i64.
pub fn read_int(path: &Path) -> Result<Array<i64>, CliError> {
    let npy = open(path)?;
    match kind(&npy).as_str() {
        "i4" => {
            let a = read_as::<i32>(path, npy)?;
            Ok(Array {
                shape: a.shape,
                data: a.data.into_iter().map(i64::from).collect(),
            })
        }
        "i8" => read_as::<i64>(path, npy),
        other => Err(CliError::bad(format!(
            "{}: dtype {other} is not int32 or int64",
            path.display()
        ))),
    }
}

/// A mask file: bool (`true` = may attend) or float32 (additive).
pub enum MaskArray {
    Bool(Array<bool>),
    Additive(Array<f32>),
}

pub fn read_mask(path: &Path) -> Result<MaskArray, CliError> {
    let npy = open(path)?;
    match kind(&npy).as_str() {
        "b1" => Ok(MaskArray::Bool(read_as::<bool>(path, npy)?)),
        "f4" => Ok(MaskArray::Additive(read_as::<f32>(path, npy)?)),
        other => Err(CliError::bad(format!(
            "{}: mask dtype {other} is not bool or float32",
            path.display()
        ))),
    }
}

/// Encodes a float32 array as `.npy` bytes.
pub fn encode_f32(shape: &[usize], data: &[f32]) -> Result<Vec<u8>, CliError> {
    use npyz::WriterBuilder;
    let mut bytes = Vec::new();
    let shape: Vec<u64> = shape.iter().map(|&n| n as u64).collect();
    let mut writer = npyz::WriteOptions::new()
        .default_dtype()
        .shape(&shape)
        .writer(&mut bytes)
        .begin_nd()
        .map_err(|e| CliError::bad(format!("cannot encode .npy: {e}")))?;
    writer
        .extend(data.iter().copied())
        .map_err(|e| CliError::bad(format!("cannot encode .npy: {e}")))?;
    writer
        .finish()
        .map_err(|e| CliError::bad(format!("cannot encode .npy: {e}")))?;
    Ok(bytes)
}

/// Refuses values that f16 arithmetic would turn into infinities (|x| > 65504, f16's
/// largest finite value), naming the file, the first such value and `why` f16 is used.
pub fn check_f16_range(path: &Path, data: &[f32], why: &str) -> Result<(), CliError> {
    let max = f32::from(f16::MAX);
    match data.iter().position(|x| x.is_finite() && x.abs() > max) {
        None => Ok(()),
        Some(i) => Err(CliError::bad(format!(
            "{}: value {} at flat index {i} is beyond f16's range (|x| <= {max}), which {why} needs",
            path.display(),
            data[i]
        ))),
    }
}
