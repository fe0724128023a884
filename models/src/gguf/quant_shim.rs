//! TEMPORARY stand-in for `specdec_kernels::quant::QuantType` (same names and methods) until the
//! kernels' quant module is merged into main; then `reader.rs` imports the real one and this
//! file goes.
#![allow(missing_docs, non_camel_case_types)]

use crate::error::{ModelError, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantType {
    F32,
    F16,
    BF16,
    Q8_0,
    Q4_0,
    Q4_1,
    Q5_0,
    Q4_K,
    Q5_K,
    Q6_K,
}

const TABLE: [(QuantType, u32, &str, usize, usize); 10] = [
    (QuantType::F32, 0, "F32", 1, 4),
    (QuantType::F16, 1, "F16", 1, 2),
    (QuantType::Q4_0, 2, "Q4_0", 32, 18),
    (QuantType::Q4_1, 3, "Q4_1", 32, 20),
    (QuantType::Q5_0, 6, "Q5_0", 32, 22),
    (QuantType::Q8_0, 8, "Q8_0", 32, 34),
    (QuantType::Q4_K, 12, "Q4_K", 256, 144),
    (QuantType::Q5_K, 13, "Q5_K", 256, 176),
    (QuantType::Q6_K, 14, "Q6_K", 256, 210),
    (QuantType::BF16, 30, "BF16", 1, 2),
];

impl QuantType {
    fn row(self) -> (QuantType, u32, &'static str, usize, usize) {
        TABLE
            .into_iter()
            .find(|r| r.0 == self)
            .expect("every type is in the table")
    }
    pub fn from_ggml_id(id: u32) -> Result<Self> {
        TABLE
            .into_iter()
            .find(|r| r.1 == id)
            .map(|r| r.0)
            .ok_or_else(|| ModelError::Gguf {
                path: String::new(),
                offset: 0,
                reason: format!("unsupported GGML tensor type {id}"),
            })
    }
    pub fn ggml_id(self) -> u32 {
        self.row().1
    }
    pub fn name(self) -> &'static str {
        self.row().2
    }
    pub fn block_len(self) -> usize {
        self.row().3
    }
    pub fn block_bytes(self) -> usize {
        self.row().4
    }
}
