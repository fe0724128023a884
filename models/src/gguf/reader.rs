//! Parsing and memory-mapping GGUF v2/v3 files.
//!
//! Layout (all little-endian): magic `GGUF`, version `u32`, tensor count `u64`, metadata count
//! `u64`; the metadata (`string` key, `u32` value type, value); the tensor table (`string` name,
//! `u32` dimension count, `u64` dimensions innermost first, `u32` GGML type, `u64` offset relative
//! to the data section); padding to the alignment; the tensor data. Strings are a `u64` byte
//! length followed by UTF-8 bytes.

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;

use memmap2::Mmap;
use specdec_kernels::quant::{dequantize_row_to_vec, QuantType};

use super::metadata::Metadata;
use super::value::{Array, Value, ValueType};
use super::{DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_ARRAY_NESTING, MAX_DIMS};
use crate::error::{ModelError, Result};

/// One entry of the tensor table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// The tensor's name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Dimensions in GGML order: `shape[0]` is the innermost (contiguous) dimension, so a
    /// weight matrix with `rows` outputs and `cols` inputs has shape `[cols, rows]`.
    pub shape: Vec<usize>,
    /// The element/block format of the data.
    pub quant_type: QuantType,
    /// Absolute byte offset of the data in the file.
    pub offset: usize,
    /// Length of the data in bytes.
    pub n_bytes: usize,
}

impl TensorInfo {
    /// The number of elements (the product of the dimensions).
    pub fn n_elements(&self) -> usize {
        self.shape.iter().product()
    }

    /// The number of rows: the product of all dimensions but the innermost (1 for a vector).
    pub fn n_rows(&self) -> usize {
        self.shape.iter().skip(1).product()
    }
}

/// A tensor's description and its raw bytes, borrowed from the file.
#[derive(Debug, Clone, Copy)]
pub struct Tensor<'a> {
    /// The tensor-table entry.
    pub info: &'a TensorInfo,
    /// The raw stored bytes (`info.n_bytes` of them): blocks of `info.quant_type`, row after
    /// row.
    pub data: &'a [u8],
}

impl Tensor<'_> {
    /// The element/block format.
    pub fn quant_type(&self) -> QuantType {
        self.info.quant_type
    }

    /// Dimensions in GGML order (innermost first).
    pub fn shape(&self) -> &[usize] {
        &self.info.shape
    }

    /// The stored bytes of row `row` (`shape[0]` elements), for `row < info.n_rows()`.
    ///
    /// # Errors
    /// [`ModelError::Gguf`] naming the tensor when `row` is out of range.
    pub fn row_bytes(&self, row: usize) -> Result<&[u8]> {
        let n_rows = self.info.n_rows();
        if row >= n_rows {
            return Err(ModelError::Gguf {
                path: String::new(),
                offset: self.info.offset as u64,
                reason: format!(
                    "tensor `{}` has {n_rows} rows, asked for row {row}",
                    self.info.name
                ),
            });
        }
        let per_row = self.data.len() / n_rows;
        Ok(&self.data[row * per_row..(row + 1) * per_row])
    }

    /// The whole tensor dequantised to `f32`, in storage order (`shape[0]` fastest).
    ///
    /// # Errors
    /// [`ModelError::Kernel`] if the kernels refuse the block layout (cannot happen for a
    /// tensor the reader accepted).
    pub fn to_f32_vec(&self) -> Result<Vec<f32>> {
        Ok(dequantize_row_to_vec(
            self.info.quant_type,
            self.data,
            self.info.n_elements(),
        )?)
    }
}

enum Backing {
    Mapped(Mmap),
    Owned(Vec<u8>),
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Mapped(m) => m,
            Backing::Owned(v) => v,
        }
    }
}

/// A parsed GGUF file: metadata and tensor table, with the tensor data memory-mapped (or held
/// in memory for [`GgufFile::from_bytes`]). Immutable and `Sync`: share it across threads.
pub struct GgufFile {
    path: String,
    backing: Backing,
    version: u32,
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    by_name: HashMap<String, usize>,
    alignment: usize,
    data_offset: usize,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata_keys", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .field("alignment", &self.alignment)
            .field("data_offset", &self.data_offset)
            .finish()
    }
}

