//! The device side of the backend: adapter selection, the pipeline cache, the traffic counters,
//! and [`Step`], one command encoder whose dispatches are submitted together with the
//! read-backs they need (host ops) or kept pending (device-resident ops).

use crate::WgpuError;
use crate::setup::{Bind, Setups};
use crate::shaders;
use dsv4_kernels::DeviceStats;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use wgpu::util::DeviceExt;

/// Words of scalar parameters every kernel can read (`pu(i)` / `pf(i)` in common.wgsl).
pub const PARAM_WORDS: usize = 16;

/// Largest number of workgroups in one dispatch dimension (WebGPU's default limit).
pub const MAX_GROUPS: u32 = 65_535;

/// The adapter the backend runs on, as reported to the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdapterReport {
    /// Adapter name ("llvmpipe (LLVM 15.0.6, 256 bits)", "NVIDIA GeForce …").
    pub name: String,
    /// Driver name and version.
    pub driver: String,
    /// Graphics API ("Vulkan", "Metal", …).
    pub api: String,
    /// Device type ("Cpu", "DiscreteGpu", …).
    pub device_type: String,
    /// Whether sums accumulate in f64 (SHADER_F64), which matches the reference bit for bit.
    pub f64_accumulation: bool,
    /// Largest storage buffer binding in bytes (weights above it are split across bindings).
    pub max_binding_bytes: u64,
}

impl std::fmt::Display for AdapterReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({}, {} {}, {} accumulation, bindings up to {} MiB)",
            self.name,
            self.device_type,
            self.api,
            self.driver,
            if self.f64_accumulation { "f64" } else { "f32" },
            self.max_binding_bytes >> 20
        )
    }
}

/// Vulkan, Metal, DX12 (and WebGPU): the APIs with compute shaders and f64 where the device has
/// it. The GL backend is left out (no f64, and probing EGL prints errors on headless machines).
const APIS: wgpu::Backends = wgpu::Backends::PRIMARY;

fn instance() -> wgpu::Instance {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = APIS;
    wgpu::Instance::new(desc)
}

/// Every adapter wgpu can see on this machine.
pub fn adapters() -> Vec<wgpu::Adapter> {
    pollster::block_on(instance().enumerate_adapters(APIS))
}

/// Pick an adapter: `selector` is an index into [`adapters`] or a case-insensitive part of an
/// adapter's name; without one, the first discrete GPU, else the first adapter.
pub fn select_adapter(selector: Option<&str>) -> Result<wgpu::Adapter, WgpuError> {
    let all = adapters();
    if all.is_empty() {
        return Err(WgpuError::NoAdapter);
    }
    let names = || {
        all.iter()
            .enumerate()
            .map(|(i, a)| format!("{i}: {}", a.get_info().name))
            .collect::<Vec<_>>()
            .join("; ")
    };
    match selector.map(str::trim).filter(|s| !s.is_empty()) {
        Some(sel) => {
            if let Ok(i) = sel.parse::<usize>() {
                return all.get(i).cloned().ok_or_else(|| WgpuError::NoSuchAdapter {
                    selector: sel.to_string(),
                    known: names(),
                });
            }
            let low = sel.to_lowercase();
            all.iter()
                .find(|a| a.get_info().name.to_lowercase().contains(&low))
                .cloned()
                .ok_or_else(|| WgpuError::NoSuchAdapter {
                    selector: sel.to_string(),
                    known: names(),
                })
        }
        None => Ok(all
            .iter()
            .find(|a| a.get_info().device_type == wgpu::DeviceType::DiscreteGpu)
            .unwrap_or(&all[0])
            .clone()),
    }
}

/// One wgpu device with its queue and compiled kernels.
pub struct Gpu {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    report: AdapterReport,
    limits: wgpu::Limits,
    pipelines: Mutex<HashMap<&'static str, Arc<wgpu::ComputePipeline>>>,
    stats: Mutex<DeviceStats>,
    setups: Mutex<Setups>,
    next_id: AtomicU64,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu")
            .field("adapter", &self.report)
            .finish()
    }
}

