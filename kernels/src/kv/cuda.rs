//! CUDA launchers for the paged KV cache kernels (`kv_cache.cu`): append and slot moves.
//!
//! Device buffers are cudarc slices on [`Gpu::stream`]; the pool uses the layout of
//! `kv/layout.rs` (`[layer][K|V][kv_head][slot][head_dim]` per block), element type `f32`.
//! Physical slots are `block * block_size + slot_in_block`.

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use crate::cuda::nvrtc::cuda_error;
use crate::cuda::{sources, Gpu};
use crate::error::{KernelError, Result};
use crate::kv::moves::{check_moves, check_slots_inside};

/// The shape of a device KV pool (mirrors `KvLayout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvShape {
    /// Layers.
    pub num_layers: usize,
    /// KV heads.
    pub num_kv_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// Token slots per block.
    pub block_size: usize,
}

impl KvShape {
    /// Elements of one block: `layers * 2 * kv_heads * block_size * head_dim`.
    pub fn block_elems(&self) -> usize {
        self.num_layers * 2 * self.num_kv_heads * self.block_size * self.head_dim
    }

    /// Elements of one token slot over all layers, K and V, heads.
    pub fn token_elems(&self) -> usize {
        self.block_elems() / self.block_size
    }

    fn check(&self) -> Result<()> {
        if self.num_layers == 0
            || self.num_kv_heads == 0
            || self.head_dim == 0
            || self.block_size == 0
        {
            return Err(KernelError::InvalidParameter {
                what: "KV shape",
                reason: format!("every dimension must be >= 1: {self:?}"),
            });
        }
        if self.head_dim > 1024 {
            return Err(KernelError::InvalidParameter {
                what: "head_dim",
                reason: format!("{} > 1024", self.head_dim),
            });
        }
        Ok(())
    }
}

/// Token slots of a pool of `pool_len` elements of `shape`.
fn slot_capacity(pool_len: usize, shape: &KvShape) -> usize {
    pool_len / shape.block_elems() * shape.block_size
}

