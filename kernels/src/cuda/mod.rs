//! Shared CUDA plumbing: finding the CUDA libraries without panicking, choosing a device at run
//! time, compiling the kernel families' `.cu` sources with NVRTC (once per process and device) and
//! reading the ptxas resource report.
//!
//! # Why cudarc is always compiled in
//! `cudarc` is built with `dynamic-loading`: it links nothing and needs no CUDA toolkit at build
//! time, so the crate has no `cuda` cargo feature — one binary runs on machines with and without a
//! GPU, and the device is a run-time value ([`Device`]). cudarc **panics** when a library it needs
//! cannot be loaded, so every entry point here asks [`CudaLibraries::probe`] first and returns
//! [`crate::KernelError::CudaUnavailable`] instead.
//!
//! # Kernel sources
//! Each kernel family keeps its `.cu` file in its own folder (`attention/`, `verification/`, …);
//! [`sources::ALL`] embeds them all with `include_str!` (nothing path-dependent is baked into the
//! binary). Before compilation every source is prefixed with `prelude.cuh` (bf16/f16 conversions
//! and fixed-order warp reductions written with inline PTX), so no CUDA header is needed: NVRTC
//! alone compiles them. If `SPECDEC_CUDA_INCLUDE` is set (scripts/setup.d/20-nvrtc.sh sets it) it
//! is passed as an include directory as well.
//!
//! # Launchers
//! Each family's launchers are in its own `cuda.rs` (`kv::cuda`, `verification::cuda`, …), with
//! the same contract as the CPU twin, checking every CUDA call's result.
//!
//! # Environment
//! - `SPECDEC_DEVICE` = `cpu` | `cuda` | `cuda:N` chooses [`Device::from_env`]'s answer.
//! - `SPECDEC_REQUIRE_GPU=1` turns "no GPU here" into a test failure ([`testing::gpu_for_test`]).

pub mod context;

pub mod nvrtc;
pub mod probe;
pub mod sources;
pub mod testing;

pub use context::Gpu;
pub use nvrtc::{compile, CompiledKernel, KernelResources};
pub use probe::{CudaLibraries, Device};
pub use sources::KernelSource;
