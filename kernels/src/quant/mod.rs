//! GGUF block formats: the tensor types ([`QuantType`]), their exact byte layouts,
//! dequantisation to f32, and the quantised matrix product that consumes the blocks directly.
//!
//! Layouts are documented on [`QuantType`]; the arithmetic order of dequantisation on
//! [`dequant`]. Both are the contract the CUDA port follows.

pub mod dequant;
pub mod float16;
pub mod matmul;
pub mod types;

#[cfg(test)]
mod dequant_tests;
#[cfg(test)]
mod matmul_tests;
#[cfg(test)]
pub(crate) mod testutil;

pub use dequant::{dequantize_row, dequantize_row_to_vec};
pub use float16::{bf16_to_f32, f16_to_f32, f32_to_f16};
pub use matmul::{quant_matmul, quant_matmul_with, QuantMatrix, SimdLevel};
pub use types::QuantType;
