//! A small GGUF v3 writer, for test fixtures and synthetic models (tiny Llama/Qwen2 files that
//! exercise the loader and runner without real weights).

use std::path::Path;

use super::value::{encode_str, Value};
use super::{DEFAULT_ALIGNMENT, GGUF_MAGIC};
use crate::error::{ModelError, Result};

/// Builds a GGUF v3 file in memory: metadata in insertion order, then the tensor table, then
/// the tensor data, each tensor padded to the alignment.
///
/// The writer stores what it is given: it does not check that a tensor's bytes match its type
/// and shape (so tests can build malformed files); [`super::GgufFile`] checks when reading.
#[derive(Debug, Clone)]
pub struct GgufWriter {
    metadata: Vec<(String, Value)>,
    tensors: Vec<PendingTensor>,
    alignment: usize,
}

#[derive(Debug, Clone)]
struct PendingTensor {
    name: String,
    shape: Vec<u64>,
    ggml_type: u32,
    data: Vec<u8>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl GgufWriter {
    /// An empty file with the default alignment (32 bytes, no `general.alignment` key).
    pub fn new() -> Self {
        Self {
            metadata: Vec::new(),
            tensors: Vec::new(),
            alignment: DEFAULT_ALIGNMENT,
        }
    }

    /// Sets the data alignment (a power of two) and records it as `general.alignment` (`u32`).
    ///
    /// # Panics
    /// When `alignment` is not a power of two (a bug in the calling test).
    pub fn alignment(&mut self, alignment: u32) -> &mut Self {
        assert!(
            alignment.is_power_of_two(),
            "alignment must be a power of two"
        );
        self.alignment = alignment as usize;
        self.metadata.retain(|(k, _)| k != "general.alignment");
        self.metadata
            .push(("general.alignment".to_owned(), Value::U32(alignment)));
        self
    }

    /// Appends a metadata key/value (any type convertible to [`Value`]: integers, floats,
    /// bools, strings, vectors of these, [`super::Array`]).
    pub fn metadata(&mut self, key: &str, value: impl Into<Value>) -> &mut Self {
        self.metadata.push((key.to_owned(), value.into()));
        self
    }

    /// Appends a tensor: `shape` in GGML order (innermost first), `ggml_type` the GGML type id
    /// (`QuantType::ggml_id()`), `data` its raw bytes.
    pub fn tensor(
        &mut self,
        name: &str,
        shape: &[usize],
        ggml_type: u32,
        data: Vec<u8>,
    ) -> &mut Self {
        self.tensors.push(PendingTensor {
            name: name.to_owned(),
            shape: shape.iter().map(|&d| d as u64).collect(),
            ggml_type,
            data,
        });
        self
    }

    /// Appends an `F32` tensor (GGML type 0) holding `values`.
    pub fn tensor_f32(&mut self, name: &str, shape: &[usize], values: &[f32]) -> &mut Self {
        let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.tensor(name, shape, 0, data)
    }

    /// The encoded file.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(GGUF_MAGIC);
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            encode_str(key, &mut out);
            out.extend_from_slice(&value.value_type().tag().to_le_bytes());
            value.encode(&mut out);
        }
        let mut offset = 0usize;
        for t in &self.tensors {
            encode_str(&t.name, &mut out);
            out.extend_from_slice(&(t.shape.len() as u32).to_le_bytes());
            for d in &t.shape {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.ggml_type.to_le_bytes());
            out.extend_from_slice(&(offset as u64).to_le_bytes());
            offset = (offset + t.data.len()).next_multiple_of(self.alignment);
        }
        for t in &self.tensors {
            out.resize(out.len().next_multiple_of(self.alignment), 0);
            out.extend_from_slice(&t.data);
        }
        out
    }

    /// Writes the encoded file to `path`.
    ///
    /// # Errors
    /// [`ModelError::Io`] when the file cannot be written.
    pub fn write(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        std::fs::write(path, self.to_bytes()).map_err(|source| ModelError::Io {
            path: path.display().to_string(),
            source,
        })
    }
}
