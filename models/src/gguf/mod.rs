//! GGUF v3 model files: a memory-mapped reader (metadata, tensor table, alignment, raw tensor
//! bytes) and a small writer for test fixtures and synthetic models.
//!
//! ```no_run
//! # fn main() -> specdec_models::Result<()> {
//! use specdec_models::gguf::GgufFile;
//! let file = GgufFile::open("model.gguf")?;
//! let layers = file.metadata().get_u32("llama.block_count")?;
//! let embd = file.tensor("token_embd.weight")?; // quant type, shape [hidden, vocab], bytes
//! # let _ = (layers, embd);
//! # Ok(()) }
//! ```

mod metadata;
mod reader;
mod value;
pub mod writer;

pub use metadata::{FromValue, Metadata};
pub use reader::{GgufFile, Tensor, TensorInfo};
/// The GGML tensor types (re-exported from the kernels, which own the block layouts).
pub use specdec_kernels::quant::QuantType;
pub use value::{Array, Value, ValueType};
pub use writer::GgufWriter;

/// The four bytes every GGUF file starts with.
pub const GGUF_MAGIC: &[u8; 4] = b"GGUF";

/// The data alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: usize = 32;

/// The most dimensions a tensor may have (GGML's limit).
pub const MAX_DIMS: usize = 4;

/// The deepest nesting of arrays inside arrays the reader accepts (real files use none).
pub const MAX_ARRAY_NESTING: usize = 8;
