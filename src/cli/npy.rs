//! `.npy` input and output for the CLI: typed reads with clear errors, and writes that
//! never leave a partial file behind (temp file, then rename).

use super::CliError;
use half::f16;
use std::path::Path;

/// An array read from a `.npy` file, with its C-order shape.
pub struct Array<T> {
    pub shape: Vec<usize>,
    pub data: Vec<T>,
}

fn open(path: &Path) -> Result<npyz::NpyFile<std::io::BufReader<std::fs::File>>, CliError> {
    let file = std::fs::File::open(path).map_err(|e| CliError::bad(format!("cannot open {}: {e}", path.display())))?;
    let npy = npyz::NpyFile::new(std::io::BufReader::new(file))
        .map_err(|e| CliError::bad(format!("{} is not a valid .npy file: {e}", path.display())))?;
    if npy.order() != npyz::Order::C {
        return Err(CliError::bad(format!(
            "{}: Fortran-order arrays are not supported; save it in C order",
            path.display()
        )));
    }
    Ok(npy)
}

/// The dtype string without its byte-order character (`f4`, `f2`, `b1`, `i4`, `i8`).
fn kind(npy: &npyz::NpyFile<std::io::BufReader<std::fs::File>>) -> String {
    match npy.dtype() {
        npyz::DType::Plain(t) => t.to_string().chars().skip(1).collect(),
        other => format!("{other:?}"),
    }
}

fn read_as<T: npyz::Deserialize>(
    path: &Path,
    npy: npyz::NpyFile<std::io::BufReader<std::fs::File>>,
) -> Result<Array<T>, CliError> {
    let shape = npy.shape().iter().map(|&n| n as usize).collect();
    let data = npy
        .into_vec::<T>()
        .map_err(|e| CliError::bad(format!("cannot read data of {}: {e}", path.display())))?;
    Ok(Array { shape, data })
}

/// Reads a float32 or float16 array as f32.
pub fn read_float(path: &Path) -> Result<Array<f32>, CliError> {
    let npy = open(path)?;
    match kind(&npy).as_str() {
        "f4" => read_as::<f32>(path, npy),
        "f2" => {
            let a = read_as::<f16>(path, npy)?;
            Ok(Array {
                shape: a.shape,
                data: a.data.into_iter().map(f16::to_f32).collect(),
            })
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

/// Writes all files or none: each goes to a temporary sibling first, and only when every
/// one is written are they renamed into place.
pub fn write_all<P: AsRef<Path>>(files: &[(P, Vec<u8>)]) -> Result<(), CliError> {
    let mut temps = Vec::new();
    for (path, bytes) in files {
        let path = path.as_ref();
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".partial");
        let tmp = std::path::PathBuf::from(tmp);
        if let Err(e) = std::fs::write(&tmp, bytes) {
            let _ = std::fs::remove_file(&tmp);
            for t in &temps {
                let _ = std::fs::remove_file(t);
            }
            return Err(CliError::bad(format!("cannot write {}: {e}", path.display())));
        }
        temps.push(tmp);
    }
    for ((path, _), tmp) in files.iter().zip(&temps) {
        let path = path.as_ref();
        std::fs::rename(tmp, path).map_err(|e| CliError::bad(format!("cannot write {}: {e}", path.display())))?;
    }
    Ok(())
}
