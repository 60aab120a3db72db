//! Measuring kernels: GPU timestamps where the adapter has them (else wall clock around
//! submit and wait), repetitions after a warm-up, with the first call (pipeline
//! compilation included) reported separately. Used by the `bench` command and the
//! criterion benches.

pub mod mha;
pub mod per_call;
pub mod probe;
pub mod suite;

pub use crate::bench_cases::bench_data;

use crate::context::Context;
use crate::error::{Error, Result};
use crate::problem::AttentionShape;
use crate::tensor::{DType, Layout, Tensor};
use std::time::{Duration, Instant};

/// How a duration was measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Clock {
    /// Timestamps written on the GPU before and after the recorded work.
    GpuTimestamps,
    /// Host wall clock around submit and wait.
    WallClock,
}

impl Clock {
    pub fn name(self) -> &'static str {
        match self {
            Clock::GpuTimestamps => "gpu-timestamps",
            Clock::WallClock => "wall-clock",
        }
    }

    /// The clock `time_gpu` uses on this context.
    pub fn for_context(ctx: &Context) -> Clock {
        if ctx
            .device()
            .features()
            .contains(wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS)
        {
            Clock::GpuTimestamps
        } else {
            Clock::WallClock
        }
    }
}

/// Timings of one benchmark row.
#[derive(Clone, Debug)]
pub struct Timing {
    /// The first call, including pipeline compilation (wall clock).
    pub first: Duration,
    pub median: Duration,
    pub min: Duration,
    pub max: Duration,
    pub reps: usize,
    pub clock: Clock,
}

fn summarise(first: Duration, mut samples: Vec<Duration>, clock: Clock) -> Timing {
    samples.sort();
    Timing {
        first,
        median: samples[samples.len() / 2],
        min: samples[0],
        max: samples[samples.len() - 1],
        reps: samples.len(),
        clock,
    }
}

/// Measures GPU work with timestamps written into the command stream.
struct Stopwatch {
    queries: wgpu::QuerySet,
    resolved: wgpu::Buffer,
    readable: wgpu::Buffer,
    period_ns: f64,
}

impl Stopwatch {
    fn new(ctx: &Context) -> Self {
        let device = ctx.device();
        let usage = wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC;
        Stopwatch {
            queries: device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("bench timestamps"),
                ty: wgpu::QueryType::Timestamp,
                count: 2,
            }),
            resolved: device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("bench timestamps resolved"),
                size: 16,
                usage,
                mapped_at_creation: false,
            }),
            readable: device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("bench timestamps readback"),
                size: 16,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
            period_ns: f64::from(ctx.queue().get_timestamp_period()),
        }
    }

    /// The time between the timestamps around `record`'s work, and the wall clock
    /// from its submission to its end.
    fn time(&self, ctx: &Context, record: &mut impl FnMut(&mut wgpu::CommandEncoder) -> Result<()>) -> Result<Sample> {
        let mut encoder = ctx.device().create_command_encoder(&Default::default());
        encoder.write_timestamp(&self.queries, 0);
        record(&mut encoder)?;
        encoder.write_timestamp(&self.queries, 1);
        encoder.resolve_query_set(&self.queries, 0..2, &self.resolved, 0);
        encoder.copy_buffer_to_buffer(&self.resolved, 0, &self.readable, 0, 16);
        let submitted = Instant::now();
        ctx.queue().submit([encoder.finish()]);
        let slice = self.readable.slice(..);
        let (tx, rx) = std::sync::mpsc::channel();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        ctx.wait_idle()?;
        let wall = submitted.elapsed();
        rx.recv()
            .map_err(|e| Error::Readback(e.to_string()))?
            .map_err(|e| Error::Readback(e.to_string()))?;
        let ticks: [u64; 2] = {
            let data = slice.get_mapped_range().map_err(|e| Error::Readback(e.to_string()))?;
            let words: [u64; 2] = bytemuck::pod_read_unaligned(&data[..16]);
            words
        };
        self.readable.unmap();
        let ns = ticks[1].saturating_sub(ticks[0]) as f64 * self.period_ns;
        Ok(Sample {
            stamped: Some(Duration::from_nanos(ns as u64)),
            wall,
        })
    }
}

