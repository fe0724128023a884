//! The [`Communicator`] of tensor-parallel ranks on GPUs: NCCL, loaded at run time.
//!
//! `libnccl` is opened by the dynamic loader on first use (cudarc's `dynamic-loading`), like the
//! driver, so a build without CUDA runs everywhere and [`NcclCommunicator::available`] says
//! whether this machine can form a group. NCCL puts one rank per GPU: a group of `n` ranks
//! needs `n` devices ([`NcclCommunicator::group`] refuses more ranks than devices).
//!
//! **The contract of the trait is kept exactly.** The trait promises sums in rank order, the
//! same bits on every rank. NCCL's own all-reduce sums in an order that depends on its ring or
//! tree algorithm, so [`NcclCommunicator::all_reduce_sum`] all-gathers the ranks' buffers with
//! NCCL and sums them in rank order on the host: `world_size`× the traffic of a reduce, and
//! bit-identical to the in-process [`super::ThreadCommunicator`]. The buffers of the trait are
//! host slices; each collective stages them through device memory on the rank's stream and
//! synchronises before returning. A GPU rank's forward sums on the device instead
//! ([`NcclCommunicator::all_reduce_sum_device`]): the same all-gather, then the rank-order sum
//! by `sum_ranks_cuda`, the same bits without leaving the GPU; it gathers its logits there too
//! ([`NcclCommunicator::all_gather_padded_device`]).
//!
//! Each rank's NCCL calls run on its GPU's [`Gpu`] stream, the stream its kernels run on, so a
//! collective is ordered after the kernels that wrote its input without a host wait.
//!
//! An NCCL group cannot be aborted from here ([`Communicator::abort`] does nothing): a rank
//! that fails between collectives leaves the others waiting in the next one. The ranks of a
//! [`super::ShardedModel`] run the same checks on the same calls before their first
//! collective, so bad input fails on every rank alike.

use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::driver::{CudaSlice, CudaStream};
use cudarc::nccl::Comm;
use specdec_kernels::cuda::Gpu;
use specdec_kernels::ops::cuda::sum_ranks_cuda;
use specdec_kernels::ops::sum_ranks;

use super::comm::Communicator;
use crate::error::{ModelError, Result};

/// One NCCL rank: a communicator bound to one GPU's stream.
pub struct NcclCommunicator {
    rank: usize,
    world: usize,
    stream: Arc<CudaStream>,
    comm: Mutex<CommCell>,
}

/// An NCCL communicator handle, used by one thread at a time.
struct CommCell(Comm);

// SAFETY: an NCCL communicator may be used from any thread as long as calls on it do not
// overlap; the `Mutex` around every `CommCell` serialises them.
unsafe impl Send for CommCell {}

impl std::fmt::Debug for NcclCommunicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NcclCommunicator({}/{})", self.rank, self.world)
    }
}

fn nccl_error(what: &str, err: impl std::fmt::Debug) -> ModelError {
    ModelError::Communicator(format!("NCCL {what} failed: {err:?}"))
}

impl NcclCommunicator {
    /// Whether the driver and NCCL libraries can be loaded and at least one GPU is visible.
    /// Never panics.
    pub fn available() -> bool {
        // SAFETY: `is_culib_present` only tries `dlopen` on the candidate names and drops the
        // handle.
        let nccl = unsafe { cudarc::nccl::sys::is_culib_present() };
        nccl && specdec_kernels::cuda::probe::cuda_device_count() > 0
    }

    /// The communicators of a new group over GPUs `0..world` (rank `r` on device `r`), created
    /// together in this process (`ncclCommInitAll`). Give each to one thread: collectives block
    /// until every rank has called them.
    ///
    /// # Errors
    /// [`ModelError::Communicator`] when `world` is zero, NCCL or the driver cannot be loaded,
    /// fewer than `world` GPUs are visible, or NCCL fails to initialise.
    pub fn group(world: usize) -> Result<Vec<Self>> {
        if world == 0 {
            return Err(ModelError::Communicator(
                "a group needs at least one rank".into(),
            ));
        }
        let devices = specdec_kernels::cuda::probe::cuda_device_count();
        if devices < world {
            return Err(ModelError::Communicator(format!(
                "NCCL puts one rank per GPU: {world} ranks need {world} GPUs, {devices} visible"
            )));
        }
        // SAFETY: as in `available`.
        if !unsafe { cudarc::nccl::sys::is_culib_present() } {
            return Err(ModelError::Communicator(
                "libnccl is not on the library path (install NCCL 2.x for CUDA 13)".into(),
            ));
        }
        let streams = (0..world)
            .map(|ordinal| {
                Gpu::shared(ordinal)
                    .map(|gpu| gpu.stream().clone())
                    .map_err(|e| nccl_error(&format!("opening GPU {ordinal}"), e))
            })
            .collect::<Result<Vec<_>>>()?;
        let comms =
            Comm::from_devices(streams.clone()).map_err(|e| nccl_error("ncclCommInitAll", e))?;
        Ok(comms
            .into_iter()
            .zip(streams)
            .enumerate()
            .map(|(rank, (comm, stream))| Self {
                rank,
                world,
                stream,
                comm: Mutex::new(CommCell(comm)),
            })
            .collect())
    }