impl Gpu {
    /// Open a device on `adapter` with its full limits and f64 shaders when it has them.
    /// `allow_f64 = false` forces the f32 accumulation path.
    pub fn open(adapter: &wgpu::Adapter, allow_f64: bool) -> Result<Self, WgpuError> {
        let info = adapter.get_info();
        let f64_ok = allow_f64 && adapter.features().contains(wgpu::Features::SHADER_F64);
        let mut features = wgpu::Features::empty();
        if f64_ok {
            features |= wgpu::Features::SHADER_F64;
        }
        let limits = adapter.limits();
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("dsv4"),
            required_features: features,
            required_limits: limits.clone(),
            ..Default::default()
        }))
        .map_err(|e| WgpuError::Device(e.to_string()))?;
        let max_binding_bytes = limits
            .max_storage_buffer_binding_size
            .min(limits.max_buffer_size)
            & !3;
        let report = AdapterReport {
            name: info.name.clone(),
            driver: format!("{} {}", info.driver, info.driver_info)
                .trim()
                .to_string(),
            api: format!("{:?}", info.backend),
            device_type: format!("{:?}", info.device_type),
            f64_accumulation: f64_ok,
            max_binding_bytes,
        };
        Ok(Self {
            device,
            queue,
            report,
            limits,
            pipelines: Mutex::new(HashMap::new()),
            stats: Mutex::new(DeviceStats::default()),
            setups: Mutex::new(Setups::default()),
            next_id: AtomicU64::new(1),
        })
    }

    /// A fresh resource id (never 0, never reused): names a buffer in setup-cache keys.
    pub fn fresh_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// The traffic counters so far.
    pub fn stats(&self) -> DeviceStats {
        *self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Update the traffic counters.
    pub fn count(&self, f: impl FnOnce(&mut DeviceStats)) {
        f(&mut self.stats.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The params and bind-group caches.
    pub(crate) fn setups(&self) -> MutexGuard<'_, Setups> {
        self.setups.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The adapter this device runs on.
    pub fn report(&self) -> &AdapterReport {
        &self.report
    }

    /// The largest buffer one binding may cover, in bytes (a multiple of 4).
    pub fn max_binding_bytes(&self) -> u64 {
        self.report.max_binding_bytes
    }

    /// Use bindings of at most `bytes` (rounded down to whole words, never above the device's
    /// limit): leaves headroom, and lets tests exercise the split of large weights.
    pub fn cap_binding_bytes(&mut self, bytes: u64) {
        self.report.max_binding_bytes = self.report.max_binding_bytes.min(bytes & !3);
    }

    /// The device's limits as granted.
    pub fn limits(&self) -> &wgpu::Limits {
        &self.limits
    }

    /// The compiled pipeline of `kernel` (compiled on first use).
    pub fn pipeline(&self, kernel: &'static str) -> Arc<wgpu::ComputePipeline> {
        let mut cache = self.pipelines.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = cache.get(kernel) {
            return p.clone();
        }
        let source = shaders::module_source(kernel, self.report.f64_accumulation);
        let module = self
            .device
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(kernel),
                source: wgpu::ShaderSource::Wgsl(source.into()),
            });
        let p = Arc::new(
            self.device
                .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                    label: Some(kernel),
                    layout: None,
                    module: &module,
                    entry_point: Some(shaders::entry_point(kernel)),
                    compilation_options: Default::default(),
                    cache: None,
                }),
        );
        cache.insert(kernel, p.clone());
        p
    }

    /// A storage buffer holding `bytes` (padded to whole words; at least one word).
    pub fn upload(&self, label: &str, bytes: &[u8]) -> wgpu::Buffer {
        let mut padded;
        let contents = if bytes.is_empty() || !bytes.len().is_multiple_of(4) {
            padded = bytes.to_vec();
            padded.resize(bytes.len().div_ceil(4).max(1) * 4, 0);
            &padded[..]
        } else {
            bytes
        };
        self.device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(label),
                contents,
                usage: wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_SRC
                    | wgpu::BufferUsages::COPY_DST,
            })
    }

    /// A zeroed storage buffer of at least `bytes` bytes.
    pub fn scratch(&self, label: &str, bytes: usize) -> wgpu::Buffer {
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: (bytes.div_ceil(4).max(1) * 4) as u64,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
    }

    /// A bind group for group 1 of `kernel` with `buffers` at bindings 0, 1, …
    pub fn bind_group1(&self, kernel: &'static str, buffers: &[&wgpu::Buffer]) -> wgpu::BindGroup {
        let pipeline = self.pipeline(kernel);
        let entries: Vec<wgpu::BindGroupEntry<'_>> = buffers
            .iter()
            .enumerate()
            .map(|(i, b)| wgpu::BindGroupEntry {
                binding: i as u32,
                resource: b.as_entire_binding(),
            })
            .collect();
        self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(kernel),
            layout: &pipeline.get_bind_group_layout(1),
            entries: &entries,
        })
    }

    /// Start recording a step: dispatches are encoded in order and submitted once by
    /// [`Step::finish`].
    pub fn step(&self) -> Step<'_> {
        Step {
            gpu: self,
            encoder: self.encoder(),
            cached: false,
        }
    }

    /// A new command encoder.
    pub(crate) fn encoder(&self) -> wgpu::CommandEncoder {
        self.device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("step"),
            })
    }

    /// Continue recording into `encoder` (the pending work of the resident ops), reusing bind
    /// groups of identical earlier dispatches; [`Step::into_encoder`] hands it back.
    pub(crate) fn resume(&self, encoder: wgpu::CommandEncoder) -> Step<'_> {
        Step {
            gpu: self,
            encoder,
            cached: true,
        }
    }

    /// Submit `encoder` after copying each `(buffer, byte offset, bytes)` of `reads` into a
    /// mappable buffer; wait, and return the bytes read.
    pub(crate) fn submit_and_read(
        &self,
        mut encoder: wgpu::CommandEncoder,
        reads: &[(&wgpu::Buffer, u64, usize)],
    ) -> Result<Vec<Vec<u8>>, String> {
        let staging: Vec<wgpu::Buffer> = reads
            .iter()
            .map(|(src, off, len)| {
                let size = (len.div_ceil(4).max(1) * 4) as u64;
                let dst = self.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("read-back"),
                    size,
                    usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                });
                encoder.copy_buffer_to_buffer(src, *off, &dst, 0, size);
                dst
            })
            .collect();
        self.queue.submit([encoder.finish()]);
        let bytes: usize = reads.iter().map(|r| r.2).sum();
        self.count(|s| {
            s.submissions += 1;
            s.reads += reads.len() as u64;
            s.read_bytes += bytes as u64;
        });
        let failed = Arc::new(Mutex::new(None));
        for s in &staging {
            let failed = failed.clone();
            s.slice(..).map_async(wgpu::MapMode::Read, move |r| {
                if let Err(e) = r {
                    *failed.lock().unwrap_or_else(|e| e.into_inner()) = Some(e.to_string());
                }
            });
        }
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| format!("wgpu device lost while waiting for a step: {e}"))?;
        if let Some(e) = failed.lock().unwrap_or_else(|e| e.into_inner()).take() {
            return Err(format!("wgpu read-back failed: {e}"));
        }
        staging
            .iter()
            .zip(reads)
            .map(|(s, (_, _, len))| {
                let view = s
                    .slice(..)
                    .get_mapped_range()
                    .map_err(|e| format!("wgpu read-back mapping failed: {e}"))?;
                let v = view[..*len].to_vec();
                drop(view);
                s.unmap();
                Ok(v)
            })
            .collect()
    }

    /// Submit `encoder` without waiting.
    pub(crate) fn submit(&self, encoder: wgpu::CommandEncoder) {
        self.queue.submit([encoder.finish()]);
        self.count(|s| s.submissions += 1);
    }
}

