//! Observes whether the driver ends long loops early (`shaders/loop_probe.wgsl`).
//!
//! Mesa's llvmpipe up to 22.x stops every loop of an invocation after 65535 iterations
//! in total and goes on with wrong results; Mesa 25's does not (measured: a loop of
//! 2^24 trips makes them all). Which one a context runs on is not in its name or
//! limits, so a CPU adapter's context runs this probe once when it is made, and
//! [`super::loop_budget`] bounds the kernels by what it saw (docs/design.md, "Loop cap").

use crate::gpu::Text;
use crate::kernels::loop_budget::LLVMPIPE_LOOP_CAP;
use crate::kernels::Kernel;

/// The probe shader (standalone: no prelude, no attention bindings). Listed in
/// its family list (`kernels()`) so naga validates it and writes it to SPIR-V in the tests; compiled
/// here straight from its source, before the context (and its pipeline cache) exists.
pub const KERNEL: Kernel = Kernel {
    file: "loop_probe.wgsl",
    source: Text::Static(include_str!("../../shaders/loop_probe.wgsl")),
    entry: "main",
    slots: &[],
    preludes: &[],
    variant: Text::Static(""),
};

/// Trips asked of the probe loop: far beyond any cap the kernels' models must respect
/// (a longer cap than this is never reached by their loops at supported sizes).
pub const PROBE_TRIPS: u32 = 1 << 24;

/// The loop iterations one invocation may run on this device, or `None` if it ran the
/// probe's whole loop. If the probe itself fails, the known llvmpipe cap is assumed
/// (splitting work that did not need it is slower, never wrong).
pub async fn probe_async(device: &wgpu::Device, queue: &wgpu::Queue) -> Option<u64> {
    match trips_async(device, queue, PROBE_TRIPS).await {
        Some(t) if t >= PROBE_TRIPS => None,
        Some(t) => Some(u64::from(t)),
        None => Some(LLVMPIPE_LOOP_CAP),
    }
}

/// How many trips a loop of `n` made in one invocation; `None` if anything failed.
#[cfg(not(target_arch = "wasm32"))]
pub fn trips(device: &wgpu::Device, queue: &wgpu::Queue, n: u32) -> Option<u32> {
    pollster::block_on(trips_async(device, queue, n))
}

/// [`trips`], awaited.
pub async fn trips_async(device: &wgpu::Device, queue: &wgpu::Queue, n: u32) -> Option<u32> {
    let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some("loop probe"),
        source: wgpu::ShaderSource::Wgsl(KERNEL.source.to_string().into()),
    });
    let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some("loop probe"),
        layout: None,
        module: &module,
        entry_point: Some(KERNEL.entry),
        compilation_options: Default::default(),
        cache: None,
    });
    let buffer = |usage, label| {
        device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: 8,
            usage,
            mapped_at_creation: false,
        })
    };
    let io = buffer(
        wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
        "loop probe io",
    );
    let readback = buffer(
        wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        "loop probe readback",
    );
    queue.write_buffer(&io, 0, bytemuck::cast_slice(&[n, 0u32]));
    let bind = device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some("loop probe"),
        layout: &pipeline.get_bind_group_layout(0),
        entries: &[wgpu::BindGroupEntry {
            binding: 0,
            resource: io.as_entire_binding(),
        }],
    });
    let mut encoder = device.create_command_encoder(&Default::default());
    {
        let mut pass = encoder.begin_compute_pass(&Default::default());
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &bind, &[]);
        pass.dispatch_workgroups(1, 1, 1);
    }
    encoder.copy_buffer_to_buffer(&io, 0, &readback, 0, 8);
    let commands = encoder.finish();
    if scope.pop().await.is_some() {
        return None;
    }
    queue.submit([commands]);
    let (tx, rx) = crate::wait::oneshot();
    readback
        .slice(..)
        .map_async(wgpu::MapMode::Read, move |r| tx.send(r.is_ok()));
    // Native devices run callbacks when polled; a browser runs them by itself.
    #[cfg(not(target_arch = "wasm32"))]
    device
        .poll(wgpu::PollType::Wait {
            submission_index: None,
            timeout: None,
        })
        .ok()?;
    if !rx.await.unwrap_or(false) {
        return None;
    }
    let view = readback.slice(..).get_mapped_range().ok()?;
    let words: &[u32] = bytemuck::cast_slice(&view);
    Some(words[1])
}

/// The loop probe's kernel (for [`super::every_kernel`]).
pub fn kernels() -> Vec<Kernel> {
    vec![KERNEL]
}
