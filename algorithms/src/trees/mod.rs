//! Draft-tree shapes: the shared [`specdec_kernels::TreeTopology`] plus the rank of every draft
//! node among its parent's candidates, and the constructions of published tree drafters.

mod shape;

pub use shape::TreeShape;