/// One submission timed: the interval between the timestamps around its work, where
/// the adapter writes them, and the wall clock.
#[derive(Clone, Copy, Debug)]
struct Sample {
    stamped: Option<Duration>,
    wall: Duration,
}

impl Sample {
    /// Whether the timestamps cannot be right: work that kept the host waiting for
    /// milliseconds, stamped as taking under a quarter of that. Lavapipe from Mesa
    /// 22.3 stamps every later submission so once a KV cache's texel mirror has been
    /// dropped: 0.2 ms for a 470 ms kernel.
    fn timestamps_implausible(self) -> bool {
        self.stamped
            .is_some_and(|gpu| self.wall > Duration::from_millis(2) && gpu * 4 < self.wall)
    }

    fn on(self, clock: Clock) -> Duration {
        match (clock, self.stamped) {
            (Clock::GpuTimestamps, Some(gpu)) => gpu,
            _ => self.wall,
        }
    }
}

/// The clock to read `samples` on: their timestamps, unless they have none or most are
/// implausible (one slow wait on a busy machine does not move a row off them).
fn clock_for(samples: &[Sample]) -> Clock {
    let implausible = samples.iter().filter(|s| s.timestamps_implausible()).count();
    if samples.iter().any(|s| s.stamped.is_none()) || implausible * 2 > samples.len() {
        Clock::WallClock
    } else {
        Clock::GpuTimestamps
    }
}

/// Runs `record` once, submitted and waited for, wall clock.
fn wall_clock(ctx: &Context, record: &mut impl FnMut(&mut wgpu::CommandEncoder) -> Result<()>) -> Result<Duration> {
    let start = Instant::now();
    let mut encoder = ctx.device().create_command_encoder(&Default::default());
    record(&mut encoder)?;
    ctx.queue().submit([encoder.finish()]);
    ctx.wait_idle()?;
    Ok(start.elapsed())
}

/// Times single submissions with the context's [`Clock`] (for criterion's `iter_custom`).
pub struct GpuTimer {
    stopwatch: Option<Stopwatch>,
    /// Set once a timestamp proved implausible ([`Sample::timestamps_implausible`]):
    /// every later [`GpuTimer::time`] reads the wall clock (broken stamps stay broken).
    stamps_broken: std::cell::Cell<bool>,
}

impl GpuTimer {
    pub fn new(ctx: &Context) -> Self {
        let stopwatch = (Clock::for_context(ctx) == Clock::GpuTimestamps).then(|| Stopwatch::new(ctx));
        GpuTimer {
            stopwatch,
            stamps_broken: std::cell::Cell::new(false),
        }
    }

    /// Records, submits and waits for `record`; returns the time it took.
    pub fn time(
        &self,
        ctx: &Context,
        mut record: impl FnMut(&mut wgpu::CommandEncoder) -> Result<()>,
    ) -> Result<Duration> {
        let sample = self.sample(ctx, &mut record)?;
        if sample.timestamps_implausible() {
            self.stamps_broken.set(true);
        }
        Ok(if self.stamps_broken.get() {
            sample.wall
        } else {
            sample.on(Clock::GpuTimestamps)
        })
    }

    /// One submission of `record`, timed both ways where the adapter has timestamps.
    fn sample(
        &self,
        ctx: &Context,
        record: &mut impl FnMut(&mut wgpu::CommandEncoder) -> Result<()>,
    ) -> Result<Sample> {
        ctx.scoped("timing GPU work", || match &self.stopwatch {
            Some(stopwatch) => stopwatch.time(ctx, record),
            None => Ok(Sample {
                stamped: None,
                wall: wall_clock(ctx, record)?,
            }),
        })
    }
}

