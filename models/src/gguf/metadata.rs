//! The key/value metadata of a GGUF file, with typed accessors whose errors name the key.

use std::collections::HashMap;

use super::value::{Array, Value};
use crate::error::{ModelError, Result};

/// A Rust type a metadata value can be read as. Integer types accept a value of any GGUF
/// integer type whose value fits; floats accept `f32` or `f64` values; the slice types borrow
/// arrays of exactly that element type.
pub trait FromValue<'a>: Sized {
    /// The type named in a [`ModelError::MetadataType`] error.
    const EXPECTED: &'static str;
    /// The value as `Self`, or `None` when its type (or range) does not fit.
    fn from_value(value: &'a Value) -> Option<Self>;
}

macro_rules! integer_from_value {
    ($($t:ty),*) => {$(
        impl FromValue<'_> for $t {
            const EXPECTED: &'static str = stringify!($t);
            fn from_value(value: &Value) -> Option<Self> {
                value.as_integer().and_then(|v| <$t>::try_from(v).ok())
            }
        }
    )*};
}
integer_from_value!(u8, u16, u32, u64, i32, i64, usize);

impl FromValue<'_> for f32 {
    const EXPECTED: &'static str = "f32";
    fn from_value(value: &Value) -> Option<Self> {
        match *value {
            Value::F32(v) => Some(v),
            Value::F64(v) => Some(v as f32),
            _ => None,
        }
    }
}

impl FromValue<'_> for f64 {
    const EXPECTED: &'static str = "f64";
    fn from_value(value: &Value) -> Option<Self> {
        match *value {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => None,
        }
    }
}

impl FromValue<'_> for bool {
    const EXPECTED: &'static str = "bool";
    fn from_value(value: &Value) -> Option<Self> {
        match *value {
            Value::Bool(v) => Some(v),
            _ => None,
        }
    }
}

impl<'a> FromValue<'a> for &'a str {
    const EXPECTED: &'static str = "string";
    fn from_value(value: &'a Value) -> Option<Self> {
        match value {
            Value::String(s) => Some(s),
            _ => None,
        }
    }
}

impl<'a> FromValue<'a> for &'a Array {
    const EXPECTED: &'static str = "array";
    fn from_value(value: &'a Value) -> Option<Self> {
        match value {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

impl<'a> FromValue<'a> for &'a [String] {
    const EXPECTED: &'static str = "array of string";
    fn from_value(value: &'a Value) -> Option<Self> {
        match value {
            Value::Array(Array::String(v)) => Some(v),
            _ => None,
        }
    }
}

impl<'a> FromValue<'a> for &'a [f32] {
    const EXPECTED: &'static str = "array of f32";
    fn from_value(value: &'a Value) -> Option<Self> {
        match value {
            Value::Array(Array::F32(v)) => Some(v),
            _ => None,
        }
    }
}

impl FromValue<'_> for Vec<i64> {
    const EXPECTED: &'static str = "array of integers (each fitting i64)";
    fn from_value(value: &Value) -> Option<Self> {
        match value {
            Value::Array(a) => a
                .to_integers()?
                .into_iter()
                .map(|v| i64::try_from(v).ok())
                .collect(),
            _ => None,
        }
    }
}

/// The metadata of one GGUF file: keys in file order, each with its value.
#[derive(Debug, Clone, Default)]
pub struct Metadata {
    path: String,
    entries: Vec<(String, Value)>,
    index: HashMap<String, usize>,
}

impl Metadata {
    /// Metadata for the file `path` (used in error messages) from `(key, value)` pairs.
    ///
    /// # Errors
    /// [`ModelError::Gguf`] when a key occurs twice.
    pub fn new(path: &str, entries: Vec<(String, Value)>) -> Result<Self> {
        let mut index = HashMap::with_capacity(entries.len());
        for (i, (key, _)) in entries.iter().enumerate() {
            if index.insert(key.clone(), i).is_some() {
                return Err(ModelError::Gguf {
                    path: path.to_owned(),
                    offset: 0,
                    reason: format!("metadata key `{key}` occurs twice"),
                });
            }
        }
        Ok(Self {
            path: path.to_owned(),
            entries,
            index,
        })
    }

    /// The `(key, value)` pairs in file order.
    pub fn entries(&self) -> &[(String, Value)] {
        &self.entries
    }

    /// The number of keys.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are no keys.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The raw value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index.get(key).map(|&i| &self.entries[i].1)
    }

    /// Whether `key` is present.
    pub fn contains(&self, key: &str) -> bool {
        self.index.contains_key(key)
    }

    /// The value of `key` as `T`, or `None` when the key is absent.
    ///
    /// # Errors
    /// [`ModelError::MetadataType`] when the key is present with a type that does not fit `T`.
    pub fn get_opt<'a, T: FromValue<'a>>(&'a self, key: &str) -> Result<Option<T>> {
        let Some(value) = self.get(key) else {
            return Ok(None);
        };
        T::from_value(value)
            .map(Some)
            .ok_or_else(|| ModelError::MetadataType {
                path: self.path.clone(),
                key: key.to_owned(),
                expected: T::EXPECTED,
                found: value.describe(),
            })
    }

    /// The value of `key` as `T`.
    ///
    /// # Errors
    /// [`ModelError::MissingMetadata`] naming the key when it is absent;
    /// [`ModelError::MetadataType`] when its type does not fit `T`.
    pub fn get_as<'a, T: FromValue<'a>>(&'a self, key: &str) -> Result<T> {
        self.get_opt(key)?
            .ok_or_else(|| ModelError::MissingMetadata {
                path: self.path.clone(),
                key: key.to_owned(),
            })
    }

    /// `key` as a `u32` (any integer type whose value fits). Errors as [`Metadata::get_as`].
    pub fn get_u32(&self, key: &str) -> Result<u32> {
        self.get_as(key)
    }

    /// `key` as a `u64` (any integer type whose value fits). Errors as [`Metadata::get_as`].
    pub fn get_u64(&self, key: &str) -> Result<u64> {
        self.get_as(key)
    }

    /// `key` as a `usize` (any integer type whose value fits). Errors as [`Metadata::get_as`].
    pub fn get_usize(&self, key: &str) -> Result<usize> {
        self.get_as(key)
    }

    /// `key` as an `f32` (an `f32` value, or an `f64` rounded). Errors as [`Metadata::get_as`].
    pub fn get_f32(&self, key: &str) -> Result<f32> {
        self.get_as(key)
    }

    /// `key` as a `bool`. Errors as [`Metadata::get_as`].
    pub fn get_bool(&self, key: &str) -> Result<bool> {
        self.get_as(key)
    }

    /// `key` as a string. Errors as [`Metadata::get_as`].
    pub fn get_str(&self, key: &str) -> Result<&str> {
        self.get_as(key)
    }

    /// `key` as an array of strings. Errors as [`Metadata::get_as`].
    pub fn get_str_array(&self, key: &str) -> Result<&[String]> {
        self.get_as(key)
    }

    /// `key` as an array of `f32`. Errors as [`Metadata::get_as`].
    pub fn get_f32_array(&self, key: &str) -> Result<&[f32]> {
        self.get_as(key)
    }

    /// `key` as an array of integers of any type, widened to `i64`. Errors as
    /// [`Metadata::get_as`].
    pub fn get_int_array(&self, key: &str) -> Result<Vec<i64>> {
        self.get_as(key)
    }

    /// `key` as an array of any element type. Errors as [`Metadata::get_as`].
    pub fn get_array(&self, key: &str) -> Result<&Array> {
        self.get_as(key)
    }
}