impl GgufFile {
    /// Memory-maps and parses the GGUF file at `path`.
    ///
    /// # Errors
    /// [`ModelError::Io`] when the file cannot be opened or mapped; otherwise as
    /// [`GgufFile::from_bytes`].
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let name = path.display().to_string();
        let io = |source| ModelError::Io {
            path: name.clone(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        // SAFETY: the map is read-only and private to this value. Model files in the cache are
        // written once by fetch-models.sh (atomically renamed into place) and never modified in
        // place; truncating or rewriting a file while it is mapped is outside the contract.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        Self::parse(name, Backing::Mapped(map))
    }

    /// Parses a GGUF file held in memory (tests, synthetic models). Error messages name the
    /// file `<memory>`.
    ///
    /// # Errors
    /// [`ModelError::Gguf`] for a truncated buffer, bad magic, a version other than 2 or 3, an
    /// unknown value type, an absurd count or length, invalid UTF-8, a non-power-of-two
    /// alignment, a duplicate key or tensor name, a tensor with more than 4 or zero dimensions,
    /// an element count not a multiple of its block, data out of bounds, misaligned or
    /// overlapping, or a GGML tensor type the kernels do not support.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self> {
        Self::parse("<memory>".to_owned(), Backing::Owned(bytes))
    }

    fn parse(path: String, backing: Backing) -> Result<Self> {
        let bytes = backing.bytes();
        let mut cur = Cursor {
            bytes,
            pos: 0,
            path: &path,
        };
        let magic = cur.take(4, "the magic")?;
        if magic != GGUF_MAGIC {
            return Err(cur.error_at(0, format!("bad magic {magic:02x?}, expected \"GGUF\"")));
        }
        let version = cur.u32("the version")?;
        if !(2..=3).contains(&version) {
            return Err(cur.error_at(
                4,
                format!("unsupported GGUF version {version} (this reader reads 2 and 3)"),
            ));
        }
        let n_tensors = cur.u64("the tensor count")?;
        let n_kv = cur.u64("the metadata count")?;
        let n_kv = cur.count(n_kv, 8 + 4 + 1, "metadata entries")?;
        let mut entries = Vec::with_capacity(n_kv);
        for _ in 0..n_kv {
            let key = cur.string("a metadata key")?;
            let ty = cur.value_type(&format!("the type of metadata key `{key}`"))?;
            let value = cur.value(ty, 0)?;
            entries.push((key, value));
        }
        let metadata = Metadata::new(&path, entries)?;

        let alignment = metadata
            .get_opt::<u64>("general.alignment")?
            .unwrap_or(DEFAULT_ALIGNMENT as u64);
        if alignment == 0 || !alignment.is_power_of_two() || alignment > 1 << 20 {
            return Err(cur.error_here(format!(
                "general.alignment {alignment} is not a power of two up to 2^20"
            )));
        }
        let alignment = alignment as usize;

        let n_tensors = cur.count(n_tensors, 8 + 4 + 8 + 4 + 8, "tensor-table entries")?;
        let mut raw = Vec::with_capacity(n_tensors);
        for _ in 0..n_tensors {
            let start = cur.pos;
            let name = cur.string("a tensor name")?;
            let n_dims = cur.u32("a tensor's dimension count")?;
            if n_dims == 0 || n_dims as usize > MAX_DIMS {
                return Err(cur.error_at(
                    start,
                    format!("tensor `{name}` has {n_dims} dimensions (1 to {MAX_DIMS} allowed)"),
                ));
            }
            let mut shape = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                let d = cur.u64("a tensor dimension")?;
                shape.push(usize::try_from(d).map_err(|_| {
                    cur.error_at(start, format!("tensor `{name}` dimension {d} is absurd"))
                })?);
            }
            let type_id = cur.u32("a tensor type")?;
            let offset = cur.u64("a tensor offset")?;
            raw.push((start, name, shape, type_id, offset));
        }
        let data_offset = cur.pos.next_multiple_of(alignment);
        if !raw.is_empty() && data_offset > bytes.len() {
            return Err(cur.error_here(format!(
                "file ends at byte {} inside the padding before the tensor data",
                bytes.len()
            )));
        }

