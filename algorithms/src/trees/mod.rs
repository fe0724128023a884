//! Draft-tree shapes: the shared [`specdec_kernels::TreeTopology`] plus the rank of every draft
//! node among its parent's candidates, and the constructions of published tree drafters: static
//! trees from "choices" paths, k-ary trees, and Sequoia-style optimal trees (plain and
//! hardware-aware).

mod choices;
mod sequoia;
mod shape;

pub use sequoia::{expected_accepted_length, sequoia_tree, PlannedTree, SequoiaPlanner};
pub use shape::TreeShape;
