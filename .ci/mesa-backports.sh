#!/usr/bin/env bash
# Unpacks lavapipe from Mesa 25 (Debian bookworm-backports) into its own prefix, beside
# the system's Mesa, without installing or changing any system package, and writes
# PREFIX/env.sh, which selects it:
#
#   .ci/mesa-backports.sh /opt/mesa25 && . /opt/mesa25/env.sh && wgpu-attention info
#
# apt runs with private source and state directories under PREFIX, so the system's
# package lists stay as they were. Exits non-zero with one line on stderr when the
# suite cannot be reached or the packages do not unpack (CI then goes on without it).
# See docs/ci.md.
set -euo pipefail

prefix="${1:?usage: mesa-backports.sh PREFIX}"
suite="${MESA_BACKPORTS_SUITE:-bookworm-backports}"
mirror="${MESA_BACKPORTS_MIRROR:-http://deb.debian.org/debian}"
# lavapipe and the libdrm it was built against (older libdrm lacks symbols it uses).
packages=(mesa-vulkan-drivers libdrm2 libdrm-amdgpu1)

fail() {
  echo "mesa-backports: $*" >&2
  exit 1
}

mkdir -p "$prefix"
prefix="$(cd "$prefix" && pwd)"
apt_dir="$prefix/apt"
rm -rf "$apt_dir"
mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$apt_dir/debs"
echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror $suite main" \
  >"$apt_dir/sources.list"
apt_opts=(
  -o "Dir::Etc::SourceList=$apt_dir/sources.list"
  -o "Dir::Etc::SourceParts=/dev/null"
  -o "Dir::State::Lists=$apt_dir/lists"
  -o "Dir::Cache=$apt_dir/cache"
  -o "Acquire::Retries=2"
  -o "Acquire::http::Timeout=20"
  -o "APT::Sandbox::User=root"
)

# apt-get update exits 0 when a source cannot be fetched; the lists tell.
apt-get "${apt_opts[@]}" -qq update >"$apt_dir/update.log" 2>&1 || true
compgen -G "$apt_dir/lists/*_Packages*" >/dev/null ||
  fail "cannot reach $suite at $mirror ($(grep -m1 -E '^(E|W):' "$apt_dir/update.log" || echo 'no package list'))"
(
  cd "$apt_dir/debs"
  apt-get "${apt_opts[@]}" -qq download "${packages[@]/%//$suite}" >"$apt_dir/download.log" 2>&1
) || fail "cannot download ${packages[*]} from $suite ($(tail -n1 "$apt_dir/download.log"))"

root="$prefix/root"
rm -rf "$root"
for deb in "$apt_dir"/debs/*.deb; do
  dpkg-deb -x "$deb" "$root" || fail "cannot unpack $(basename "$deb")"
done

lib="$(find "$root" -name libvulkan_lvp.so -print -quit)"
[ -n "$lib" ] || fail "no libvulkan_lvp.so in the unpacked packages"
libdir="$(dirname "$lib")"
version="$(dpkg-deb -f "$apt_dir"/debs/mesa-vulkan-drivers_*.deb Version)"

# The packaged ICD names the library without a path; point at ours explicitly.
cat >"$prefix/lvp_icd.json" <<EOF
{
    "file_format_version": "1.0.0",
    "ICD": { "library_path": "$lib", "api_version": "1.3.0" }
}
EOF
cat >"$prefix/env.sh" <<EOF
# lavapipe from mesa-vulkan-drivers $version ($suite), unpacked by .ci/mesa-backports.sh
export VK_DRIVER_FILES="$prefix/lvp_icd.json"
export VK_ICD_FILENAMES="$prefix/lvp_icd.json"
export LD_LIBRARY_PATH="$libdir\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export MESA_BACKPORTS_VERSION="$version"
EOF
echo "mesa-backports: lavapipe $version in $prefix"
