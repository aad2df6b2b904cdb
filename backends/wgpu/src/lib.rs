//! dsv4-backend-wgpu: the forward pass's ops as WGSL compute shaders through wgpu.
