//! What an adapter can do, detected once: f16, subgroups, timestamps, limits and
//! cooperative-matrix configurations.

use super::adapter::mesa_version;

/// The largest binding the kernels can index: they address elements (2 or 4 bytes)
/// with u32 arithmetic, so a binding under 2^32 bytes keeps every index, and the sum of
/// two, below 2^32. Vulkan and DX12 report at most this; Metal reports its
/// `maxBufferLength`, often more, which would wrap indices silently.
pub const MAX_INDEXED_BINDING: u64 = u32::MAX as u64;

/// What the device can do, detected once when the context is made.
#[derive(Clone, Debug)]
pub struct Capabilities {
    /// `SHADER_F16` is enabled: f16 storage and arithmetic in shaders.
    pub f16: bool,
    /// Subgroup operations are enabled; `(min, max)` subgroup size.
    pub subgroups: Option<(u32, u32)>,
    /// `SUBGROUP_BARRIER` is enabled: `subgroupBarrier()` in compute shaders.
    pub subgroup_barrier: bool,
    /// Timestamp queries are enabled.
    pub timestamps: bool,
    /// Bytes of workgroup memory one workgroup may use.
    pub max_workgroup_storage: u32,
    /// Largest storage buffer binding in bytes: the device's limit, capped at
    /// [`MAX_INDEXED_BINDING`].
    pub max_storage_binding: u64,
    /// Largest buffer in bytes.
    pub max_buffer: u64,
    /// Largest workgroup count along one dispatch dimension.
    pub max_workgroups_per_dim: u32,
    /// Largest number of invocations in one workgroup.
    pub max_invocations: u32,
    /// Largest width and height of a 2D texture, in texels.
    pub max_texture_dim: u32,
    /// Largest number of layers of a 2D-array texture.
    pub max_texture_layers: u32,
    /// Cooperative-matrix (tensor core) configurations the device may use: empty unless
    /// `EXPERIMENTAL_COOPERATIVE_MATRIX` is enabled on it and the adapter listed them.
    pub cooperative_matrix: Vec<CoopConfig>,
    /// The cooperative-matrix kernels run with their coop operations emulated in plain
    /// WGSL ([`crate::Gpu::emulate_cooperative_matrix`]; CI on adapters without tensor cores).
    pub coop_emulated: bool,
    /// Loop iterations one invocation may run before the driver ends its loops (Mesa's
    /// llvmpipe up to 22.x: 65535), as [`crate::kernels::loop_probe`] observed on a CPU
    /// adapter; `None` where loops run to the end (GPUs, Mesa 25's lavapipe).
    pub loop_cap: Option<u64>,
    /// The Mesa release (major, minor) of a Mesa driver, from the adapter's driver
    /// info (`Mesa 22.3.6 (LLVM 15.0.6)`): some tilings run best differently per release.
    pub mesa_version: Option<(u32, u32)>,
    /// The adapter is a CPU driver (lavapipe, llvmpipe, SwiftShader, WARP): register
    /// pressure and unrolled loops cost there what they save on a GPU.
    pub cpu: bool,
}

#[cfg(test)]
impl Capabilities {
    /// A generous adapter for the tilings' unit tests, with these subgroup sizes,
    /// workgroup memory and Mesa release.
    pub(crate) fn for_tests(
        subgroups: Option<(u32, u32)>,
        max_workgroup_storage: u32,
        mesa_version: Option<(u32, u32)>,
    ) -> Self {
        Capabilities {
            f16: true,
            subgroups,
            subgroup_barrier: subgroups.is_some(),
            timestamps: true,
            max_workgroup_storage,
            max_storage_binding: 1 << 30,
            max_buffer: 1 << 30,
            max_workgroups_per_dim: 65535,
            max_invocations: 256,
            max_texture_dim: 16384,
            max_texture_layers: 2048,
            cooperative_matrix: Vec::new(),
            coop_emulated: false,
            loop_cap: None,
            mesa_version,
            cpu: false,
        }
    }
}

/// One cooperative-matrix configuration: `M x N x K` tiles with A/B elements of `ab`
/// and accumulator elements of `c` (`"f16"`, `"f32"`, ...).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CoopConfig {
    /// Rows of A and of the accumulator.
    pub m: u32,
    /// Columns of B and of the accumulator.
    pub n: u32,
    /// The shared dimension: columns of A, rows of B.
    pub k: u32,
    /// Element type of A and B.
    pub ab: &'static str,
    /// Element type of the accumulator.
    pub c: &'static str,
}