        let mut tensors = Vec::with_capacity(raw.len());
        let mut by_name = HashMap::with_capacity(raw.len());
        for (start, name, shape, type_id, offset) in raw {
            let fail = |reason: String| ModelError::Gguf {
                path: path.clone(),
                offset: start as u64,
                reason: format!("tensor `{name}`: {reason}"),
            };
            let quant_type = QuantType::from_ggml_id(type_id).map_err(|e| fail(e.to_string()))?;
            let n_elements = shape
                .iter()
                .try_fold(1usize, |acc, &d| acc.checked_mul(d))
                .filter(|&n| n <= isize::MAX as usize)
                .ok_or_else(|| fail(format!("shape {shape:?} has too many elements")))?;
            if shape[0] % quant_type.block_len() != 0 {
                return Err(fail(format!(
                    "innermost dimension {} is not a multiple of the {} block length {}",
                    shape[0],
                    quant_type.name(),
                    quant_type.block_len()
                )));
            }
            let n_bytes = (n_elements / quant_type.block_len())
                .checked_mul(quant_type.block_bytes())
                .ok_or_else(|| fail(format!("shape {shape:?} has too many bytes")))?;
            if offset % alignment as u64 != 0 {
                return Err(fail(format!(
                    "data offset {offset} is not a multiple of the alignment {alignment}"
                )));
            }
            let begin = (data_offset as u64).checked_add(offset);
            let end = begin.and_then(|b| b.checked_add(n_bytes as u64));
            match (begin, end) {
                (Some(begin), Some(end)) if end <= bytes.len() as u64 => {
                    let info = TensorInfo {
                        name: name.clone(),
                        shape,
                        quant_type,
                        offset: begin as usize,
                        n_bytes,
                    };
                    if by_name.insert(name.clone(), tensors.len()).is_some() {
                        return Err(fail("the name occurs twice in the tensor table".into()));
                    }
                    tensors.push(info);
                }
                _ => {
                    return Err(fail(format!(
                        "data (offset {offset} + {n_bytes} bytes after the data section at {data_offset}) \
                         runs past the end of the file ({} bytes)",
                        bytes.len()
                    )))
                }
            }
        }
        check_spans(&path, &tensors, data_offset, alignment)?;
        Ok(Self {
            path,
            backing,
            version,
            metadata,
            tensors,
            by_name,
            alignment,
            data_offset,
        })
    }
}

/// Checks that the tensors' data tile the data section as a GGUF writer lays it out: sorted by
/// offset, each span starts at or after the previous one's end (no overlap), and the padding
/// before it (from the data section's start, or from the previous span's end) is shorter than
/// `alignment`. A type or shape changed in the header changes a span's length, which shows as
/// an overlap or as a gap of the alignment or more.
fn check_spans(
    path: &str,
    tensors: &[TensorInfo],
    data_offset: usize,
    alignment: usize,
) -> Result<()> {
    let mut spans: Vec<&TensorInfo> = tensors.iter().filter(|t| t.n_bytes > 0).collect();
    spans.sort_by_key(|t| t.offset);
    let fail = |offset: usize, reason: String| ModelError::Gguf {
        path: path.to_string(),
        offset: offset as u64,
        reason,
    };
    let mut end = data_offset;
    let mut previous: Option<&TensorInfo> = None;
    for t in spans {
        if t.offset < end {
            let other = previous.map_or("the header".to_string(), |p| format!("`{}`", p.name));
            return Err(fail(
                t.offset,
                format!("the data of tensors {other} and `{}` overlap", t.name),
            ));
        }
        let gap = t.offset - end;
        if gap >= alignment {
            let after = previous.map_or("the start of the data section".to_string(), |p| {
                format!("the end of tensor `{}`", p.name)
            });
            return Err(fail(
                end,
                format!(
                    "{gap} unused bytes between {after} and tensor `{}` (padding is less than \
                     the alignment {alignment}): a tensor's type or shape does not match its data",
                    t.name
                ),
            ));
        }
        end = t.offset + t.n_bytes;
        previous = Some(t);
    }
    Ok(())
}

