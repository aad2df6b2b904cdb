//! Linear weights resident on the device in their stored (quantized) format, uploaded once per
//! [`Linear`] and split by output rows into bindings no larger than the device allows.

use crate::WgpuError;
use crate::gpu::Gpu;
use dsv4_kernels::linear::{FP8_BLOCK, MXFP4_BLOCK};
use dsv4_kernels::{Linear, WeightFormat};

/// One binding-sized slice of a weight: output rows `col0..col0 + cols`.
#[derive(Debug)]
pub struct Chunk {
    /// First output feature of the chunk.
    pub col0: usize,
    /// Output features in the chunk.
    pub cols: usize,
    /// The `linear` kernel's group-1 bind group over the chunk's element bytes and its ue8m0
    /// scale bytes (one zero word for unscaled formats), made once; it keeps both buffers alive.
    pub bind: wgpu::BindGroup,
}

/// A weight on the device.
#[derive(Debug)]
pub struct DeviceWeight {
    /// The shader's format code (see linear.wgsl).
    pub format: u32,
    /// The binding-sized pieces, in output order.
    pub chunks: Vec<Chunk>,
    /// Bytes held on the device.
    pub bytes: usize,
}

fn format_code(f: WeightFormat) -> u32 {
    match f {
        WeightFormat::F32 => 0,
        WeightFormat::Bf16 => 1,
        WeightFormat::Fp8Block => 2,
        WeightFormat::Mxfp4 => 3,
    }
}

/// Bytes of one output row's elements and scales, and the row granularity of a split.
fn row_layout(w: &Linear) -> (usize, usize, usize) {
    let i = w.in_dim;
    match w.format {
        WeightFormat::F32 => (4 * i, 0, 1),
        WeightFormat::Bf16 => (2 * i, 0, 1),
        // Scales cover 128 rows, so splits fall on 128-row boundaries.
        WeightFormat::Fp8Block => (i, 0, FP8_BLOCK),
        WeightFormat::Mxfp4 => (i / 2, i / MXFP4_BLOCK, 1),
    }
}

/// Upload `w`, split into chunks of whole rows that each fit in `max_binding` bytes.
pub fn upload(gpu: &Gpu, w: &Linear) -> Result<DeviceWeight, WgpuError> {
    let max_binding = gpu.max_binding_bytes() as usize;
    let (row_bytes, row_scale, align) = row_layout(w);
    let fp8_scale_row = w.in_dim.div_ceil(FP8_BLOCK);
    // Bytes a group of `align` rows needs in the larger of its two buffers.
    let group_bytes = (row_bytes * align).max(match w.format {
        WeightFormat::Fp8Block => fp8_scale_row,
        _ => row_scale * align,
    });
    if group_bytes == 0 || group_bytes > max_binding {
        return Err(WgpuError::TooLarge {
            what: format!(
                "weight `{}` [{}, {}]: {group_bytes} bytes per {align} row(s) exceed the device's largest binding ({max_binding} bytes)",
                w.name, w.out_dim, w.in_dim
            ),
        });
    }
    let rows_per_chunk = (max_binding / group_bytes) * align;
    let mut chunks = Vec::new();
    let mut bytes = 0;
    let mut col0 = 0;
    while col0 < w.out_dim {
        let cols = rows_per_chunk.min(w.out_dim - col0);
        let data = &w.data[col0 * row_bytes..(col0 + cols) * row_bytes];
        let scale: &[u8] = match w.format {
            WeightFormat::F32 | WeightFormat::Bf16 => &[],
            WeightFormat::Fp8Block => {
                let (b0, b1) = (col0 / FP8_BLOCK, (col0 + cols).div_ceil(FP8_BLOCK));
                &w.scale[b0 * fp8_scale_row..b1 * fp8_scale_row]
            }
            WeightFormat::Mxfp4 => &w.scale[col0 * row_scale..(col0 + cols) * row_scale],
        };
        bytes += data.len() + scale.len();
        let data = gpu.upload(&w.name, data);
        let scale = gpu.upload(&w.name, scale);
        let bind = gpu.bind_group1("linear", &[&data, &scale]);
        chunks.push(Chunk { col0, cols, bind });
        col0 += cols;
    }
    Ok(DeviceWeight {
        format: format_code(w.format),
        chunks,
        bytes,
    })
}
