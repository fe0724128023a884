//! One GPU: its context and stream, kernels compiled at first use and cached, and cuBLAS.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream};
use cudarc::nvrtc::Ptx;

use super::nvrtc::{compile, cuda_error, KernelResources};
use super::probe::CudaLibraries;
use super::sources::KernelSource;
use crate::error::{KernelError, Result};

/// A loaded module and ptxas's report for it.
type LoadedModule = (Arc<CudaModule>, Vec<KernelResources>);

/// A CUDA device ready for kernel launches: a context, one in-order stream that every launcher of
/// this crate uses, and the family modules compiled with NVRTC for this device's exact
/// architecture (`sm_{major}{minor}`) the first time one of their kernels is asked for.
///
/// Obtain it with [`Gpu::shared`], which hands out one instance per ordinal and process.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    arch: String,
    modules: Mutex<HashMap<&'static str, LoadedModule>>,
    blas: Mutex<Option<Arc<cudarc::cublas::CudaBlas>>>,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu")
            .field("ordinal", &self.ctx.ordinal())
            .field("arch", &self.arch)
            .finish_non_exhaustive()
    }
}

impl Gpu {
    /// The process-wide instance for device `ordinal`, created on first call.
    ///
    /// # Errors
    /// [`KernelError::CudaUnavailable`] when the driver or NVRTC library is missing or there is no
    /// such device (probed first: never panics); [`KernelError::Cuda`] when context creation fails.
    pub fn shared(ordinal: usize) -> Result<Arc<Gpu>> {
        static ALL: OnceLock<Mutex<HashMap<usize, Arc<Gpu>>>> = OnceLock::new();
        let all = ALL.get_or_init(|| Mutex::new(HashMap::new()));
        let mut all = all.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(gpu) = all.get(&ordinal) {
            return Ok(gpu.clone());
        }
        let gpu = Arc::new(Self::create(ordinal)?);
        all.insert(ordinal, gpu.clone());
        Ok(gpu)
    }

    fn create(ordinal: usize) -> Result<Gpu> {
        let libs = CudaLibraries::probe();
        libs.require_driver()?;
        libs.require_nvrtc()?;
        let count = super::probe::cuda_device_count();
        if ordinal >= count {
            return Err(KernelError::CudaUnavailable {
                what: format!("CUDA device {ordinal} (this machine has {count})"),
            });
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| cuda_error("cuCtxCreate", e))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| cuda_error("cuDeviceGetAttribute(compute capability)", e))?;
        let stream = ctx.default_stream();
        Ok(Gpu {
            ctx,
            stream,
            arch: format!("sm_{major}{minor}"),
            modules: Mutex::new(HashMap::new()),
            blas: Mutex::new(None),
        })
    }

    /// The device's real architecture, e.g. `sm_90`.
    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// The CUDA context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream all launchers of this crate enqueue on (in order).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The device name reported by the driver.
    pub fn name(&self) -> String {
        self.ctx
            .name()
            .unwrap_or_else(|_| "unknown CUDA device".into())
    }

    /// Kernel `entry` of `source`, compiling and loading the source on first use. Sources that
    /// need `sm_90a` features are compiled for `sm_90a` on `sm_90` devices.
    ///
    /// # Errors
    /// [`KernelError::KernelCompile`] when NVRTC rejects the source; [`KernelError::Cuda`] when
    /// loading the module or finding the entry fails.
    pub fn function(&self, source: &'static KernelSource, entry: &str) -> Result<CudaFunction> {
        let mut modules = self.modules.lock().unwrap_or_else(|p| p.into_inner());
        if !modules.contains_key(source.name) {
            let arch = if source.needs_sm90a && self.arch == "sm_90" {
                "sm_90a".to_string()
            } else {
                self.arch.clone()
            };
            let compiled = compile(source, &arch)?;
            let module = self
                .ctx
                .load_module(Ptx::from_binary(compiled.cubin))
                .map_err(|e| cuda_error(&format!("cuModuleLoadData({})", source.name), e))?;
            modules.insert(source.name, (module, compiled.resources));
        }
        let (module, _) = &modules[source.name];
        module
            .load_function(entry)
            .map_err(|e| cuda_error(&format!("cuModuleGetFunction({entry})"), e))
    }

    /// ptxas's report for a source already loaded on this device (empty if not loaded yet).
    pub fn resources(&self, source: &'static KernelSource) -> Vec<KernelResources> {
        let modules = self.modules.lock().unwrap_or_else(|p| p.into_inner());
        modules
            .get(source.name)
            .map(|(_, r)| r.clone())
            .unwrap_or_default()
    }

    /// The cuBLAS handle bound to [`Gpu::stream`], created on first use.
    ///
    /// # Errors
    /// [`KernelError::CudaUnavailable`] when libcublas is missing; [`KernelError::Cuda`] when
    /// handle creation fails.
    pub fn blas(&self) -> Result<Arc<cudarc::cublas::CudaBlas>> {
        let mut blas = self.blas.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(b) = blas.as_ref() {
            return Ok(b.clone());
        }
        if !CudaLibraries::probe().cublas {
            return Err(KernelError::CudaUnavailable {
                what: "libcublas is not on the library path".to_string(),
            });
        }
        let handle = Arc::new(
            cudarc::cublas::CudaBlas::new(self.stream.clone())
                .map_err(|e| cuda_error("cublasCreate", e))?,
        );
        *blas = Some(handle.clone());
        Ok(handle)
    }

    /// Waits for all work queued on [`Gpu::stream`].
    ///
    /// # Errors
    /// [`KernelError::Cuda`] with the first asynchronous error a kernel raised.
    pub fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(|e| cuda_error("cuStreamSynchronize", e))
    }
}
