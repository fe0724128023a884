//! Safetensors files, read and written in one place: the trained heads
//! ([`crate::heads::HeadFile`]) and the Hugging Face model folders ([`crate::hf_folder`]) both go
//! through [`SafetensorsFile`] and [`write_safetensors`].
//!
//! A file is memory-mapped and its header checked whole by the `safetensors` crate before any
//! tensor is handed out (header size and JSON, contiguous in-bounds data offsets, byte sizes
//! matching dtype × shape, nothing past the last tensor), so a truncated or hostile file is an
//! error naming it, never a panic or an out-of-bounds read.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use memmap2::Mmap;
use safetensors::tensor::TensorView;
pub use safetensors::Dtype;
use safetensors::SafeTensors;

use crate::error::{ModelError, Result};

/// One tensor's entry: its dtype, shape and where its bytes lie in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorEntry {
    /// The stored element type.
    pub dtype: Dtype,
    /// Dimensions, outermost first (row-major).
    pub shape: Vec<usize>,
    /// Byte offset of the data from the start of the file.
    pub offset: usize,
    /// Byte length of the data (`shape` elements × the dtype's size).
    pub len: usize,
}

impl TensorEntry {
    /// The number of elements (the product of `shape`; 1 for a scalar).
    pub fn n_elements(&self) -> usize {
        self.shape.iter().product()
    }
}

enum Backing {
    Mapped(Mmap),
    Owned(Vec<u8>),
}

/// A parsed safetensors file: its tensor table and free-form metadata, with the data
/// memory-mapped (or held in memory for [`SafetensorsFile::from_bytes`]). Immutable and `Sync`.
pub struct SafetensorsFile {
    path: PathBuf,
    backing: Backing,
    tensors: HashMap<String, TensorEntry>,
    metadata: HashMap<String, String>,
}

impl std::fmt::Debug for SafetensorsFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SafetensorsFile")
            .field("path", &self.path)
            .field("tensors", &self.tensors.len())
            .finish_non_exhaustive()
    }
}

impl SafetensorsFile {
    /// Memory-maps and parses the safetensors file at `path`.
    ///
    /// # Errors
    /// [`ModelError::Io`] when the file cannot be opened or mapped; otherwise as
    /// [`SafetensorsFile::from_bytes`], naming `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let io = |source| ModelError::Io {
            path: path.display().to_string(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        // SAFETY: the map is read-only and private to this value. Model and head files are
        // written once (renamed into place) and not modified in place; rewriting a file while it
        // is mapped is outside the contract, as for GGUF files.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        Self::parse(path.to_path_buf(), Backing::Mapped(map))
    }

    /// Parses a safetensors file held in memory (messages name it `<memory>`).
    ///
    /// # Errors
    /// [`ModelError::Config`] naming the file and what the `safetensors` crate refused: a
    /// header too small or too large, invalid JSON, overlapping or out-of-bounds offsets, a
    /// size that does not match dtype × shape, a truncated or over-long buffer.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self> {
        Self::parse(PathBuf::from("<memory>"), Backing::Owned(bytes))
    }

    fn parse(path: PathBuf, backing: Backing) -> Result<Self> {
        let bytes = match &backing {
            Backing::Mapped(m) => &m[..],
            Backing::Owned(v) => &v[..],
        };
        let (header_len, header) =
            SafeTensors::read_metadata(bytes).map_err(|e| safetensors_error(&path, e))?;
        let data_start = 8 + header_len;
        let tensors = header
            .tensors()
            .into_iter()
            .map(|(name, info)| {
                let (start, end) = info.data_offsets;
                let entry = TensorEntry {
                    dtype: info.dtype,
                    shape: info.shape.clone(),
                    offset: data_start + start,
                    len: end - start,
                };
                (name, entry)
            })
            .collect();
        let metadata = header.metadata().clone().unwrap_or_default();
        Ok(Self {
            path,
            backing,
            tensors,
            metadata,
        })
    }

    /// The file's path (`<memory>` for an in-memory file).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The whole file's bytes.
    pub fn bytes(&self) -> &[u8] {
        match &self.backing {
            Backing::Mapped(m) => m,
            Backing::Owned(v) => v,
        }
    }

    /// The free-form `__metadata__` string map of the header (empty when absent).
    pub fn metadata(&self) -> &HashMap<String, String> {
        &self.metadata
    }

    /// The names of all tensors, sorted.
    pub fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.tensors.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }

    /// The entry of tensor `name`, if the file has it.
    pub fn entry(&self, name: &str) -> Option<&TensorEntry> {
        self.tensors.get(name)
    }

    /// The stored bytes of `entry` (an entry of this file).
    pub fn data(&self, entry: &TensorEntry) -> &[u8] {
        &self.bytes()[entry.offset..entry.offset + entry.len]
    }

    /// Tensor `name` as f32 values (row-major), converted from F32, F16 or BF16.
    ///
    /// # Errors
    /// [`ModelError::MissingTensor`] when absent; [`ModelError::Config`] naming the file, the
    /// tensor and its dtype when it is of another type.
    pub fn to_f32(&self, name: &str) -> Result<Vec<f32>> {
        let entry = self.entry(name).ok_or_else(|| ModelError::MissingTensor {
            path: self.path.display().to_string(),
            name: name.to_string(),
        })?;
        decode_f32(entry.dtype, self.data(entry)).ok_or_else(|| {
            ModelError::Config(format!(
                "{}: tensor `{name}` is {:?} (F32, F16 or BF16 expected)",
                self.path.display(),
                entry.dtype
            ))
        })
    }
}

