//! Output files for every command: checked before any work, written all or none, and
//! never through a link someone planted beside them (docs/design.md, "CLI contract").
//!
//! A regular file (or a new one) is written to a temporary file with a fresh, unique
//! name in its own directory (created exclusively, so a planted link or file with that
//! name is never followed or reused), synced, given the mode of the file it replaces,
//! and renamed over it only once every output has been written. An output that is a
//! link to a regular file replaces the file the link names, and the link stays. Devices
//! and FIFOs (`/dev/stdout` in a pipeline) are written through; `-` is standard output.
//!
//! Renaming makes a new inode: other hard links to a replaced file keep the old
//! contents (as with every editor that saves atomically).

use super::CliError;
use std::path::{Path, PathBuf};

/// How one output path is written.
enum Target {
    /// Replace this regular file (the output, or what its link names) by renaming.
    Replace(PathBuf),
    /// A device, FIFO or dangling link: written through, since renaming over it would
    /// replace the node or the link itself.
    Through,
    /// `-`: standard output.
    Stdout,
}

fn target(path: &Path) -> Result<Target, CliError> {
    if path.as_os_str() == "-" {
        return Ok(Target::Stdout);
    }
    let directory = |how: &str| CliError::bad(format!("cannot write {}: it {how} a directory", path.display()));
    match std::fs::symlink_metadata(path) {
        Err(_) => Ok(Target::Replace(path.to_path_buf())),
        Ok(m) if m.file_type().is_file() => Ok(Target::Replace(path.to_path_buf())),
        Ok(m) if m.is_dir() => Err(directory("is")),
        Ok(m) if m.file_type().is_symlink() => match std::fs::metadata(path) {
            Ok(t) if t.is_dir() => Err(directory("links to")),
            Ok(t) if t.is_file() => {
                let resolved = std::fs::canonicalize(path)
                    .map_err(|e| CliError::bad(format!("cannot resolve {}: {e}", path.display())))?;
                Ok(Target::Replace(resolved))
            }
            _ => Ok(Target::Through),
        },
        Ok(_) => Ok(Target::Through),
    }
}

/// The directory a new or replaced file lives in.
fn parent_of(path: &Path) -> &Path {
    path.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// What makes two paths one file: device and inode where it exists (hard links and
/// links included), else the canonical directory and the name.
#[derive(PartialEq, Eq)]
enum Identity {
    #[cfg(unix)]
    Inode(u64, u64),
    Path(PathBuf),
}

fn identity(path: &Path) -> Option<Identity> {
    if path.as_os_str() == "-" {
        return None;
    }
    #[cfg(unix)]
    if let Ok(m) = std::fs::metadata(path) {
        use std::os::unix::fs::MetadataExt;
        return Some(Identity::Inode(m.dev(), m.ino()));
    }
    // A dangling link is the file it will create: its target, resolved against the
    // link's own directory (one level; a chain of dangling links is compared by its
    // first target).
    let path = match std::fs::read_link(path) {
        Ok(target) => parent_of(path).join(target),
        Err(_) => path.to_path_buf(),
    };
    // A directory that does not exist yet (one `tune --table` makes) is resolved from
    // the nearest one that does.
    let mut dir = parent_of(&path).to_path_buf();
    let mut missing = Vec::new();
    let resolved = loop {
        match std::fs::canonicalize(&dir) {
            Ok(resolved) => break resolved,
            Err(_) => {
                missing.push(dir.file_name()?.to_owned());
                dir = parent_of(&dir).to_path_buf();
            }
        }
    };
    let dir = missing.iter().rev().fold(resolved, |d, name| d.join(name));
    Some(Identity::Path(dir.join(path.file_name()?)))
}

/// Checks a command's output paths before any work: each must be writable, no two may
/// be one file (by any name: links, `./`, hard links), and `-` (standard output) may
/// name one of them, only where the command prints nothing else there (`stdout_free`).
pub fn check_outputs(paths: &[&Path], stdout_free: bool) -> Result<(), CliError> {
    check_outputs_making_dirs(paths, stdout_free, None)
}

/// [`check_outputs`], where `making` (one of `paths`) is written into directories the
/// command makes when it writes it (`tune --table user` on a fresh machine): those may
/// be missing, under a directory that exists. Nothing is made here, so a command
/// refused later leaves the file system as it was.
pub fn check_outputs_making_dirs(paths: &[&Path], stdout_free: bool, making: Option<&Path>) -> Result<(), CliError> {
    let dashes = paths.iter().filter(|p| p.as_os_str() == "-").count();
    if dashes > 0 && !stdout_free {
        return Err(CliError::bad(
            "'-' (standard output) cannot take an output here: this command prints its report there",
        ));
    }
    if dashes > 1 {
        return Err(CliError::bad("only one output can be '-' (standard output)"));
    }
    // One file named twice first: said so, rather than whichever problem either has.
    let ids: Vec<Option<Identity>> = paths.iter().map(|p| identity(p)).collect();
    for (i, a) in ids.iter().enumerate() {
        if let Some(j) = (0..i).find(|&j| a.is_some() && ids[j] == *a) {
            return Err(CliError::bad(format!(
                "{} and {} are the same file: give each output its own path",
                paths[j].display(),
                paths[i].display()
            )));
        }
    }
    paths.iter().try_for_each(|p| check_writable(p, making == Some(*p)))
}

/// Refuses an output path that could not be written: a directory, or a new file in a
/// directory that does not exist (unless `makes_dirs`: then the nearest directory that
/// exists must be one).
fn check_writable(path: &Path, makes_dirs: bool) -> Result<(), CliError> {
    if let Target::Replace(file) = target(path)? {
        let mut parent = parent_of(&file);
        if makes_dirs {
            while !parent.exists() {
                match parent.parent().filter(|p| !p.as_os_str().is_empty()) {
                    Some(up) => parent = up,
                    None => return Ok(()),
                }
            }
        }
        if !parent.is_dir() {
            let what = if parent.exists() {
                "is not a directory"
            } else {
                "does not exist"
            };
            return Err(CliError::bad(format!(
                "cannot write {}: {} {what}",
                path.display(),
                parent.display()
            )));
        }
        // The output is written as a file staged beside it (stage): one that cannot be
        // made there (permissions, a read-only mount) is said now, before a command
        // measures anything, not after. The probe is deleted at once.
        tempfile::Builder::new()
            .prefix(".wgpu-attention-probe.")
            .tempfile_in(parent)
            .map_err(|e| {
                let why = std::io::Error::from(e.kind()); // without the probe's own name
                CliError::bad(format!("cannot write {}: {}: {why}", path.display(), parent.display()))
            })?;
    }
    Ok(())
}

/// A written temporary file waiting to be renamed over its output.
struct Staged {
    /// The temporary's path, its file closed (a call may stage up to 1024 images,
    /// as many as a process usually may keep open).
    file: tempfile::TempPath,
    into: PathBuf,
}

/// Writes `bytes` to a fresh temporary file beside `into`, synced to disk, with the
/// mode of the file it will replace (a new file gets 0666 less the umask, as `open`
/// would give it).
fn stage(into: &Path, bytes: &[u8]) -> std::io::Result<Staged> {
    use std::io::Write;
    let name = into
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let prefix = format!(".{name}.");
    let mut builder = tempfile::Builder::new();
    builder.prefix(&prefix).suffix(".tmp");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        builder.permissions(std::fs::Permissions::from_mode(0o666));
    }
    let mut file = builder.tempfile_in(parent_of(into))?;
    file.write_all(bytes)?;
    if let Ok(existing) = std::fs::metadata(into) {
        file.as_file().set_permissions(existing.permissions())?;
    }
    file.as_file().sync_all()?;
    Ok(Staged {
        file: file.into_temp_path(),
        into: into.to_path_buf(),
    })
}