/// Workgroup counts for `n` invocations at `wg` per group: x up to [`MAX_GROUPS`], the rest in y
/// (kernels rebuild the index with `flat_id`).
pub fn grid(n: usize, wg: u32) -> [u32; 3] {
    let groups = n.div_ceil(wg as usize).max(1) as u64;
    let x = groups.min(u64::from(MAX_GROUPS));
    let y = groups.div_ceil(x);
    [x as u32, y as u32, 1]
}

/// One command encoder: a list of dispatches submitted with one `queue.submit` (host ops), or
/// the pending work of the resident ops (`cached`: bind groups are reused across dispatches).
pub struct Step<'g> {
    gpu: &'g Gpu,
    encoder: wgpu::CommandEncoder,
    cached: bool,
}

impl Step<'_> {
    /// Encode one dispatch of `kernel` with `params` (u32 words) and storage `buffers` as
    /// (binding, buffer) pairs; the bindings must be exactly those the entry point uses.
    pub fn dispatch(
        &mut self,
        kernel: &'static str,
        params: &[u32],
        buffers: &[(u32, Bind<'_>)],
        groups: [u32; 3],
    ) {
        self.dispatch_with(kernel, params, buffers, None, groups)
    }

    /// [`Step::dispatch`] plus a prepared bind group for group 1 (a resident weight).
    pub fn dispatch_with(
        &mut self,
        kernel: &'static str,
        params: &[u32],
        buffers: &[(u32, Bind<'_>)],
        group1: Option<&wgpu::BindGroup>,
        groups: [u32; 3],
    ) {
        assert!(
            params.len() <= PARAM_WORDS,
            "kernel {kernel}: too many parameters"
        );
        let mut words = [0u32; PARAM_WORDS];
        words[..params.len()].copy_from_slice(params);
        let pipeline = self.gpu.pipeline(kernel);
        let bind =
            self.gpu
                .setups()
                .bind_group(self.gpu, &pipeline, kernel, words, buffers, self.cached);
        let mut pass = self
            .encoder
            .begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some(kernel),
                timestamp_writes: None,
            });
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &bind, &[]);
        if let Some(g) = group1 {
            pass.set_bind_group(1, g, &[]);
        }
        pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
        drop(pass);
        self.gpu.count(|s| s.dispatches += 1);
    }

    /// Encode a copy of `bytes` bytes from `src` to `dst` (different buffers), ordered after
    /// everything encoded before it.
    pub fn copy(&mut self, src: Bind<'_>, dst: Bind<'_>, bytes: u64) {
        self.encoder
            .copy_buffer_to_buffer(src.buf, src.off, dst.buf, dst.off, bytes);
    }

    /// Encode a host-to-device write of `data` into `dst`: the data goes to a fresh staging
    /// buffer now and is copied in order with the dispatches (unlike `queue.write_buffer`, which
    /// would land before every command of the next submission).
    pub fn write(&mut self, data: &[u8], dst: Bind<'_>) {
        if data.is_empty() {
            return;
        }
        let staging = self.gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("write staging"),
            size: data.len() as u64,
            usage: wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: true,
        });
        staging
            .slice(..)
            .get_mapped_range_mut()
            .expect("a buffer mapped at creation maps")
            .copy_from_slice(data);
        staging.unmap();
        self.encoder
            .copy_buffer_to_buffer(&staging, 0, dst.buf, dst.off, data.len() as u64);
        self.gpu.count(|s| {
            s.writes += 1;
            s.write_bytes += data.len() as u64;
        });
    }

    /// The encoder, with everything recorded (the resident ops keep it pending).
    pub(crate) fn into_encoder(self) -> wgpu::CommandEncoder {
        self.encoder
    }

    /// Submit everything recorded and read back `reads` (buffer, bytes) in order.
    ///
    /// # Panics
    /// If the device is lost or the read-back fails (the host ops have no error channel).
    pub fn finish(self, reads: &[(&wgpu::Buffer, usize)]) -> Vec<Vec<u8>> {
        let reads: Vec<_> = reads.iter().map(|(b, n)| (*b, 0, *n)).collect();
        self.gpu
            .submit_and_read(self.encoder, &reads)
            .unwrap_or_else(|e| panic!("{e}"))
    }
}

/// f32 slice → bytes for upload.
pub fn f32_bytes(v: &[f32]) -> &[u8] {
    bytemuck::cast_slice(v)
}

/// Read-back bytes → f32 values into `out`.
pub fn copy_f32(bytes: &[u8], out: &mut [f32]) {
    for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
        *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
}
