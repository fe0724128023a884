//! # specdec-algorithms
//!
//! Speculative-decoding algorithms behind small traits: drafters propose token trees with their
//! draft distributions, verifiers accept a path losslessly (or say they are lossy), speculation
//! policies choose the next budget. The exact proof machinery checks every lossless composition
//! against the target distribution by enumeration.

pub mod drafters;
pub mod error;
pub mod policy;
pub mod proof;
pub mod trees;
pub mod verify;

pub use error::{AlgorithmError, Result};