/// Writes all files or, as far as the targets allow, none: regular files are staged
/// first and renamed into place only when every write succeeded; devices, FIFOs and
/// standard output are written after staging, before any rename. Any failure removes
/// every temporary file and names the path.
pub fn write_all<P: AsRef<Path>>(files: &[(P, Vec<u8>)]) -> Result<(), CliError> {
    let paths: Vec<&Path> = files.iter().map(|(p, _)| p.as_ref()).collect();
    check_outputs(&paths, true)?;
    let targets = paths.iter().map(|p| target(p)).collect::<Result<Vec<_>, _>>()?;
    let fail = |path: &Path, e: std::io::Error| CliError::bad(format!("cannot write {}: {e}", path.display()));
    // Dropping a staged file deletes it: an early return cleans up.
    let mut staged = Vec::new();
    for ((path, bytes), target) in files.iter().zip(&targets) {
        if let Target::Replace(into) = target {
            staged.push(stage(into, bytes).map_err(|e| fail(path.as_ref(), e))?);
        }
    }
    for ((path, bytes), target) in files.iter().zip(&targets) {
        let written = match target {
            Target::Replace(_) => continue,
            Target::Stdout => {
                let mut out = std::io::stdout().lock();
                std::io::Write::write_all(&mut out, bytes).and_then(|()| std::io::Write::flush(&mut out))
            }
            // ENOSPC from /dev/full, EPIPE from a closed pipe: an error, not exit 0.
            // Truncate (a linked regular file longer than the output keeps no old tail)
            // and create (a dangling link makes its target), as fs::write would.
            Target::Through => std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(path.as_ref())
                .and_then(|mut f| {
                    std::io::Write::write_all(&mut f, bytes).and_then(|()| std::io::Write::flush(&mut f))
                }),
        };
        written.map_err(|e| fail(path.as_ref(), e))?;
    }
    for Staged { file, into } in staged {
        file.persist(&into).map_err(|e| fail(&into, e.error))?;
        // The rename itself is durable once its directory is synced.
        if let Ok(dir) = std::fs::File::open(parent_of(&into)) {
            let _ = dir.sync_all();
        }
    }
    Ok(())
}
