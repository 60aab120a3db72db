//! A Vulkan driver's compiler, asked what it made of a module: plain Vulkan through
//! `ash` (the binding wgpu-hal already builds), because wgpu cannot open a device on
//! RADV's null hardware (its first submission fails) and exposes no pipeline statistics.
//!
//! One device per [`Compiler`], every feature the driver reports enabled, each module's
//! pipeline built with `VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR` and read back with
//! `VK_KHR_pipeline_executable_properties`.

// The one module of the crate that calls Vulkan directly: every call is `unsafe` in ash.
// Each takes handles this module created and still owns (destroyed in reverse order in
// `Drop` or at the end of `compile`), and structs built on the stack that outlive the call.
#![allow(unsafe_code)]

use super::spirv::{BindingKind, Spirv};
use ash::vk;
use std::ffi::CStr;

/// One statistic as the driver names it (`VGPRs`, `Spilled VGPRs`, `Scratch size`, ...).
#[derive(Clone, Debug, PartialEq)]
pub struct Statistic {
    pub name: String,
    pub value: f64,
}

/// What the driver reports for one executable of a pipeline (a compute pipeline has one).
#[derive(Clone, Debug, PartialEq)]
pub struct Executable {
    pub name: String,
    pub subgroup_size: u32,
    pub statistics: Vec<Statistic>,
}

/// The adapter a [`Compiler`] runs on.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    pub name: String,
    pub driver: String,
    pub subgroup_sizes: (u32, u32),
    pub cooperative_matrix: bool,
    /// Robust access as wgpu-hal enables it, which decides the bounds checks it writes.
    pub robust: super::spirv::Robustness,
}

/// A device on one Vulkan adapter, for compiling pipelines and reading their statistics.
pub struct Compiler {
    _entry: ash::Entry,
    instance: ash::Instance,
    device: ash::Device,
    executables: ash::khr::pipeline_executable_properties::Device,
    pub info: DeviceInfo,
    subgroup_size_control: bool,
}

fn vk_error(what: &str) -> impl Fn(vk::Result) -> String + '_ {
    move |e| format!("{what}: {e}")
}

