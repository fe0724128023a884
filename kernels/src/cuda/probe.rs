//! Finding the CUDA libraries and GPUs without ever panicking, and the run-time device choice.

use crate::error::{KernelError, Result};

/// Which CUDA libraries the dynamic loader can open in this process (`LD_LIBRARY_PATH` and the
/// system paths; cudarc tries `libX.so`, `libX.so.13` and older sonames).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CudaLibraries {
    /// `libcuda` (the driver API): needed for any GPU work.
    pub driver: bool,
    /// `libnvrtc`: needed to compile kernels (also without a GPU).
    pub nvrtc: bool,
    /// `libcublas`: needed for the fast matrix products.
    pub cublas: bool,
}

impl CudaLibraries {
    /// Probes the three libraries. Loading is attempted and the handle dropped at once; nothing
    /// else of CUDA is touched, so this never panics and is cheap enough to call per test.
    pub fn probe() -> Self {
        // SAFETY: `is_culib_present` only tries `dlopen` on the candidate names and drops the
        // handle; it runs no library code besides the library's own initialisers.
        unsafe {
            Self {
                driver: cudarc::driver::sys::is_culib_present(),
                nvrtc: cudarc::nvrtc::sys::is_culib_present(),
                cublas: cudarc::cublas::sys::is_culib_present(),
            }
        }
    }

    /// `Ok(())` when NVRTC can be loaded, else [`KernelError::CudaUnavailable`].
    pub fn require_nvrtc(&self) -> Result<()> {
        if self.nvrtc {
            Ok(())
        } else {
            Err(KernelError::CudaUnavailable {
                what: "libnvrtc is not on the library path (source scripts/setup.d/20-nvrtc.sh, \
                       or run scripts/test.sh)"
                    .to_string(),
            })
        }
    }

    /// `Ok(())` when the driver library can be loaded, else [`KernelError::CudaUnavailable`].
    pub fn require_driver(&self) -> Result<()> {
        if self.driver {
            Ok(())
        } else {
            Err(KernelError::CudaUnavailable {
                what: "libcuda (the NVIDIA driver) is not on the library path".to_string(),
            })
        }
    }
}

/// Number of CUDA devices visible to this process; 0 when the driver library is missing or the
/// driver reports an error (no GPU, driver too old). Never panics.
pub fn cuda_device_count() -> usize {
    if !CudaLibraries::probe().driver {
        return 0;
    }
    // The driver library is present, so cudarc's loader will not panic; errors come back as values.
    if cudarc::driver::result::init().is_err() {
        return 0;
    }
    match cudarc::driver::result::device::get_count() {
        Ok(n) if n > 0 => n as usize,
        _ => 0,
    }
}

/// Where kernels run: a run-time value, so one binary serves machines with and without GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Device {
    /// The CPU reference backend (always available).
    #[default]
    Cpu,
    /// The CUDA device with this ordinal.
    Cuda(usize),
}

impl Device {
    /// The first GPU when one is usable (driver present and at least one device), else the CPU.
    pub fn best_available() -> Self {
        if cuda_device_count() > 0 {
            Device::Cuda(0)
        } else {
            Device::Cpu
        }
    }

    /// Parses `cpu`, `cuda` (ordinal 0) or `cuda:N`.
    ///
    /// # Errors
    /// [`KernelError::InvalidParameter`] for anything else.
    pub fn parse(text: &str) -> Result<Self> {
        let text = text.trim().to_ascii_lowercase();
        match text.as_str() {
            "cpu" => Ok(Device::Cpu),
            "cuda" | "gpu" => Ok(Device::Cuda(0)),
            _ => text
                .strip_prefix("cuda:")
                .and_then(|n| n.parse::<usize>().ok())
                .map(Device::Cuda)
                .ok_or_else(|| KernelError::InvalidParameter {
                    what: "device",
                    reason: format!("`{text}` is not cpu, cuda or cuda:N"),
                }),
        }
    }

    /// `SPECDEC_DEVICE` when set (see [`Device::parse`]), else [`Device::best_available`].
    ///
    /// # Errors
    /// [`KernelError::InvalidParameter`] when the variable is set to something unparseable.
    pub fn from_env() -> Result<Self> {
        match std::env::var("SPECDEC_DEVICE") {
            Ok(text) if !text.trim().is_empty() => Self::parse(&text),
            _ => Ok(Self::best_available()),
        }
    }

    /// Whether this is a GPU.
    pub fn is_cuda(&self) -> bool {
        matches!(self, Device::Cuda(_))
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Device::Cpu => write!(f, "cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_never_panics_and_counts_agree() {
        let libs = CudaLibraries::probe();
        let n = cuda_device_count();
        if !libs.driver {
            assert_eq!(n, 0, "no driver library must mean no devices");
            assert!(libs.require_driver().is_err());
        }
        assert_eq!(Device::best_available().is_cuda(), n > 0);
    }

    #[test]
    fn device_parse_round_trips() {
        for d in [Device::Cpu, Device::Cuda(0), Device::Cuda(3)] {
            assert_eq!(Device::parse(&d.to_string()).unwrap(), d);
        }
        assert_eq!(Device::parse(" CUDA ").unwrap(), Device::Cuda(0));
        assert!(Device::parse("cuda:x").is_err());
        assert!(Device::parse("tpu").is_err());
    }
}