/// Little-endian `bytes` of `dtype` as f32 values, for the float types F32, F16 and BF16;
/// `None` for any other dtype.
pub fn decode_f32(dtype: Dtype, bytes: &[u8]) -> Option<Vec<f32>> {
    let halves = |f: fn([u8; 2]) -> f32| bytes.chunks_exact(2).map(|b| f([b[0], b[1]])).collect();
    match dtype {
        Dtype::F32 => Some(
            bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
        ),
        Dtype::F16 => Some(halves(|b| f16::from_le_bytes(b).to_f32())),
        Dtype::BF16 => Some(halves(|b| bf16::from_le_bytes(b).to_f32())),
        _ => None,
    }
}

/// `values` stored as `dtype` (F32 exactly, F16 / BF16 rounded to nearest), little-endian;
/// `None` for a dtype other than those three.
pub fn encode_f32(values: &[f32], dtype: Dtype) -> Option<Vec<u8>> {
    match dtype {
        Dtype::F32 => Some(values.iter().flat_map(|v| v.to_le_bytes()).collect()),
        Dtype::F16 => Some(
            values
                .iter()
                .flat_map(|&v| f16::from_f32(v).to_le_bytes())
                .collect(),
        ),
        Dtype::BF16 => Some(
            values
                .iter()
                .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
                .collect(),
        ),
        _ => None,
    }
}

/// One tensor to write: name, dtype, shape (outermost first) and little-endian bytes.
pub type OwnedTensor = (String, Dtype, Vec<usize>, Vec<u8>);

/// Writes `tensors` and `metadata` as a safetensors file at `path` (creating its folder),
/// through a temporary file renamed into place, so a reader never sees half a file.
///
/// # Errors
/// [`ModelError::Config`] when a tensor's bytes do not match its dtype × shape (naming the
/// path); I/O errors naming the path.
pub fn write_safetensors(
    path: &Path,
    tensors: &[OwnedTensor],
    metadata: Option<HashMap<String, String>>,
) -> Result<()> {
    let io = |source| ModelError::Io {
        path: path.display().to_string(),
        source,
    };
    let views = tensors
        .iter()
        .map(|(name, dtype, shape, bytes)| {
            TensorView::new(*dtype, shape.clone(), bytes)
                .map(|v| (name.clone(), v))
                .map_err(|e| safetensors_error(path, e))
        })
        .collect::<Result<Vec<_>>>()?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let partial = path.with_extension("safetensors.partial");
    safetensors::serialize_to_file(views, metadata, &partial)
        .map_err(|e| safetensors_error(path, e))?;
    std::fs::rename(&partial, path).map_err(io)
}

fn safetensors_error(path: &Path, e: safetensors::SafeTensorError) -> ModelError {
    ModelError::Config(format!("{}: safetensors: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one_tensor_file() -> Vec<u8> {
        let values = [1.0f32, -2.0, 0.5, 3.0, 4.0, -0.25];
        let bytes = encode_f32(&values, Dtype::BF16).unwrap();
        let view = TensorView::new(Dtype::BF16, vec![2, 3], &bytes).unwrap();
        safetensors::serialize([("w", view)], None).unwrap()
    }

    #[test]
    fn reads_what_it_writes_in_every_float_dtype() {
        let dir = std::env::temp_dir().join(format!("specdec-st-{}", std::process::id()));
        let values = [1.0f32, -2.0, 0.5, 3.0, 4.0, -0.25];
        let tensors: Vec<OwnedTensor> = [Dtype::F32, Dtype::F16, Dtype::BF16]
            .into_iter()
            .map(|dt| {
                let name = format!("{dt:?}");
                (name, dt, vec![2, 3], encode_f32(&values, dt).unwrap())
            })
            .collect();
        let path = dir.join("t.safetensors");
        let meta = HashMap::from([("k".to_string(), "v".to_string())]);
        write_safetensors(&path, &tensors, Some(meta)).unwrap();
        let file = SafetensorsFile::open(&path).unwrap();
        assert_eq!(file.names(), ["BF16", "F16", "F32"]);
        assert_eq!(file.metadata()["k"], "v");
        for name in ["F32", "F16", "BF16"] {
            assert_eq!(file.to_f32(name).unwrap(), values, "{name}");
            assert_eq!(file.entry(name).unwrap().shape, [2, 3]);
        }
        assert!(matches!(
            file.to_f32("absent"),
            Err(ModelError::MissingTensor { .. })
        ));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn truncated_and_garbled_files_are_errors() {
        let good = one_tensor_file();
        assert!(SafetensorsFile::from_bytes(good.clone()).is_ok());
        for cut in [0, 4, 8, 20, good.len() - 1] {
            let err = SafetensorsFile::from_bytes(good[..cut].to_vec()).unwrap_err();
            assert!(err.to_string().contains("safetensors"), "{cut}: {err}");
        }
        let mut longer = good.clone();
        longer.push(0);
        assert!(SafetensorsFile::from_bytes(longer).is_err());
        let mut huge = good;
        huge[..8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(SafetensorsFile::from_bytes(huge).is_err());
        let ints = [7i32, 8]
            .iter()
            .flat_map(|i| i.to_le_bytes())
            .collect::<Vec<_>>();
        let view = TensorView::new(Dtype::I32, vec![2], &ints).unwrap();
        let file =
            SafetensorsFile::from_bytes(safetensors::serialize([("ids", view)], None).unwrap())
                .unwrap();
        let err = file.to_f32("ids").unwrap_err().to_string();
        assert!(err.contains("ids") && err.contains("I32"), "{err}");
    }
}