/// Times `record` (which records GPU work): the first call on the wall clock, then one
/// untimed warm-up, then `reps` timed runs read on [`Clock::for_context`], or on the
/// wall clock where most of their timestamps are implausible.
pub fn time_gpu(
    ctx: &Context,
    reps: usize,
    mut record: impl FnMut(&mut wgpu::CommandEncoder) -> Result<()>,
) -> Result<Timing> {
    ctx.scoped("timing GPU work", || {
        let first = wall_clock(ctx, &mut record)?;
        wall_clock(ctx, &mut record)?;
        let timer = GpuTimer::new(ctx);
        let samples = (0..reps.max(1))
            .map(|_| timer.sample(ctx, &mut record))
            .collect::<Result<Vec<_>>>()?;
        let clock = clock_for(&samples);
        Ok(summarise(first, samples.iter().map(|s| s.on(clock)).collect(), clock))
    })
}

/// Runs `a` and `b` `pairs` times each in alternation, so that both see the same
/// machine load; which of the two goes first alternates too, so running order favours
/// neither. Returns each pair's results, `(a's, b's)`.
pub fn in_alternation<T>(
    pairs: usize,
    mut a: impl FnMut() -> Result<T>,
    mut b: impl FnMut() -> Result<T>,
) -> Result<Vec<(T, T)>> {
    (0..pairs)
        .map(|i| {
            if i % 2 == 0 {
                let ta = a()?;
                Ok((ta, b()?))
            } else {
                let tb = b()?;
                Ok((a()?, tb))
            }
        })
        .collect()
}

/// Each pair's ratio `b / a` of two things timed in alternation ([`in_alternation`]),
/// sorted.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PairRatios(pub Vec<f64>);

impl PairRatios {
    /// From `(a, b)` seconds; a zero reading (a clock coarser than the work) counts as
    /// one nanosecond.
    pub fn of(pairs: impl IntoIterator<Item = (f64, f64)>) -> Self {
        let mut ratios: Vec<f64> = pairs.into_iter().map(|(a, b)| b.max(1e-9) / a.max(1e-9)).collect();
        ratios.sort_by(f64::total_cmp);
        PairRatios(ratios)
    }

    pub fn median(&self) -> Option<f64> {
        self.0.get(self.0.len() / 2).copied()
    }

    /// The smallest and the largest.
    pub fn range(&self) -> Option<(f64, f64)> {
        Some((*self.0.first()?, *self.0.last()?))
    }
}

/// Times a host computation the same way (first call, warm-up skipped for slow ones).
pub fn time_host(reps: usize, mut work: impl FnMut() -> Result<()>) -> Result<Timing> {
    let mut run = || -> Result<Duration> {
        let start = Instant::now();
        work()?;
        Ok(start.elapsed())
    };
    let first = run()?;
    let samples = (0..reps.max(1)).map(|_| run()).collect::<Result<Vec<_>>>()?;
    Ok(summarise(first, samples, Clock::WallClock))
}

/// The most host memory a benchmark's (or the CLI's) arrays may take: half of what the
/// kernel reports available (`MemAvailable` in /proc/meminfo), or 8 GiB where it does
/// not say. Going past it is refused with an error, instead of an allocation failure
/// aborting the process.
pub fn host_budget() -> u64 {
    const FALLBACK: u64 = 8 << 30;
    let available = std::fs::read_to_string("/proc/meminfo").ok().and_then(|text| {
        let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib.saturating_mul(1024))
    });
    available.map_or(FALLBACK, |bytes| bytes / 2)
}

/// Refuses `bytes` of host memory for `what` beyond [`host_budget`].
pub fn check_host_bytes(what: impl Into<String>, bytes: u128) -> Result<()> {
    let budget = host_budget();
    if bytes > u128::from(budget) {
        return Err(Error::CapacityExceeded {
            what: what.into(),
            capacity: "the host memory budget (half the memory available)",
            unit: "bytes",
            requested: u64::try_from(bytes).unwrap_or(u64::MAX),
            max: budget,
        });
    }
    Ok(())
}

