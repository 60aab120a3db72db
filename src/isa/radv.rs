//! RADV's null hardware: Mesa's AMD Vulkan driver compiling for an AMD GPU that is not
//! there (`RADV_FORCE_FAMILY=navi31`), through its production compiler (ACO). Nothing
//! runs on it, but pipelines compile and report their statistics.
//!
//! The driver comes from Mesa 25 as `.ci/mesa-backports.sh PREFIX` unpacks it (beside
//! lavapipe): `PREFIX/root/usr/lib/<triple>/libvulkan_radeon.so`. Its libraries (a newer
//! libdrm than the system's) must be found at load time, so the environment is set for a
//! child process ([`environment`]), never changed in this one.

use std::path::{Path, PathBuf};

/// The variable naming the prefix `.ci/mesa-backports.sh` unpacked Mesa 25 into.
pub const PREFIX_VARIABLE: &str = "WGPU_ATTENTION_MESA25";
/// Where `.ci/run` unpacks it, relative to the repository.
pub const DEFAULT_PREFIX: &str = "target/ci/mesa25";

/// The families the tables use: RDNA3 (navi31, navi33, gfx1150) and RDNA4 (gfx1201).
/// RADV accepts more; any name it knows works.
pub const KNOWN_FAMILIES: &[&str] = &["navi31", "navi33", "gfx1150", "gfx1201"];

/// The directory holding Mesa 25's `libvulkan_radeon.so`: under `$WGPU_ATTENTION_MESA25`
/// if set, else under `target/ci/mesa25` (from the working directory, or beside the
/// running program's `target/release`). The error says how to get it.
pub fn find_driver() -> Result<PathBuf, String> {
    let prefixes: Vec<PathBuf> = match std::env::var_os(PREFIX_VARIABLE) {
        Some(p) if !p.is_empty() => vec![PathBuf::from(p)],
        Some(_) => return Err(format!("{PREFIX_VARIABLE} is set but empty: unset it or name a prefix")),
        // The repository's target/ci/mesa25 from its root, or beside this build's
        // target/release.
        None => std::iter::once(PathBuf::from(DEFAULT_PREFIX))
            .chain(
                std::env::current_exe()
                    .ok()
                    .and_then(|exe| Some(exe.parent()?.parent()?.join("ci/mesa25"))),
            )
            .collect(),
    };
    let found = prefixes.iter().find_map(|prefix| {
        std::fs::read_dir(prefix.join("root/usr/lib")).ok().and_then(|dirs| {
            dirs.flatten()
                .map(|d| d.path())
                .find(|d| d.join("libvulkan_radeon.so").is_file())
        })
    });
    let dir = found.ok_or_else(|| {
        let looked: Vec<String> = prefixes.iter().map(|p| p.display().to_string()).collect();
        format!(
            "no Mesa 25 RADV (root/usr/lib/*/libvulkan_radeon.so) under {}: run `.ci/mesa-backports.sh PREFIX` \
             (Debian 12, network to bookworm-backports) with PREFIX target/ci/mesa25, or set {PREFIX_VARIABLE}=PREFIX",
            looked.join(" or ")
        )
    })?;
    std::fs::canonicalize(&dir).map_err(|e| format!("{}: {e}", dir.display()))
}

/// The environment a child process needs to see only RADV's null `family` device:
/// an ICD file (written into `scratch`) naming the driver, the driver's directory first
/// on the library path, and the family.
pub fn environment(driver_dir: &Path, family: &str, scratch: &Path) -> Result<Vec<(String, String)>, String> {
    if family.is_empty() || !family.chars().all(|c| c.is_ascii_alphanumeric()) {
        return Err(format!(
            "--radv-null: '{family}' is not a GPU family name (e.g. {})",
            KNOWN_FAMILIES.join(", ")
        ));
    }
    let library = driver_dir.join("libvulkan_radeon.so");
    let library = library
        .to_str()
        .ok_or_else(|| format!("{}: not a UTF-8 path", library.display()))?;
    let icd = scratch.join("radeon_icd.json");
    let json = format!(
        "{{\"file_format_version\":\"1.0.0\",\"ICD\":{{\"api_version\":\"1.4.305\",\"library_path\":{}}}}}\n",
        json_string(library)
    );
    std::fs::write(&icd, json).map_err(|e| format!("{}: {e}", icd.display()))?;
    let icd = icd.to_string_lossy().into_owned();
    let dir = driver_dir.to_string_lossy().into_owned();
    let library_path = match std::env::var("LD_LIBRARY_PATH") {
        Ok(old) if !old.is_empty() => format!("{dir}:{old}"),
        _ => dir,
    };
    Ok(vec![
        ("VK_DRIVER_FILES".into(), icd.clone()),
        ("VK_ICD_FILENAMES".into(), icd),
        ("LD_LIBRARY_PATH".into(), library_path),
        ("RADV_FORCE_FAMILY".into(), family.to_string()),
    ])
}

/// A JSON string literal (paths may hold quotes or backslashes).
fn json_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Whether a line RADV's null device prints on stderr is its one known warning (it has
/// no PCI bus), not worth showing.
pub fn is_null_device_noise(line: &str) -> bool {
    line.contains("invalid pci bus info")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn family_names_are_checked_and_the_icd_names_the_driver() {
        let scratch = std::env::temp_dir().join(format!("wgpu-attention-radv-test-{}", std::process::id()));
        std::fs::create_dir_all(&scratch).expect("scratch");
        assert!(environment(Path::new("/x"), "navi31; rm", &scratch).is_err());
        assert!(environment(Path::new("/x"), "", &scratch).is_err());
        let env = environment(Path::new("/opt/m\"esa"), "navi31", &scratch).expect("an environment");
        assert!(env.contains(&("RADV_FORCE_FAMILY".to_string(), "navi31".to_string())));
        let icd = std::fs::read_to_string(scratch.join("radeon_icd.json")).expect("written");
        assert!(
            icd.contains(r#""library_path":"/opt/m\"esa/libvulkan_radeon.so""#),
            "{icd}"
        );
        let _ = std::fs::remove_dir_all(&scratch);
    }
}
