//! Tensor-parallel sharding: the [`Communicator`] trait (all-reduce, all-gather, broadcast,
//! barrier), an in-process implementation whose ranks are threads, an NCCL implementation for
//! ranks on GPUs, the [`ShardPlan`] that splits a decoder Megatron-style, and
//! [`ShardedModel`], a group of ranks seen as one model.

mod comm;
mod nccl;
mod plan;
mod sharded;

pub use comm::{Communicator, SingleRank, ThreadCommunicator};
pub use nccl::NcclCommunicator;
pub use plan::{split_even, ShardPlan};
pub use sharded::ShardedModel;