fn c_string(chars: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = chars.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

impl Compiler {
    /// Opens the first Vulkan adapter whose name contains `name` (any adapter when
    /// `None`), with statistics capture. Errors say what is missing.
    pub fn open(name: Option<&str>) -> Result<Self, String> {
        // SAFETY: loads the system's Vulkan loader; nothing else runs Vulkan in this process.
        let entry = unsafe { ash::Entry::load() }.map_err(|e| format!("no Vulkan loader (libvulkan.so.1): {e}"))?;
        let app = vk::ApplicationInfo::default()
            .application_name(c"wgpu-attention isa")
            .api_version(vk::API_VERSION_1_3);
        // SAFETY: a valid create info that lives across the call.
        let instance =
            unsafe { entry.create_instance(&vk::InstanceCreateInfo::default().application_info(&app), None) }
                .map_err(vk_error("vkCreateInstance"))?;
        match Self::open_device(&instance, name) {
            Ok((device, info, subgroup_size_control)) => Ok(Compiler {
                executables: ash::khr::pipeline_executable_properties::Device::new(&instance, &device),
                _entry: entry,
                instance,
                device,
                info,
                subgroup_size_control,
            }),
            Err(e) => {
                // SAFETY: the instance has no children (no device was made), and the
                // loader (`entry`) is still loaded.
                unsafe { instance.destroy_instance(None) };
                Err(e)
            }
        }
    }

    /// The device on the chosen adapter, its description and whether it can require a
    /// subgroup size.
    fn open_device(instance: &ash::Instance, name: Option<&str>) -> Result<(ash::Device, DeviceInfo, bool), String> {
        // SAFETY: a live instance.
        let physical =
            unsafe { instance.enumerate_physical_devices() }.map_err(vk_error("vkEnumeratePhysicalDevices"))?;
        let mut seen = Vec::new();
        let mut chosen = None;
        for &pd in &physical {
            // SAFETY: pd comes from this instance.
            let props = unsafe { instance.get_physical_device_properties(pd) };
            let device_name = c_string(&props.device_name);
            if chosen.is_none() && name.is_none_or(|n| device_name.to_lowercase().contains(&n.to_lowercase())) {
                chosen = Some((pd, props));
            }
            seen.push(device_name);
        }
        let Some((pd, props)) = chosen else {
            return Err(format!(
                "no Vulkan adapter{} (the loader lists: {})",
                name.map(|n| format!(" named like '{n}'")).unwrap_or_default(),
                if seen.is_empty() {
                    "none".to_string()
                } else {
                    seen.join(", ")
                }
            ));
        };
        let device_name = c_string(&props.device_name);
        if props.api_version < vk::API_VERSION_1_3 {
            return Err(format!(
                "{device_name} offers Vulkan {}.{}; isa needs 1.3",
                vk::api_version_major(props.api_version),
                vk::api_version_minor(props.api_version)
            ));
        }
        // SAFETY: pd comes from this instance.
        let extensions = unsafe { instance.enumerate_device_extension_properties(pd) }
            .map_err(vk_error("vkEnumerateDeviceExtensionProperties"))?;
        let has = |ext: &CStr| extensions.iter().any(|e| e.extension_name_as_c_str() == Ok(ext));
        if !has(ash::khr::pipeline_executable_properties::NAME) {
            return Err(format!(
                "{device_name} does not report pipeline statistics (no VK_KHR_pipeline_executable_properties)"
            ));
        }
        let coop_ext = has(ash::khr::cooperative_matrix::NAME);
        let robustness2_ext = has(ash::ext::robustness2::NAME);

        // Every feature the driver reports, in the structs the kernels can touch: queried
        // through one chain, then enabled through a fresh one (a chain is rebuilt from
        // unlinked structs).
        let mut coop = vk::PhysicalDeviceCooperativeMatrixFeaturesKHR::default();
        let mut robustness2 = vk::PhysicalDeviceRobustness2FeaturesEXT::default();
        let mut exe = vk::PhysicalDevicePipelineExecutablePropertiesFeaturesKHR::default();
        let mut v13 = vk::PhysicalDeviceVulkan13Features::default();
        let mut v12 = vk::PhysicalDeviceVulkan12Features::default();
        let mut v11 = vk::PhysicalDeviceVulkan11Features::default();
        let core = {
            let mut query = vk::PhysicalDeviceFeatures2::default()
                .push_next(&mut v11)
                .push_next(&mut v12)
                .push_next(&mut v13)
                .push_next(&mut exe);
            if coop_ext {
                query = query.push_next(&mut coop);
            }
            if robustness2_ext {
                query = query.push_next(&mut robustness2);
            }
            // SAFETY: pd comes from this instance; the chain holds live structs.
            unsafe { instance.get_physical_device_features2(pd, &mut query) };
            query.features
        };
        let coop_supported = coop_ext && coop.cooperative_matrix == vk::TRUE;
        // wgpu-hal's private caps (adapter.rs): robustBufferAccess2 takes the buffer
        // checks away; robustImageAccess2, else Vulkan 1.3's robustImageAccess, the image
        // ones.
        let robust = super::spirv::Robustness {
            buffers: robustness2_ext && robustness2.robust_buffer_access2 == vk::TRUE,
            images: if robustness2_ext {
                robustness2.robust_image_access2 == vk::TRUE
            } else {
                v13.robust_image_access == vk::TRUE
            },
        };
        let subgroup_size_control = v13.subgroup_size_control == vk::TRUE;
        for next in [
            &mut coop.p_next,
            &mut robustness2.p_next,
            &mut exe.p_next,
            &mut v13.p_next,
            &mut v12.p_next,
            &mut v11.p_next,
        ] {
            *next = std::ptr::null_mut();
        }
        let mut features = vk::PhysicalDeviceFeatures2::default()
            .features(core)
            .push_next(&mut v11)
            .push_next(&mut v12)
            .push_next(&mut v13)
            .push_next(&mut exe);
        if coop_supported {
            features = features.push_next(&mut coop);
        }
        if robustness2_ext {
            features = features.push_next(&mut robustness2);
        }
        let mut subgroup = vk::PhysicalDeviceSubgroupSizeControlProperties::default();
        let mut subgroup_props = vk::PhysicalDeviceVulkan11Properties::default();
        let mut driver = vk::PhysicalDeviceDriverProperties::default();
        let mut properties = vk::PhysicalDeviceProperties2::default()
            .push_next(&mut subgroup)
            .push_next(&mut subgroup_props)
            .push_next(&mut driver);
        // SAFETY: as above.
        unsafe { instance.get_physical_device_properties2(pd, &mut properties) };
        let info = DeviceInfo {
            name: device_name,
            driver: format!("{} {}", c_string(&driver.driver_name), c_string(&driver.driver_info)),
            subgroup_sizes: (subgroup.min_subgroup_size, subgroup.max_subgroup_size),
            cooperative_matrix: coop_supported,
            robust,
        };

        let mut names = vec![ash::khr::pipeline_executable_properties::NAME.as_ptr()];
        if info.cooperative_matrix {
            names.push(ash::khr::cooperative_matrix::NAME.as_ptr());
        }
        if robustness2_ext {
            names.push(ash::ext::robustness2::NAME.as_ptr());
        }
        let priorities = [1.0f32];
        let queues = [vk::DeviceQueueCreateInfo::default()
            .queue_family_index(0)
            .queue_priorities(&priorities)];
        let create = vk::DeviceCreateInfo::default()
            .queue_create_infos(&queues)
            .enabled_extension_names(&names)
            .push_next(&mut features);
        // SAFETY: pd comes from this instance; every pointer in `create` outlives the call.
        let device = unsafe { instance.create_device(pd, &create, None) }.map_err(vk_error("vkCreateDevice"))?;
        Ok((device, info, subgroup_size_control))
    }

    /// Builds the compute pipeline of a module's entry point, with a required subgroup
    /// size where `subgroup` asks for one, and returns what the driver reports of it.
    pub fn compile(&self, module: &Spirv, entry: &str, subgroup: Option<u32>) -> Result<Vec<Executable>, String> {
        if let Some(size) = subgroup {
            let (min, max) = self.info.subgroup_sizes;
            if !self.subgroup_size_control || !(min..=max).contains(&size) {
                return Err(format!(
                    "{} cannot require subgroups of {size} (sizes {min}..={max}, control {})",
                    self.info.name, self.subgroup_size_control
                ));
            }
        }
        let mut made = Made::new(&self.device);
        let groups = module.bindings.iter().map(|b| b.group + 1).max().unwrap_or(0);
        for group in 0..groups {
            let bindings: Vec<vk::DescriptorSetLayoutBinding> = module
                .bindings
                .iter()
                .filter(|b| b.group == group)
                .map(|b| {
                    vk::DescriptorSetLayoutBinding::default()
                        .binding(b.binding)
                        .descriptor_type(match b.kind {
                            BindingKind::StorageBuffer => vk::DescriptorType::STORAGE_BUFFER,
                            BindingKind::UniformBuffer => vk::DescriptorType::UNIFORM_BUFFER,
                            BindingKind::SampledImage => vk::DescriptorType::SAMPLED_IMAGE,
                            BindingKind::StorageImage => vk::DescriptorType::STORAGE_IMAGE,
                            BindingKind::Sampler => vk::DescriptorType::SAMPLER,
                        })
                        .descriptor_count(1)
                        .stage_flags(vk::ShaderStageFlags::COMPUTE)
                })
                .collect();
            let info = vk::DescriptorSetLayoutCreateInfo::default().bindings(&bindings);
            // SAFETY: a live device and a create info that outlives the call.
            let layout = unsafe { self.device.create_descriptor_set_layout(&info, None) }
                .map_err(vk_error("vkCreateDescriptorSetLayout"))?;
            made.set_layouts.push(layout);
        }
        let info = vk::PipelineLayoutCreateInfo::default().set_layouts(&made.set_layouts);
        // SAFETY: as above; the set layouts are live.
        made.layout =
            unsafe { self.device.create_pipeline_layout(&info, None) }.map_err(vk_error("vkCreatePipelineLayout"))?;
        let info = vk::ShaderModuleCreateInfo::default().code(&module.words);
        // SAFETY: as above; the words are a whole SPIR-V module naga wrote.
        made.module =
            unsafe { self.device.create_shader_module(&info, None) }.map_err(vk_error("vkCreateShaderModule"))?;
        let entry_name = std::ffi::CString::new(entry).map_err(|_| format!("entry point '{entry}' holds a NUL"))?;
        let mut required = vk::PipelineShaderStageRequiredSubgroupSizeCreateInfo::default()
            .required_subgroup_size(subgroup.unwrap_or(0));
        let mut stage = vk::PipelineShaderStageCreateInfo::default()
            .stage(vk::ShaderStageFlags::COMPUTE)
            .module(made.module)
            .name(&entry_name);
        if subgroup.is_some() {
            stage = stage.push_next(&mut required);
        }
        let create = vk::ComputePipelineCreateInfo::default()
            .flags(vk::PipelineCreateFlags::CAPTURE_STATISTICS_KHR)
            .stage(stage)
            .layout(made.layout);
        // SAFETY: as above.
        let pipelines = unsafe {
            self.device
                .create_compute_pipelines(vk::PipelineCache::null(), &[create], None)
        }
        .map_err(|(_, e)| format!("vkCreateComputePipelines: {e}"))?;
        made.pipeline = pipelines.first().copied().unwrap_or_default();
        let pipeline_info = vk::PipelineInfoKHR::default().pipeline(made.pipeline);
        // SAFETY: a live pipeline built with statistics capture.
        let executables = unsafe { self.executables.get_pipeline_executable_properties(&pipeline_info) }
            .map_err(vk_error("vkGetPipelineExecutablePropertiesKHR"))?;
        let mut out = Vec::new();
        for (index, executable) in executables.iter().enumerate() {
            let info = vk::PipelineExecutableInfoKHR::default()
                .pipeline(made.pipeline)
                .executable_index(index as u32);
            // SAFETY: as above; the index is one the driver listed.
            let statistics = unsafe { self.executables.get_pipeline_executable_statistics(&info) }
                .map_err(vk_error("vkGetPipelineExecutableStatisticsKHR"))?;
            out.push(Executable {
                name: c_string(&executable.name),
                subgroup_size: executable.subgroup_size,
                statistics: statistics.iter().filter_map(statistic).collect(),
            });
        }
        Ok(out)
    }
}

/// A statistic's value as a number (booleans as 0 and 1).
fn statistic(s: &vk::PipelineExecutableStatisticKHR) -> Option<Statistic> {
    // SAFETY: the union field read is the one `format` names.
    let value = unsafe {
        match s.format {
            vk::PipelineExecutableStatisticFormatKHR::BOOL32 => f64::from(s.value.b32),
            vk::PipelineExecutableStatisticFormatKHR::INT64 => s.value.i64 as f64,
            vk::PipelineExecutableStatisticFormatKHR::UINT64 => s.value.u64 as f64,
            vk::PipelineExecutableStatisticFormatKHR::FLOAT64 => s.value.f64,
            _ => return None,
        }
    };
    Some(Statistic {
        name: c_string(&s.name),
        value,
    })
}

/// The objects one `compile` made, destroyed when it returns, whatever it returns.
struct Made<'a> {
    device: &'a ash::Device,
    set_layouts: Vec<vk::DescriptorSetLayout>,
    layout: vk::PipelineLayout,
    module: vk::ShaderModule,
    pipeline: vk::Pipeline,
}

impl<'a> Made<'a> {
    fn new(device: &'a ash::Device) -> Self {
        Made {
            device,
            set_layouts: Vec::new(),
            layout: vk::PipelineLayout::null(),
            module: vk::ShaderModule::null(),
            pipeline: vk::Pipeline::null(),
        }
    }
}

impl Drop for Made<'_> {
    fn drop(&mut self) {
        // SAFETY: each handle is null or was made on this device and is used by nothing
        // else (no command buffer ever records these pipelines); null handles are ignored.
        unsafe {
            self.device.destroy_pipeline(self.pipeline, None);
            self.device.destroy_shader_module(self.module, None);
            self.device.destroy_pipeline_layout(self.layout, None);
            for &layout in &self.set_layouts {
                self.device.destroy_descriptor_set_layout(layout, None);
            }
        }
    }
}

impl Drop for Compiler {
    fn drop(&mut self) {
        // SAFETY: every pipeline and its objects were destroyed by `Made`; the device and
        // instance are destroyed last, in that order.
        unsafe {
            self.device.destroy_device(None);
            self.instance.destroy_instance(None);
        }
    }
}
