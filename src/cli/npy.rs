//! `.npy` input and output for the CLI: typed reads with clear errors, and writes that
//! never leave a partial file behind (temp file, then rename, for regular files;
//! links, devices and FIFOs are written through).

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
    // The header's element count must not overflow, and its data must fit in the file:
    // never allocate more than the file justifies (a truncated or hostile header).
    let dims: Vec<usize> = npy
        .shape()
        .iter()
        .map(|&n| usize::try_from(n).unwrap_or(usize::MAX))
        .collect();
    let count = wgpu_attention::error::checked_product("array shape", &dims)
        .map_err(|e| CliError::bad(format!("{}: {e}", path.display())))?;
    let item = match npy.dtype() {
        npyz::DType::Plain(t) => t.num_bytes().unwrap_or(1),
        _ => 1,
    };
    let data_len = data_bytes(path);
    if (count as u128) * (item as u128) > u128::from(data_len) {
        return Err(CliError::bad(format!(
            "{}: the header claims {dims:?} ({count} elements of {item} bytes) but the file holds {data_len} bytes of data",
            path.display()
        )));
    }
    if npy.order() != npyz::Order::C {
        return Err(CliError::bad(format!(
            "{}: Fortran-order arrays are not supported; save it in C order",
            path.display()
        )));
    }
    Ok(npy)
}

/// Bytes after the header of a `.npy` file (whose header npyz has already parsed):
/// magic and version (8 bytes), then the header length as u16 (version 1) or u32.
fn data_bytes(path: &Path) -> u64 {
    use std::io::Read;
    let mut head = [0u8; 12];
    let read = std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut head));
    let file_len = std::fs::metadata(path).map_or(0, |m| m.len());
    if read.is_err() {
        return file_len;
    }
    let header_end = if head[6] == 1 {
        10 + u64::from(u16::from_le_bytes([head[8], head[9]]))
    } else {
        12 + u64::from(u32::from_le_bytes([head[8], head[9], head[10], head[11]]))
    };
    file_len.saturating_sub(header_end)
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

/// How an output path is written.
enum Target {
    /// A regular file, or nothing yet: written to a temporary sibling, then renamed
    /// into place, so a failed run leaves no partial file.
    Replace,
    /// A symlink, device or FIFO (`/dev/stdout` in a pipeline): written through, since
    /// renaming over it would replace the link or the device node itself.
    Through,
    /// `-`: standard output.
    Stdout,
}

fn target(path: &Path) -> Result<Target, CliError> {
    if path.as_os_str() == "-" {
        return Ok(Target::Stdout);
    }
    match std::fs::symlink_metadata(path) {
        Err(_) => Ok(Target::Replace),
        Ok(m) if m.file_type().is_file() => Ok(Target::Replace),
        Ok(m) if m.is_dir() => Err(CliError::bad(format!(
            "cannot write {}: it is a directory",
            path.display()
        ))),
        Ok(_) => match std::fs::metadata(path) {
            Ok(m) if m.is_dir() => Err(CliError::bad(format!(
                "cannot write {}: it links to a directory",
                path.display()
            ))),
            _ => Ok(Target::Through),
        },
    }
}

/// Checks a command's output paths before any work: each must be writable
/// ([`check_writable`]), and `-` (standard output) may name one of them, and only where
/// the command prints nothing else there (`stdout_free`).
pub fn check_outputs(paths: &[&Path], stdout_free: bool) -> Result<(), CliError> {
    let dashes = paths.iter().filter(|p| p.as_os_str() == "-").count();
    if dashes > 0 && !stdout_free {
        return Err(CliError::bad(
            "'-' (standard output) cannot take an output here: this command prints its report there",
        ));
    }
    if dashes > 1 {
        return Err(CliError::bad("only one output can be '-' (standard output)"));
    }
    paths.iter().try_for_each(|p| check_writable(p))
}

/// Refuses, before any work is done, an output path that could not be written: a
/// directory, or a new file in a directory that does not exist.
pub fn check_writable(path: &Path) -> Result<(), CliError> {
    if let Target::Stdout = target(path)? {
        return Ok(());
    }
    if std::fs::symlink_metadata(path).is_err() {
        let parent = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        if !parent.is_dir() {
            return Err(CliError::bad(format!(
                "cannot write {}: {} is not a directory",
                path.display(),
                parent.display()
            )));
        }
    }
    Ok(())
}

fn temp_sibling(path: &Path) -> std::path::PathBuf {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".partial");
    std::path::PathBuf::from(tmp)
}

/// Writes all files or, as far as the targets allow, none: regular files go to a
/// temporary sibling first and are renamed into place only when every write
/// succeeded; links, devices and FIFOs are written through (after every temporary file
/// is written, before any rename). Any failure removes every temporary file and names
/// the path.
pub fn write_all<P: AsRef<Path>>(files: &[(P, Vec<u8>)]) -> Result<(), CliError> {
    let targets = files
        .iter()
        .map(|(path, _)| target(path.as_ref()))
        .collect::<Result<Vec<_>, _>>()?;
    if targets.iter().filter(|t| matches!(t, Target::Stdout)).count() > 1 {
        return Err(CliError::bad("only one output can be '-' (standard output)"));
    }
    let mut temps = Vec::new();
    let cleanup = |temps: &[std::path::PathBuf]| {
        for t in temps {
            let _ = std::fs::remove_file(t);
        }
    };
    let fail = |path: &Path, e: std::io::Error| CliError::bad(format!("cannot write {}: {e}", path.display()));
    for ((path, bytes), target) in files.iter().zip(&targets) {
        if let Target::Replace = target {
            let tmp = temp_sibling(path.as_ref());
            if let Err(e) = std::fs::write(&tmp, bytes) {
                let _ = std::fs::remove_file(&tmp);
                cleanup(&temps);
                return Err(fail(path.as_ref(), e));
            }
            temps.push(tmp);
        }
    }
    for ((path, bytes), target) in files.iter().zip(&targets) {
        if let Target::Stdout = target {
            let mut out = std::io::stdout().lock();
            let written = std::io::Write::write_all(&mut out, bytes).and_then(|()| std::io::Write::flush(&mut out));
            if let Err(e) = written {
                cleanup(&temps);
                return Err(fail(path.as_ref(), e));
            }
        }
        if let Target::Through = target {
            // ENOSPC from /dev/full, EPIPE from a closed pipe: an error, not exit 0.
            // Truncate (a linked regular file longer than the output keeps no old tail)
            // and create (a dangling link makes its target), as fs::write would.
            let written = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(path.as_ref())
                .and_then(|mut f| {
                    std::io::Write::write_all(&mut f, bytes).and_then(|()| std::io::Write::flush(&mut f))
                });
            if let Err(e) = written {
                cleanup(&temps);
                return Err(fail(path.as_ref(), e));
            }
        }
    }
    let regular = files.iter().zip(&targets).filter(|(_, t)| matches!(t, Target::Replace));
    for (i, ((path, _), _)) in regular.enumerate() {
        if let Err(e) = std::fs::rename(&temps[i], path.as_ref()) {
            cleanup(&temps[i..]);
            return Err(fail(path.as_ref(), e));
        }
    }
    Ok(())
}
