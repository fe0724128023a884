//! Helpers for tests that run the same body on the CPU and on a GPU.

use std::sync::Arc;

use super::context::Gpu;
use super::probe::cuda_device_count;

/// Whether `SPECDEC_REQUIRE_GPU=1` (or `true`) is set: a missing GPU is then a test failure.
pub fn gpu_required() -> bool {
    matches!(
        std::env::var("SPECDEC_REQUIRE_GPU").as_deref(),
        Ok("1") | Ok("true") | Ok("yes")
    )
}

/// The GPU for a GPU test, or `None` (with a note on stderr) when this machine has none.
///
/// # Panics
/// When `SPECDEC_REQUIRE_GPU` is set and no usable GPU is found, or when a GPU exists but cannot
/// be opened: a test asked to run on a GPU must never pass without one.
pub fn gpu_for_test(test: &str) -> Option<Arc<Gpu>> {
    if cuda_device_count() == 0 {
        assert!(
            !gpu_required(),
            "{test}: SPECDEC_REQUIRE_GPU is set but no CUDA device is usable here"
        );
        eprintln!(
            "{test}: no CUDA device here; GPU half not run (set SPECDEC_REQUIRE_GPU=1 to fail)"
        );
        return None;
    }
    match Gpu::shared(0) {
        Ok(gpu) => Some(gpu),
        Err(e) => panic!("{test}: a CUDA device exists but cannot be used: {e}"),
    }
}

/// Defines one `#[test]` running `$body` with `Device::Cpu` and one `#[ignore]`d test running it
/// with the GPU. The body is a closure-like block receiving `device: Device`.
///
/// ```ignore
/// test_device!(rms_norm_matches, |device| { /* … */ });
/// ```
#[macro_export]
macro_rules! test_device {
    ($name:ident, |$device:ident| $body:block) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            fn run($device: $crate::cuda::Device) $body

            #[test]
            fn cpu() {
                run($crate::cuda::Device::Cpu);
            }

            #[test]
            #[ignore = "needs a GPU"]
            fn cuda() {
                if $crate::cuda::testing::gpu_for_test(concat!(module_path!(), "::cuda")).is_some() {
                    run($crate::cuda::Device::Cuda(0));
                }
            }
        }
    };
}
