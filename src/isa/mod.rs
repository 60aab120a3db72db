//! What a GPU compiler makes of each kernel: registers, spills, scratch, occupancy and
//! instruction counts, as the driver reports them through
//! `VK_KHR_pipeline_executable_properties` (docs/isa.md). Works on any Vulkan driver
//! that has the extension, and with no GPU at all on RADV's null hardware (Mesa's AMD
//! driver compiling for a family that is not there: [`radv`]).
//!
//! The SPIR-V is the one wgpu-hal writes for our pipelines on that device
//! ([`spirv::write`], with the device's robust access), so the figures are those of the
//! code a GPU runs.

pub mod budget;
pub mod kernels;
pub mod radv;
pub mod spirv;
pub mod vulkan;

pub use spirv::RuntimeChecks;

/// One kernel's row: what the driver reported, or why it could not compile.
#[derive(Clone, Debug)]
pub struct Row {
    pub label: String,
    pub checks: RuntimeChecks,
    /// The subgroup size required of the driver, if any.
    pub required_subgroup: Option<u32>,
    pub result: Result<vulkan::Executable, String>,
}

impl Row {
    /// A statistic by the driver's name (`VGPRs`, `Spilled VGPRs`, `Scratch size`, ...).
    pub fn stat(&self, name: &str) -> Option<f64> {
        let exe = self.result.as_ref().ok()?;
        exe.statistics.iter().find(|s| s.name == name).map(|s| s.value)
    }
}

/// Compiles one kernel with `checks` on `compiler`. A compute pipeline has one
/// executable; a driver that reports more gets its first (the table says which).
pub fn compile(compiler: &vulkan::Compiler, kernel: &kernels::IsaKernel, checks: RuntimeChecks) -> Row {
    let result = (|| {
        let constants: Vec<(&str, f64)> = kernel
            .constants
            .iter()
            .map(|(n, v)| (n.as_str(), f64::from(*v)))
            .collect();
        let module = spirv::write(
            &kernel.source,
            &kernel.entry,
            &constants,
            checks,
            compiler.info.robust,
            false,
        )?;
        let mut executables = compiler.compile(&module, &kernel.entry, kernel.subgroup)?;
        if executables.is_empty() {
            return Err("the driver reported no executable".to_string());
        }
        Ok(executables.swap_remove(0))
    })();
    Row {
        label: kernel.label.clone(),
        checks,
        required_subgroup: kernel.subgroup,
        result,
    }
}
