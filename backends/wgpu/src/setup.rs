//! Dispatch setups: kernel parameters in small storage buffers cached by content, and bind
//! groups cached by exactly what they bind, so that a repeated sequence of resident dispatches
//! (a captured plan's replay) creates no new bind groups.

use crate::gpu::{Gpu, PARAM_WORDS};
use std::collections::HashMap;
use std::num::NonZeroU64;

/// Params buffers kept; past this the caches are cleared (prefill shapes vary, decode repeats).
const MAX_PARAMS: usize = 4096;
/// Bind groups kept; past this the caches are cleared.
const MAX_BIND_GROUPS: usize = 16384;

/// One buffer range bound at a binding: `size` bytes from byte `off`. `id` names the buffer in
/// cache keys; 0 marks a buffer made for one call, whose bind group is never cached.
#[derive(Debug, Clone, Copy)]
pub struct Bind<'a> {
    /// The buffer.
    pub buf: &'a wgpu::Buffer,
    /// Its resource id (0: not cacheable).
    pub id: u64,
    /// First byte.
    pub off: u64,
    /// Bytes.
    pub size: u64,
}

impl<'a> Bind<'a> {
    /// All of a buffer made for one call.
    pub fn whole(buf: &'a wgpu::Buffer) -> Self {
        Self {
            buf,
            id: 0,
            off: 0,
            size: buf.size(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct SetupKey {
    kernel: &'static str,
    params: u64,
    binds: Vec<(u32, u64, u64, u64)>,
}

/// The params-buffer and bind-group caches of one device.
#[derive(Default)]
pub struct Setups {
    params: HashMap<[u32; PARAM_WORDS], (u64, wgpu::Buffer)>,
    groups: HashMap<SetupKey, wgpu::BindGroup>,
    /// The keys of `groups` that bind each buffer id (some may be gone already).
    by_buf: HashMap<u64, Vec<SetupKey>>,
}

impl Setups {
    /// The bind group 0 of a dispatch of `kernel` with `words` as parameters and `buffers` at
    /// their bindings: reused when `cached` and an identical one exists, else created (and kept
    /// when `cached` and every buffer has an id).
    pub fn bind_group(
        &mut self,
        gpu: &Gpu,
        pipeline: &wgpu::ComputePipeline,
        kernel: &'static str,
        words: [u32; PARAM_WORDS],
        buffers: &[(u32, Bind<'_>)],
        cached: bool,
    ) -> wgpu::BindGroup {
        if self.params.len() >= MAX_PARAMS || self.groups.len() >= MAX_BIND_GROUPS {
            self.params.clear();
            self.clear_groups();
        }
        let (pid, pbuf) = self
            .params
            .entry(words)
            .or_insert_with(|| {
                let b = gpu.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("params"),
                    size: (PARAM_WORDS * 4) as u64,
                    usage: wgpu::BufferUsages::STORAGE,
                    mapped_at_creation: true,
                });
                b.slice(..)
                    .get_mapped_range_mut()
                    .expect("a buffer mapped at creation maps")
                    .copy_from_slice(bytemuck::cast_slice(&words));
                b.unmap();
                (gpu.fresh_id(), b)
            })
            .clone();
        let cacheable = cached && buffers.iter().all(|(_, b)| b.id != 0);
        let key = cacheable.then(|| SetupKey {
            kernel,
            params: pid,
            binds: buffers
                .iter()
                .map(|(i, b)| (*i, b.id, b.off, b.size))
                .collect(),
        });
        if let Some(g) = key.as_ref().and_then(|k| self.groups.get(k)) {
            gpu.count(|s| s.setups_reused += 1);
            return g.clone();
        }
        let mut entries = vec![wgpu::BindGroupEntry {
            binding: 0,
            resource: pbuf.as_entire_binding(),
        }];
        for (binding, b) in buffers {
            entries.push(wgpu::BindGroupEntry {
                binding: *binding,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: b.buf,
                    offset: b.off,
                    size: NonZeroU64::new(b.size),
                }),
            });
        }
        let g = gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(kernel),
            layout: &pipeline.get_bind_group_layout(0),
            entries: &entries,
        });
        gpu.count(|s| s.setups_created += 1);
        if let Some(k) = key {
            for (_, id, _, _) in &k.binds {
                self.by_buf.entry(*id).or_default().push(k.clone());
            }
            self.groups.insert(k, g.clone());
        }
        g
    }

    /// Drop the bind groups that bind buffer `id` (it is being freed).
    pub fn forget(&mut self, id: u64) {
        for k in self.by_buf.remove(&id).unwrap_or_default() {
            self.groups.remove(&k);
        }
    }

    /// Drop every cached bind group (the internal buffers they name are being replaced).
    pub fn clear_groups(&mut self) {
        self.groups.clear();
        self.by_buf.clear();
    }
}