impl GgufFile {
    /// The file's path as given to [`GgufFile::open`] (or `<memory>`).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The metadata.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// The tensor table in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The data alignment in bytes (`general.alignment`, default 32).
    pub fn alignment(&self) -> usize {
        self.alignment
    }

    /// Absolute byte offset of the tensor data section.
    pub fn data_offset(&self) -> usize {
        self.data_offset
    }

    /// The whole file's bytes.
    pub fn bytes(&self) -> &[u8] {
        self.backing.bytes()
    }

    /// Hints that bytes `offset .. offset + len` will not be read for a while (a tensor copied
    /// into another layout), so the operating system may drop them from this process's memory;
    /// a later read maps them in again from the file. A no-op for in-memory files, off Unix, and
    /// for a range outside the file.
    pub fn release_range(&self, offset: usize, len: usize) {
        #[cfg(unix)]
        if let Backing::Mapped(map) = &self.backing {
            if offset.checked_add(len).is_some_and(|end| end <= map.len()) {
                // SAFETY: the mapping is read-only, so dropping its pages only makes the next
                // read fetch the same file bytes again; no reference sees memory change. (A
                // file modified on disk while mapped is outside what any mapping guards.)
                let released = unsafe {
                    map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, offset, len)
                };
                // A refused hint leaves the pages resident: nothing to report.
                drop(released);
            }
        }
        #[cfg(not(unix))]
        let _ = (offset, len);
    }

    /// `general.architecture` (e.g. `llama`, `qwen2`).
    ///
    /// # Errors
    /// As [`Metadata::get_str`].
    pub fn architecture(&self) -> Result<&str> {
        self.metadata.get_str("general.architecture")
    }

    /// The tensor-table entry named `name`.
    ///
    /// # Errors
    /// [`ModelError::MissingTensor`] naming the tensor when it is absent.
    pub fn tensor_info(&self, name: &str) -> Result<&TensorInfo> {
        self.by_name
            .get(name)
            .map(|&i| &self.tensors[i])
            .ok_or_else(|| ModelError::MissingTensor {
                path: self.path.clone(),
                name: name.to_owned(),
            })
    }

    /// Whether a tensor named `name` exists.
    pub fn has_tensor(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// The tensor named `name`: its type, shape and raw bytes (bounds were checked at parse
    /// time).
    ///
    /// # Errors
    /// [`ModelError::MissingTensor`] naming the tensor when it is absent.
    pub fn tensor(&self, name: &str) -> Result<Tensor<'_>> {
        let info = self.tensor_info(name)?;
        Ok(Tensor {
            info,
            data: &self.bytes()[info.offset..info.offset + info.n_bytes],
        })
    }
}

/// A bounds-checked little-endian reader over the file's bytes.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
    path: &'a str,
}

impl<'a> Cursor<'a> {
    fn error_at(&self, offset: usize, reason: String) -> ModelError {
        ModelError::Gguf {
            path: self.path.to_owned(),
            offset: offset as u64,
            reason,
        }
    }