    /// The CUDA device ordinal of this rank's GPU (rank `r` of [`NcclCommunicator::group`] is
    /// on device `r`).
    pub fn ordinal(&self) -> usize {
        self.stream.context().ordinal()
    }

    /// Replaces `buf` (this rank's partial sums on `gpu`, its own GPU) by the element-wise sum
    /// of every rank's `buf` in rank order, without leaving the device: NCCL all-gathers the
    /// buffers into `[world × len]`, then `sum_ranks_cuda` adds them rank by rank. The bits
    /// equal [`Communicator::all_reduce_sum`]'s. Every rank must call it with the same length
    /// (the ranks of one forward do); it is not checked, since checking would cost a host round
    /// trip per call. Asynchronous: ordered on the rank's stream.
    ///
    /// # Errors
    /// [`ModelError::Communicator`] when `gpu` is not this rank's GPU or NCCL fails; kernel
    /// errors.
    pub fn all_reduce_sum_device(&self, gpu: &Gpu, buf: &mut CudaSlice<f32>) -> Result<()> {
        self.check_gpu(gpu)?;
        if self.world == 1 || buf.is_empty() {
            return Ok(());
        }
        let gathered = self.gather_device(buf)?;
        Ok(sum_ranks_cuda(gpu, &gathered, self.world, buf)?)
    }

    /// Every rank's `local` (this rank's on `gpu`, its own GPU), each padded to `stride` values,
    /// end to end in rank order on the device (`[world × stride]`): the ranks' blocks may differ
    /// in length, as the LM head's vocabulary rows do. Every rank must pass the same `stride`.
    /// Asynchronous: ordered on the rank's stream.
    ///
    /// # Errors
    /// [`ModelError::Communicator`] when `gpu` is not this rank's GPU, `local` is longer than
    /// `stride`, or NCCL fails.
    pub fn all_gather_padded_device(
        &self,
        gpu: &Gpu,
        local: &CudaSlice<f32>,
        stride: usize,
    ) -> Result<CudaSlice<f32>> {
        self.check_gpu(gpu)?;
        if local.len() > stride {
            return Err(ModelError::Communicator(format!(
                "rank {} gathers {} values into a stride of {stride}",
                self.rank,
                local.len()
            )));
        }
        let mut send = self
            .stream
            .alloc_zeros::<f32>(stride)
            .map_err(|e| nccl_error("device allocation", e))?;
        self.stream
            .memcpy_dtod(local, &mut send.slice_mut(..local.len()))
            .map_err(|e| nccl_error("device-to-device copy", e))?;
        self.gather_device(&send)
    }

    /// Refuses a GPU other than this rank's: its collectives run on that GPU's stream.
    fn check_gpu(&self, gpu: &Gpu) -> Result<()> {
        if Arc::ptr_eq(gpu.stream(), &self.stream) {
            return Ok(());
        }
        Err(ModelError::Communicator(format!(
            "rank {} of the NCCL group runs on its own GPU's stream (device {}), not on {}",
            self.rank,
            self.ordinal(),
            gpu.name()
        )))
    }

    /// Every rank's `send` (all of one length) end to end in rank order, on the device.
    fn gather_device(&self, send: &CudaSlice<f32>) -> Result<CudaSlice<f32>> {
        let mut gathered = self
            .stream
            .alloc_zeros::<f32>(send.len() * self.world)
            .map_err(|e| nccl_error("device allocation", e))?;
        self.comm()
            .0
            .all_gather(send, &mut gathered)
            .map_err(|e| nccl_error("all_gather", e))?;
        Ok(gathered)
    }

