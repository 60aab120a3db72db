//! Attention inside an application that owns the device: its own `wgpu::Device`, its own
//! buffers wrapped as tensors without a copy, and the work recorded into its own
//! `CommandEncoder` beside its other passes.
//!
//! `cargo run --release --example own_encoder`

use wgpu_attention::wgpu::{self, util::DeviceExt};
use wgpu_attention::{encode_sdpa, AttentionOptions, Context, DType, Layout, Tensor};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // First, before any thread: keeps Mesa's Vulkan layer quiet on headless machines.
    wgpu_attention::quiet_headless_vulkan();
    // The application's device (here made directly with wgpu, honouring WGPU_BACKEND and
    // WGPU_ADAPTER_NAME; a renderer would have its own).
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    let adapter = pollster::block_on(wgpu::util::initialize_adapter_from_env_or_default(&instance, None))?;
    // Ask for what the kernels can use (f16, subgroups) where the adapter has it.
    let features = adapter.features() & (wgpu::Features::SHADER_F16 | wgpu::Features::SUBGROUP);
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        required_features: features,
        required_limits: adapter.limits(),
        ..Default::default()
    }))?;
    let ctx = Context::from_wgpu(adapter.get_info(), device.clone(), queue.clone());

    // The application's own buffers: STORAGE to be bound, COPY_SRC to be read back.
    let shape = [1, 2, 16, 32];
    let n: usize = shape.iter().product();
    let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC;
    let buffer = |seed: f32| {
        let data: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11 + seed).cos()).collect();
        device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("application buffer"),
            contents: bytemuck::cast_slice(&data),
            usage,
        })
    };
    let q = Tensor::from_buffer(&ctx, buffer(0.0), shape, Layout::Bhsd, DType::F32)?;
    let k = Tensor::from_buffer(&ctx, buffer(1.0), shape, Layout::Bhsd, DType::F32)?;
    let v = Tensor::from_buffer(&ctx, buffer(2.0), shape, Layout::Bhsd, DType::F32)?;

    // Record into the application's encoder, with whatever else it records, and submit.
    let mut encoder = device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("frame") });
    let result = encode_sdpa(&ctx, &mut encoder, &q, &k, &v, &AttentionOptions::default())?;
    ctx.submit(encoder)?; // returns any GPU error of the recorded work
    let out = result.out.to_f32_vec(&ctx)?;
    println!("output {:?}, first values {:?}", result.out.shape(), &out[..4]);
    Ok(())
}