    fn error_here(&self, reason: String) -> ModelError {
        self.error_at(self.pos, reason)
    }

    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(self.error_here(format!(
                "truncated: {what} needs {n} bytes but the file ends after {}",
                self.remaining()
            )));
        }
        let out = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let mut out = [0; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// Checks a stored element count against the bytes left (each element needs at least
    /// `min_len` bytes), so absurd counts fail before anything is allocated.
    fn count(&self, n: u64, min_len: usize, what: &str) -> Result<usize> {
        match n.checked_mul(min_len as u64) {
            Some(need) if need <= self.remaining() as u64 => Ok(n as usize),
            _ => Err(self.error_here(format!(
                "{n} {what} cannot fit in the {} bytes left",
                self.remaining()
            ))),
        }
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let start = self.pos;
        let len = self.u64(&format!("the length of {what}"))?;
        let len = self.count(len, 1, &format!("bytes of {what}"))?;
        let raw = self.take(len, what)?;
        String::from_utf8(raw.to_vec())
            .map_err(|e| self.error_at(start, format!("{what} is not valid UTF-8: {e}")))
    }

    fn value_type(&mut self, what: &str) -> Result<ValueType> {
        let start = self.pos;
        let tag = self.u32(what)?;
        ValueType::from_tag(tag)
            .ok_or_else(|| self.error_at(start, format!("unknown value type {tag} for {what}")))
    }

    fn value(&mut self, ty: ValueType, depth: usize) -> Result<Value> {
        const V: &str = "a metadata value";
        Ok(match ty {
            ValueType::U8 => Value::U8(self.array::<1>(V)?[0]),
            ValueType::I8 => Value::I8(i8::from_le_bytes(self.array(V)?)),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(V)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(V)?)),
            ValueType::U32 => Value::U32(u32::from_le_bytes(self.array(V)?)),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array(V)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(V)?)),
            ValueType::Bool => Value::Bool(self.bool()?),
            ValueType::String => Value::String(self.string("a metadata string")?),
            ValueType::Array => Value::Array(self.array_value(depth)?),
            ValueType::U64 => Value::U64(u64::from_le_bytes(self.array(V)?)),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array(V)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(V)?)),
        })
    }

    fn bool(&mut self) -> Result<bool> {
        let start = self.pos;
        match self.array::<1>("a bool")?[0] {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(self.error_at(start, format!("bool byte is {b}, expected 0 or 1"))),
        }
    }

    fn array_value(&mut self, depth: usize) -> Result<Array> {
        if depth >= MAX_ARRAY_NESTING {
            return Err(self.error_here(format!(
                "arrays nested deeper than {MAX_ARRAY_NESTING} levels"
            )));
        }
        let ty = self.value_type("an array's element type")?;
        let n = self.u64("an array length")?;
        let n = self.count(n, ty.min_encoded_len(), &format!("{ty} array elements"))?;
        fn collect<T>(n: usize, mut f: impl FnMut() -> Result<T>) -> Result<Vec<T>> {
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                v.push(f()?);
            }
            Ok(v)
        }
        const E: &str = "an array element";
        Ok(match ty {
            ValueType::U8 => Array::U8(self.take(n, E)?.to_vec()),
            ValueType::I8 => Array::I8(collect(n, || Ok(i8::from_le_bytes(self.array(E)?)))?),
            ValueType::U16 => Array::U16(collect(n, || Ok(u16::from_le_bytes(self.array(E)?)))?),
            ValueType::I16 => Array::I16(collect(n, || Ok(i16::from_le_bytes(self.array(E)?)))?),
            ValueType::U32 => Array::U32(collect(n, || Ok(u32::from_le_bytes(self.array(E)?)))?),
            ValueType::I32 => Array::I32(collect(n, || Ok(i32::from_le_bytes(self.array(E)?)))?),
            ValueType::F32 => Array::F32(collect(n, || Ok(f32::from_le_bytes(self.array(E)?)))?),
            ValueType::Bool => Array::Bool(collect(n, || self.bool())?),
            ValueType::String => Array::String(collect(n, || self.string("an array string"))?),
            ValueType::Array => Array::Array(collect(n, || self.array_value(depth + 1))?),
            ValueType::U64 => Array::U64(collect(n, || Ok(u64::from_le_bytes(self.array(E)?)))?),
            ValueType::I64 => Array::I64(collect(n, || Ok(i64::from_le_bytes(self.array(E)?)))?),
            ValueType::F64 => Array::F64(collect(n, || Ok(f64::from_le_bytes(self.array(E)?)))?),
        })
    }
}