/// Bytes of a benchmark's host inputs (q, k and v in f32), checked against the budget.
pub fn check_bench_data(shape: &AttentionShape) -> Result<()> {
    let elements = [
        (shape.heads_q, shape.len_q, shape.head_dim),
        (shape.heads_kv, shape.len_k, shape.head_dim),
        (shape.heads_kv, shape.len_k, shape.head_dim_v),
    ]
    .iter()
    .map(|&(h, l, d)| shape.batch as u128 * h as u128 * l as u128 * d as u128)
    .sum::<u128>();
    check_host_bytes("the benchmark's q, k and v (f32 on the host)", 4 * elements)
}

/// Random q, k, v for a benchmark shape, uploaded as BHSD tensors of `dtype`. Shapes
/// the device's buffers or the host budget cannot hold are refused before any host
/// memory is taken.
pub fn bench_inputs(ctx: &Context, shape: &AttentionShape, dtype: DType) -> Result<[Tensor; 3]> {
    let max_buffer = ctx.capabilities().max_buffer;
    for (what, h, l, d) in [
        ("q", shape.heads_q, shape.len_q, shape.head_dim),
        ("k", shape.heads_kv, shape.len_k, shape.head_dim),
        ("v", shape.heads_kv, shape.len_k, shape.head_dim_v),
    ] {
        let bytes = shape.batch as u128 * h as u128 * l as u128 * d as u128 * dtype.size() as u128;
        if bytes > u128::from(max_buffer) {
            return Err(Error::LimitExceeded {
                what: format!("the benchmark's {what} [{}, {h}, {l}, {d}]", shape.batch),
                limit: "max_buffer_size",
                unit: "bytes",
                requested: u64::try_from(bytes).unwrap_or(u64::MAX),
                max: max_buffer,
            });
        }
    }
    check_bench_data(shape)?;
    let [q, k, v] = bench_data(shape);
    let upload = |h: usize, l: usize, d: usize, data: &[f32]| {
        Tensor::from_f32_as(ctx, [shape.batch, h, l, d], Layout::Bhsd, dtype, data)
    };
    Ok([
        upload(shape.heads_q, shape.len_q, shape.head_dim, &q)?,
        upload(shape.heads_kv, shape.len_k, shape.head_dim, &k)?,
        upload(shape.heads_kv, shape.len_k, shape.head_dim_v, &v)?,
    ])
}

/// GFLOP/s for `flops` in `t`.
pub fn gflops(flops: f64, t: Duration) -> f64 {
    flops / t.as_secs_f64() / 1e9
}

#[cfg(test)]
mod tests {
    use super::{clock_for, Clock, Sample};
    use std::time::Duration;

    fn sample(gpu_ms: f64, wall_ms: f64) -> Sample {
        Sample {
            stamped: Some(Duration::from_secs_f64(gpu_ms / 1e3)),
            wall: Duration::from_secs_f64(wall_ms / 1e3),
        }
    }

    #[test]
    fn rows_whose_timestamps_are_mostly_implausible_are_read_on_the_wall_clock() {
        // Mesa 22.3's lavapipe after a texel mirror was dropped: 0.2 ms stamped, 470 waited.
        let broken = sample(0.2, 470.0);
        assert!(broken.timestamps_implausible());
        assert_eq!(clock_for(&[broken; 5]), Clock::WallClock);
        assert_eq!(broken.on(Clock::WallClock), broken.wall);
        // A GPU kernel behind submission overhead, and ones a little under their wait.
        let fine = [sample(0.01, 0.3), sample(1.5, 1.9), sample(400.0, 470.0)];
        for s in fine {
            assert!(!s.timestamps_implausible(), "{s:?}");
        }
        assert_eq!(clock_for(&fine), Clock::GpuTimestamps);
        // One slow wait among plausible stamps keeps the row on its timestamps.
        let jittered = [sample(0.2, 0.4), sample(0.2, 3.0), sample(0.2, 0.5)];
        assert_eq!(clock_for(&jittered), Clock::GpuTimestamps);
        assert_eq!(jittered[1].on(Clock::GpuTimestamps), Duration::from_secs_f64(0.2 / 1e3));
        // No timestamps at all: the wall clock.
        let unstamped = Sample {
            stamped: None,
            wall: Duration::from_millis(5),
        };
        assert_eq!(clock_for(&[unstamped]), Clock::WallClock);
    }
}