    fn comm(&self) -> MutexGuard<'_, CommCell> {
        self.comm.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every rank's `local` (all of one length), concatenated in rank order, on the host.
    fn gather_equal<T>(&self, local: &[T]) -> Result<Vec<T>>
    where
        T: cudarc::nccl::NcclType + cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits,
    {
        let send = self
            .stream
            .clone_htod(local)
            .map_err(|e| nccl_error("host-to-device copy", e))?;
        let mut recv = self
            .stream
            .alloc_zeros::<T>(local.len() * self.world)
            .map_err(|e| nccl_error("device allocation", e))?;
        self.comm()
            .0
            .all_gather(&send, &mut recv)
            .map_err(|e| nccl_error("all_gather", e))?;
        self.stream
            .clone_dtoh(&recv)
            .map_err(|e| nccl_error("device-to-host copy", e))
    }
}

impl Communicator for NcclCommunicator {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world
    }

    fn all_reduce_sum(&self, buf: &mut [f32]) -> Result<()> {
        let lens = self.gather_equal(&[buf.len() as u64])?;
        if lens.iter().any(|&l| l != buf.len() as u64) {
            return Err(ModelError::Communicator(format!(
                "all_reduce_sum: rank {} has {} elements, the ranks have {lens:?}",
                self.rank,
                buf.len()
            )));
        }
        let all = self.gather_equal(buf)?;
        Ok(sum_ranks(&all, self.world, buf)?)
    }

    fn all_gather(&self, local: &[f32]) -> Result<Vec<Vec<f32>>> {
        let lens: Vec<usize> = self
            .gather_equal(&[local.len() as u64])?
            .into_iter()
            .map(|l| l as usize)
            .collect();
        let longest = lens.iter().copied().max().unwrap_or(0);
        let mut padded = local.to_vec();
        padded.resize(longest, 0.0);
        let all = self.gather_equal(&padded)?;
        Ok(lens
            .iter()
            .enumerate()
            .map(|(rank, &len)| all[rank * longest..rank * longest + len].to_vec())
            .collect())
    }

    fn broadcast(&self, buf: &mut Vec<f32>, root: usize) -> Result<()> {
        if root >= self.world {
            return Err(ModelError::Communicator(format!(
                "broadcast root {root} in a group of {}",
                self.world
            )));
        }
        let mut parts = self.all_gather(buf)?;
        *buf = parts.swap_remove(root);
        Ok(())
    }

    fn barrier(&self) -> Result<()> {
        self.gather_equal(&[0u8]).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::NcclCommunicator;
    use crate::shard::{Communicator, ThreadCommunicator};

    /// One rank's results: the all-reduced sum, the all-gather, the broadcast.
    type Outcome = (Vec<f32>, Vec<Vec<f32>>, Vec<f32>);

    /// The collectives on `world` ranks (threads), each rank's inputs derived from its rank.
    fn exercise<C: Communicator>(comms: Vec<C>) -> Vec<Outcome> {
        std::thread::scope(|s| {
            let handles: Vec<_> = comms
                .iter()
                .map(|comm| {
                    s.spawn(move || {
                        let r = comm.rank() as f32;
                        let mut sum = vec![0.1 + r, 1e8, -3.0 * r, 0.7];
                        comm.all_reduce_sum(&mut sum).unwrap();
                        let gathered = comm.all_gather(&vec![r; comm.rank() + 1]).unwrap();
                        let mut root = vec![r; 3];
                        comm.broadcast(&mut root, comm.world_size() - 1).unwrap();
                        comm.barrier().unwrap();
                        (sum, gathered, root)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn without_a_gpu_a_group_is_refused_with_a_reason() {
        if NcclCommunicator::available() {
            return;
        }
        let err = NcclCommunicator::group(1).unwrap_err().to_string();
        assert!(
            err.contains("NCCL") || err.contains("nccl") || err.contains("GPU"),
            "{err}"
        );
        assert!(NcclCommunicator::group(0).is_err());
    }

    /// One rank per visible GPU (NCCL will not put two ranks on one GPU): results bit-equal to
    /// the in-process group's. On a one-GPU machine this is a one-rank group; multi-GPU groups
    /// are exercised only where several GPUs are visible.
    #[test]
    #[ignore = "needs a GPU"]
    fn nccl_collectives_equal_the_in_process_group() {
        let world = specdec_kernels::cuda::probe::cuda_device_count().min(8);
        assert!(
            NcclCommunicator::available() && world > 0,
            "no GPU with NCCL visible"
        );
        let nccl = exercise(NcclCommunicator::group(world).unwrap());
        let threads = exercise(ThreadCommunicator::group(world).unwrap());
        for (rank, (a, b)) in nccl.iter().zip(&threads).enumerate() {
            assert_eq!(
                a.0.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                b.0.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "rank {rank} sum"
            );
            assert_eq!((&a.1, &a.2), (&b.1, &b.2), "rank {rank} gather/broadcast");
        }
        assert!(NcclCommunicator::group(world + 1).is_err());
    }
}
