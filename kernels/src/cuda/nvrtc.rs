//! NVRTC compilation of the embedded kernel sources and the ptxas resource report.
//!
//! Kernels are compiled for a real architecture (`sm_80`, `sm_90`, `sm_90a`, …), so NVRTC runs
//! ptxas itself and returns a CUBIN for that architecture; `--ptxas-options=-v` makes ptxas write
//! registers, shared memory and spill bytes of every entry function into the program log, which
//! [`parse_ptxas_log`] reads. The compile-check test uses the same path on machines without a GPU.

use std::ffi::{c_char, CString};

use super::probe::CudaLibraries;
use super::sources::KernelSource;
use crate::error::{KernelError, Result};

/// What ptxas reported for one entry function.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KernelResources {
    /// The entry function's (unmangled, `extern "C"`) name.
    pub name: String,
    /// Registers per thread.
    pub registers: u32,
    /// Bytes of register spill stores (should be 0).
    pub spill_stores: u32,
    /// Bytes of register spill loads (should be 0).
    pub spill_loads: u32,
    /// Bytes of stack frame per thread.
    pub stack_frame: u32,
    /// Bytes of static shared memory per block.
    pub shared_bytes: u32,
}

impl KernelResources {
    /// Whether ptxas spilled registers to local memory.
    pub fn spills(&self) -> bool {
        self.spill_stores > 0 || self.spill_loads > 0
    }
}

/// One kernel source compiled for one architecture.
#[derive(Debug, Clone)]
pub struct CompiledKernel {
    /// The source's name (its file name).
    pub source: &'static str,
    /// The architecture compiled for, e.g. `sm_90`.
    pub arch: String,
    /// The CUBIN image, loadable with `cuModuleLoadData` on a device of that architecture.
    pub cubin: Vec<u8>,
    /// The full NVRTC program log (warnings and the ptxas report).
    pub log: String,
    /// ptxas's report per entry function, in log order.
    pub resources: Vec<KernelResources>,
}

/// The text handed to NVRTC: the shared prelude, then the family's source under its own name
/// (so diagnostics point at the right file and line).
pub fn full_source(source: &KernelSource) -> String {
    format!(
        "{}\n#line 1 \"{}\"\n{}",
        super::sources::PRELUDE,
        source.name,
        source.code
    )
}

/// Compiles `source` for `arch` (`sm_80`, `sm_90`, `sm_90a`, …) with NVRTC.
///
/// # Errors
/// [`KernelError::CudaUnavailable`] when libnvrtc cannot be loaded (checked first, so this never
/// panics); [`KernelError::KernelCompile`] with the NVRTC log when compilation fails;
/// [`KernelError::Cuda`] when an NVRTC call fails otherwise.
pub fn compile(source: &KernelSource, arch: &str) -> Result<CompiledKernel> {
    CudaLibraries::probe().require_nvrtc()?;
    let text = CString::new(full_source(source)).map_err(|_| KernelError::InvalidParameter {
        what: "kernel source",
        reason: format!("{} contains a NUL byte", source.name),
    })?;
    let name = CString::new(source.name).expect("source names are plain file names");
    let mut options = vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".to_string(),
        "--ptxas-options=-v".to_string(),
        "--extra-device-vectorization".to_string(),
    ];
    if let Ok(include) = std::env::var("SPECDEC_CUDA_INCLUDE") {
        if !include.is_empty() {
            options.push(format!("--include-path={include}"));
        }
    }
    let prog = cudarc::nvrtc::result::create_program(&text, Some(&name))
        .map_err(|e| cuda_error("nvrtcCreateProgram", e))?;
    // SAFETY: `prog` was just created and is destroyed exactly once below; `text` and `name`
    // outlive it.
    let compiled = unsafe { cudarc::nvrtc::result::compile_program(prog, &options) };
    // SAFETY: as above; the log is readable whether or not compilation succeeded.
    let log = unsafe { cudarc::nvrtc::result::get_program_log(prog) }
        .map(|raw| c_chars_to_string(&raw))
        .unwrap_or_default();
    let cubin = match compiled {
        Ok(()) => get_cubin(prog),
        Err(e) => Err(KernelError::KernelCompile {
            source_name: source.name.to_string(),
            arch: arch.to_string(),
            log: format!("{e}\n{log}"),
        }),
    };
    // SAFETY: `prog` is live and not used after this call.
    let destroyed = unsafe { cudarc::nvrtc::result::destroy_program(prog) };
    let cubin = cubin?;
    destroyed.map_err(|e| cuda_error("nvrtcDestroyProgram", e))?;
    Ok(CompiledKernel {
        source: source.name,
        arch: arch.to_string(),
        cubin,
        resources: parse_ptxas_log(&log),
        log,
    })
}