/// Writes the K and V rows of `slots.len()` new tokens (`k_new`, `v_new`: f32
/// `[tokens, kv_heads, head_dim]` on the device) of `layer` into their physical `slots`.
///
/// # Errors
/// [`KernelError::ShapeMismatch`] / [`KernelError::InvalidParameter`] for inconsistent sizes or
/// slots outside the pool; [`KernelError::Cuda`] when a CUDA call fails.
pub fn append(
    gpu: &Gpu,
    pool: &mut CudaSlice<f32>,
    shape: &KvShape,
    layer: usize,
    k_new: &CudaSlice<f32>,
    v_new: &CudaSlice<f32>,
    slots: &[u32],
) -> Result<()> {
    shape.check()?;
    let row = shape.num_kv_heads * shape.head_dim;
    for (what, len) in [("k_new", k_new.len()), ("v_new", v_new.len())] {
        if len != slots.len() * row {
            return Err(KernelError::ShapeMismatch {
                what: what.into(),
                expected: slots.len() * row,
                actual: len,
            });
        }
    }
    if layer >= shape.num_layers {
        return Err(KernelError::InvalidParameter {
            what: "layer",
            reason: format!("{layer} >= {}", shape.num_layers),
        });
    }
    check_slots_inside(slots, slot_capacity(pool.len(), shape))?;
    if slots.is_empty() {
        return Ok(());
    }
    let stream = gpu.stream();
    let slots_d = stream
        .clone_htod(slots)
        .map_err(|e| cuda_error("upload slots", e))?;
    let f = gpu.function(&sources::KV_CACHE, "kv_append_f32")?;
    let cfg = LaunchConfig {
        grid_dim: (slots.len() as u32, shape.num_kv_heads as u32, 1),
        block_dim: (shape.head_dim as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    let (layer, heads, bs, hd, be) = (
        layer as u32,
        shape.num_kv_heads as u32,
        shape.block_size as u32,
        shape.head_dim as u32,
        shape.block_elems() as u64,
    );
    let mut launch = stream.launch_builder(&f);
    launch
        .arg(pool)
        .arg(k_new)
        .arg(v_new)
        .arg(&slots_d)
        .arg(&layer)
        .arg(&heads)
        .arg(&bs)
        .arg(&hd)
        .arg(&be);
    // SAFETY: argument types and order match `kv_append_f32`; sizes were checked above, so every
    // index the kernel forms lies inside its buffer.
    unsafe { launch.launch(cfg) }.map_err(|e| cuda_error("launch kv_append_f32", e))?;
    Ok(())
}

/// Moves the K/V of every token slot `src[i]` to `dst[i]` (all layers, K and V, all heads), as
/// if all reads happened before all writes — the tree-path commit of a whole batch (accepted
/// nodes compacted to contiguous positions). Pairs with `src == dst` are skipped.
///
/// # Errors
/// [`KernelError::ShapeMismatch`] when `src` and `dst` differ in length,
/// [`KernelError::InvalidParameter`] for slots outside the pool or a destination written twice;
/// [`KernelError::Cuda`] when a CUDA call fails.
pub fn move_slots(
    gpu: &Gpu,
    pool: &mut CudaSlice<f32>,
    shape: &KvShape,
    src: &[u32],
    dst: &[u32],
) -> Result<()> {
    shape.check()?;
    check_moves(src, dst, slot_capacity(pool.len(), shape))?;
    let (src, dst): (Vec<u32>, Vec<u32>) = src
        .iter()
        .zip(dst)
        .filter(|(s, d)| s != d)
        .map(|(s, d)| (*s, *d))
        .unzip();
    if src.is_empty() {
        return Ok(());
    }
    let stream = gpu.stream();
    let rows = (shape.num_layers * 2 * shape.num_kv_heads) as u32;
    let mut scratch = stream
        .alloc_zeros::<f32>(src.len() * shape.token_elems())
        .map_err(|e| cuda_error("alloc move scratch", e))?;
    let src_d = stream
        .clone_htod(&src)
        .map_err(|e| cuda_error("upload move sources", e))?;
    let dst_d = stream
        .clone_htod(&dst)
        .map_err(|e| cuda_error("upload move destinations", e))?;
    let cfg = LaunchConfig {
        grid_dim: (src.len() as u32, rows, 1),
        block_dim: (shape.head_dim as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    let (bs, hd, be) = (
        shape.block_size as u32,
        shape.head_dim as u32,
        shape.block_elems() as u64,
    );
    let gather = gpu.function(&sources::KV_CACHE, "kv_gather_slots_f32")?;
    let mut launch = stream.launch_builder(&gather);
    launch
        .arg(&*pool)
        .arg(&mut scratch)
        .arg(&src_d)
        .arg(&bs)
        .arg(&hd)
        .arg(&be);
    // SAFETY: argument types match `kv_gather_slots_f32`; slots were checked against the pool
    // and the scratch holds `moves * token_elems` elements, the grid's extent.
    unsafe { launch.launch(cfg) }.map_err(|e| cuda_error("launch kv_gather_slots_f32", e))?;
    let scatter = gpu.function(&sources::KV_CACHE, "kv_scatter_slots_f32")?;
    let mut launch = stream.launch_builder(&scatter);
    launch
        .arg(pool)
        .arg(&scratch)
        .arg(&dst_d)
        .arg(&bs)
        .arg(&hd)
        .arg(&be);
    // SAFETY: as for the gather, with the destination slots.
    unsafe { launch.launch(cfg) }.map_err(|e| cuda_error("launch kv_scatter_slots_f32", e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::testing::gpu_for_test;

    fn pattern(n: usize, salt: f32) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 7919) % 1013) as f32 * 0.5 + salt)
            .collect()
    }

    fn elem(shape: &KvShape, slot: u32, layer: usize, part: usize, head: usize, d: usize) -> usize {
        let (b, s) = (
            slot as usize / shape.block_size,
            slot as usize % shape.block_size,
        );
        b * shape.block_elems()
            + ((layer * 2 + part) * shape.num_kv_heads + head) * shape.block_size * shape.head_dim
            + s * shape.head_dim
            + d
    }

    #[test]
    #[ignore = "needs a GPU"]
    fn append_then_move_matches_host_indexing() {
        let Some(gpu) = gpu_for_test("kv::cuda::append_then_move") else {
            return;
        };
        // Odd sizes: 3 layers, 5 heads, head_dim 24, block 7; 9 blocks.
        let shape = KvShape {
            num_layers: 3,
            num_kv_heads: 5,
            head_dim: 24,
            block_size: 7,
        };
        let blocks = 9;
        let mut host = pattern(blocks * shape.block_elems(), 0.25);
        let stream = gpu.stream();
        let mut pool = stream.clone_htod(&host).unwrap();
        let slots: Vec<u32> = vec![3, 10, 11, 40, 62];
        let row = shape.num_kv_heads * shape.head_dim;
        let k = pattern(slots.len() * row, 1000.0);
        let v = pattern(slots.len() * row, 2000.0);
        let (kd, vd) = (
            stream.clone_htod(&k).unwrap(),
            stream.clone_htod(&v).unwrap(),
        );
        append(&gpu, &mut pool, &shape, 1, &kd, &vd, &slots).unwrap();
        for (t, &slot) in slots.iter().enumerate() {
            for h in 0..shape.num_kv_heads {
                for d in 0..shape.head_dim {
                    host[elem(&shape, slot, 1, 0, h, d)] =
                        k[(t * shape.num_kv_heads + h) * shape.head_dim + d];
                    host[elem(&shape, slot, 1, 1, h, d)] =
                        v[(t * shape.num_kv_heads + h) * shape.head_dim + d];
                }
            }
        }
        assert_eq!(stream.clone_dtoh(&pool).unwrap(), host, "append");
        // A commit whose destinations overlap its sources (compaction of a tree path).
        let src = [12u32, 14, 15, 30];
        let dst = [11u32, 12, 14, 15];
        move_slots(&gpu, &mut pool, &shape, &src, &dst).unwrap();
        let before = host.clone();
        for (s, d) in src.iter().zip(&dst) {
            for l in 0..shape.num_layers {
                for p in 0..2 {
                    for h in 0..shape.num_kv_heads {
                        for e in 0..shape.head_dim {
                            host[elem(&shape, *d, l, p, h, e)] =
                                before[elem(&shape, *s, l, p, h, e)];
                        }
                    }
                }
            }
        }
        assert_eq!(stream.clone_dtoh(&pool).unwrap(), host, "move");
        assert!(move_slots(&gpu, &mut pool, &shape, &[1, 2], &[5, 5]).is_err());
        assert!(move_slots(&gpu, &mut pool, &shape, &[1], &[63]).is_err());
    }
}