impl CoopConfig {
    /// The configuration wgpu reports as `p`.
    pub fn of(p: &wgpu::CooperativeMatrixProperties) -> Self {
        let name = |t: wgpu::CooperativeScalarType| match t {
            wgpu::CooperativeScalarType::F32 => "f32",
            wgpu::CooperativeScalarType::F16 => "f16",
            wgpu::CooperativeScalarType::I32 => "i32",
            wgpu::CooperativeScalarType::U32 => "u32",
            #[allow(unreachable_patterns)]
            _ => "other",
        };
        CoopConfig {
            m: p.m_size,
            n: p.n_size,
            k: p.k_size,
            ab: name(p.ab_type),
            c: name(p.cr_type),
        }
    }

    /// What `info` and `bench` print: `16x16x16 f16->f32`.
    pub fn label(&self) -> String {
        format!("{}x{}x{} {}->{}", self.m, self.n, self.k, self.ab, self.c)
    }

    /// Labels as one line: comma-separated, or `none`.
    pub fn summary<S: AsRef<str>>(labels: &[S]) -> String {
        if labels.is_empty() {
            return "none".into();
        }
        labels.iter().map(AsRef::as_ref).collect::<Vec<_>>().join(", ")
    }
}

impl Capabilities {
    /// The subgroup size the tensor-core kernels run with (their `SG` override), if the
    /// device can run them: the 16x16x16 f16->f32 cooperative-matrix configuration, f16,
    /// one fixed subgroup size (the kernels give each subgroup a band of rows by
    /// `subgroup_id`, so the host must know how many invocations make one), and
    /// `subgroupBarrier` (a band's lanes share its rows of workgroup memory).
    pub fn coop_subgroup_size(&self) -> Option<u32> {
        let tile = CoopConfig {
            m: 16,
            n: 16,
            k: 16,
            ab: "f16",
            c: "f32",
        };
        match self.subgroups {
            Some((min, max))
                if min == max
                    && min > 0
                    && self.f16
                    && self.subgroup_barrier
                    && self.cooperative_matrix.contains(&tile) =>
            {
                Some(min)
            }
            _ => None,
        }
    }

    pub(super) fn detect(device: &wgpu::Device, info: &wgpu::AdapterInfo) -> Self {
        Self::of(info, device.features(), &device.limits())
    }

    /// What a device with these features and limits can do (for an adapter, what a
    /// device made from it with the same features would).
    pub fn of(info: &wgpu::AdapterInfo, features: wgpu::Features, limits: &wgpu::Limits) -> Self {
        Capabilities {
            f16: features.contains(wgpu::Features::SHADER_F16),
            subgroups: features
                .contains(wgpu::Features::SUBGROUP)
                .then_some((info.subgroup_min_size, info.subgroup_max_size)),
            subgroup_barrier: features.contains(wgpu::Features::SUBGROUP | wgpu::Features::SUBGROUP_BARRIER),
            timestamps: features.contains(wgpu::Features::TIMESTAMP_QUERY),
            max_workgroup_storage: limits.max_compute_workgroup_storage_size,
            max_storage_binding: limits.max_storage_buffer_binding_size.min(MAX_INDEXED_BINDING),
            max_buffer: limits.max_buffer_size,
            max_workgroups_per_dim: limits.max_compute_workgroups_per_dimension,
            max_invocations: limits.max_compute_invocations_per_workgroup,
            max_texture_dim: limits.max_texture_dimension_2d,
            max_texture_layers: limits.max_texture_array_layers,
            cooperative_matrix: Vec::new(),
            coop_emulated: false,
            loop_cap: None,
            mesa_version: mesa_version(&info.driver_info),
            cpu: super::is_cpu_adapter(info),
        }
    }
}

/// The token that lets a device enable `EXPERIMENTAL_COOPERATIVE_MATRIX`, when the
/// adapter offers it; otherwise none is asked for.
#[allow(unsafe_code)]
pub(crate) fn experimental_features(features: wgpu::Features) -> wgpu::ExperimentalFeatures {
    if !features.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX) {
        return wgpu::ExperimentalFeatures::disabled();
    }
    // SAFETY: wgpu asks us to acknowledge that its experimental features may have bugs
    // with undefined behaviour. Enabling the feature changes nothing for shaders that do
    // not `enable wgpu_cooperative_matrix`. The two that do (shaders/matmul_coop.wgsl,
    // shaders/flash_coop.wgsl) keep every cooperative load and store inside workgroup
    // arrays they declare (operands are staged there with bounds checks), and the host
    // dispatches them only where `Capabilities::coop_subgroup_size` found the 16x16x16
    // f16->f32 configuration and a fixed subgroup size to set as `SG`.
    unsafe { wgpu::ExperimentalFeatures::enabled() }
}