fn get_cubin(prog: cudarc::nvrtc::sys::nvrtcProgram) -> Result<Vec<u8>> {
    let mut size = 0usize;
    // SAFETY: `prog` is a live, successfully compiled program; `size` is a valid out pointer.
    unsafe { cudarc::nvrtc::sys::nvrtcGetCUBINSize(prog, &mut size) }
        .result()
        .map_err(|e| cuda_error("nvrtcGetCUBINSize", e))?;
    let mut cubin = vec![0u8; size];
    // SAFETY: the buffer holds exactly `size` bytes, as NVRTC asked for.
    unsafe { cudarc::nvrtc::sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr() as *mut c_char) }
        .result()
        .map_err(|e| cuda_error("nvrtcGetCUBIN", e))?;
    if cubin.is_empty() {
        return Err(KernelError::Cuda {
            call: "nvrtcGetCUBIN".to_string(),
            message: "empty CUBIN (was a virtual compute_XX architecture given?)".to_string(),
        });
    }
    Ok(cubin)
}

fn c_chars_to_string(raw: &[c_char]) -> String {
    let bytes: Vec<u8> = raw
        .iter()
        .map(|&c| c as u8)
        .take_while(|&b| b != 0)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

pub(crate) fn cuda_error(call: &str, e: impl std::fmt::Display) -> KernelError {
    KernelError::Cuda {
        call: call.to_string(),
        message: e.to_string(),
    }
}

/// Reads ptxas's `-v` report out of an NVRTC log: one entry per `Compiling entry function`,
/// filled from the following `… bytes stack frame, … spill stores, … spill loads` and
/// `Used N registers, … smem` lines. Unknown lines are ignored.
pub fn parse_ptxas_log(log: &str) -> Vec<KernelResources> {
    let mut out: Vec<KernelResources> = Vec::new();
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let name = rest.split('\'').next().unwrap_or_default();
            out.push(KernelResources {
                name: name.to_string(),
                ..KernelResources::default()
            });
            continue;
        }
        let Some(current) = out.last_mut() else {
            continue;
        };
        if line.contains("bytes stack frame") {
            current.stack_frame = number_before(line, "bytes stack frame").unwrap_or(0);
            current.spill_stores = number_before(line, "bytes spill stores").unwrap_or(0);
            current.spill_loads = number_before(line, "bytes spill loads").unwrap_or(0);
        } else if line.contains("Used") && line.contains("registers") {
            current.registers = number_before(line, "registers").unwrap_or(0);
            current.shared_bytes = number_before(line, "bytes smem").unwrap_or(0);
        }
    }
    out
}

/// The integer written just before `marker` in `line` (`"12 bytes spill stores"` → 12).
fn number_before(line: &str, marker: &str) -> Option<u32> {
    let head = &line[..line.find(marker)?];
    head.trim_end()
        .rsplit(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|n| n.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_ptxas_report() {
        let log = "ptxas info    : 0 bytes gmem\n\
            ptxas info    : Compiling entry function 'alpha' for 'sm_90'\n\
            ptxas info    : Function properties for alpha\n\
            \x20   8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n\
            ptxas info    : Used 40 registers, used 1 barriers, 2048 bytes smem, 400 bytes cmem[0]\n\
            ptxas info    : Compiling entry function 'beta' for 'sm_90'\n\
            ptxas info    : Function properties for beta\n\
            \x20   0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
            ptxas info    : Used 255 registers, used 0 barriers, 368 bytes cmem[0]\n";
        let r = parse_ptxas_log(log);
        assert_eq!(r.len(), 2);
        assert_eq!(
            r[0],
            KernelResources {
                name: "alpha".into(),
                registers: 40,
                spill_stores: 4,
                spill_loads: 12,
                stack_frame: 8,
                shared_bytes: 2048,
            }
        );
        assert!(r[0].spills());
        assert_eq!(r[1].registers, 255);
        assert_eq!(r[1].shared_bytes, 0);
        assert!(!r[1].spills());
    }
}
