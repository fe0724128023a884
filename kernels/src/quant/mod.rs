//! GGUF block formats: the tensor types ([`QuantType`]), their exact byte layouts,
//! dequantisation to f32 (and quantisation from it for the float types and Q8_0,
//! [`quantize`]), and the quantised matrix product that consumes the blocks directly.
//!
//! Layouts are documented on [`QuantType`]; the arithmetic order of dequantisation on
//! [`dequant`]. Both are the contract the CUDA port follows.
//!
//! [`qmatmul_fma`] ([`qmatmul`]) is the CPU twin of the device product that reads the blocks
//! (`qmatmul.cu`): one in-order FMA chain per output, bit-identical on both.
//!
//! Three products, all batch-invariant and bit-identical on every [`SimdLevel`]:
//! - [`quant_matmul`] ([`matmul`]): exact f32 activations, every type; the reference path
//!   (closest to an f32 PyTorch reference).
//! - [`quant_matmul_int8`] ([`int8`]): activations quantised to 8 bits per 256-block
//!   ([`Q8Activations`], quantise once per input and reuse), integer dot products, Q4_K and
//!   Q6_K only ([`int8_supported`]); ~3-4x faster per token, with llama.cpp-like deviation from
//!   the f32 result (bound stated in [`int8`]). On AVX-512 and AVX2 the fast kernels read a copy of the
//!   weights repacked sixteen rows at a time ([`Int8PackedMatrix`], [`int8_packed`]), with
//!   bit-identical results.
//! - [`quant_matmul_q32`] ([`int8_q32`]): the same idea for the 32-element types Q8_0, Q4_0,
//!   Q4_1 and Q5_0 ([`q32_supported`]), activations quantised per 32-block ([`Q8Blocks32`]),
//!   any width multiple of 32; on AVX-512 and AVX2 over the same 16-row tiles
//!   ([`quant_matmul_q32_packed`], [`int8_packed_q32`]).

pub mod cuda;
pub mod dequant;
pub mod float16;
pub mod int8;
pub mod int8_packed;
pub mod int8_packed_q32;
pub mod int8_q32;
pub mod matmul;
pub mod qmatmul;
pub mod quantize;
pub mod synthetic;
pub mod types;

#[cfg(test)]
mod dequant_tests;
#[cfg(test)]
mod int8_packed_q32_tests;
#[cfg(test)]
mod int8_packed_tests;
#[cfg(test)]
mod int8_q32_tests;
#[cfg(test)]
mod int8_tests;
#[cfg(test)]
mod matmul_tests;
#[cfg(test)]
pub(crate) mod testutil;

pub use dequant::{dequantize_row, dequantize_row_to_vec};
pub use float16::{bf16_to_f32, f16_to_f32, f32_to_f16};
pub use int8::{int8_supported, quant_matmul_int8, quant_matmul_int8_with, Q8Activations};
pub use int8_packed::{
    quant_matmul_int8_packed, quant_matmul_int8_packed_many, quant_matmul_int8_packed_with,
    Int8PackedMatrix, PackedProduct,
};
pub use int8_packed_q32::{
    quant_matmul_q32_packed, quant_matmul_q32_packed_many, quant_matmul_q32_packed_with,
};
pub use int8_q32::{q32_supported, quant_matmul_q32, quant_matmul_q32_with, Q8Blocks32};
pub use matmul::{quant_matmul, quant_matmul_with, QuantMatrix, SimdLevel};
pub use qmatmul::{qgather_rows, qmatmul_fma};
pub use quantize::quantize_values;
pub use synthetic::synthetic_weights;
pub use types::QuantType;
