//! The registry holds both CPU backends when both crates are linked, and creates a working `cpu`
//! backend with the requested thread count.

use dsv4_kernels::registry::{self, BackendOptions};

#[test]
fn cpu_and_reference_are_registered() {
    dsv4_backend_cpu::link();
    dsv4_backend_reference::link();
    let names = registry::names();
    assert!(names.contains(&"cpu"), "{names:?}");
    assert!(names.contains(&"reference"), "{names:?}");
    let opts = BackendOptions {
        threads: 2,
        ..Default::default()
    };
    let be = registry::create("cpu", &opts).unwrap();
    assert_eq!(be.name(), "cpu");
    let mut out = [0f32; 3];
    be.router_scores(&[0.0, 50.0, -50.0], &mut out);
    assert!((out[0] - 2f32.ln().sqrt()).abs() < 1e-6 && (out[1] - 50f32.sqrt()).abs() < 1e-5);
}
