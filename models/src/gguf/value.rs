//! GGUF metadata values: the thirteen value types of the format and their little-endian
//! encoding.

use std::fmt;

/// The type tag of a GGUF metadata value, as stored (a `u32`) before the value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ValueType {
    /// `u8` (tag 0).
    U8,
    /// `i8` (tag 1).
    I8,
    /// `u16` (tag 2).
    U16,
    /// `i16` (tag 3).
    I16,
    /// `u32` (tag 4).
    U32,
    /// `i32` (tag 5).
    I32,
    /// `f32` (tag 6).
    F32,
    /// `bool`, one byte 0 or 1 (tag 7).
    Bool,
    /// UTF-8 string: `u64` byte length, then the bytes (tag 8).
    String,
    /// Array: element type tag `u32`, `u64` length, then the elements (tag 9).
    Array,
    /// `u64` (tag 10).
    U64,
    /// `i64` (tag 11).
    I64,
    /// `f64` (tag 12).
    F64,
}

impl ValueType {
    /// The type of a stored tag, or `None` for a tag outside 0..=12.
    pub fn from_tag(tag: u32) -> Option<Self> {
        Some(match tag {
            0 => Self::U8,
            1 => Self::I8,
            2 => Self::U16,
            3 => Self::I16,
            4 => Self::U32,
            5 => Self::I32,
            6 => Self::F32,
            7 => Self::Bool,
            8 => Self::String,
            9 => Self::Array,
            10 => Self::U64,
            11 => Self::I64,
            12 => Self::F64,
            _ => return None,
        })
    }

    /// The stored tag.
    pub fn tag(self) -> u32 {
        match self {
            Self::U8 => 0,
            Self::I8 => 1,
            Self::U16 => 2,
            Self::I16 => 3,
            Self::U32 => 4,
            Self::I32 => 5,
            Self::F32 => 6,
            Self::Bool => 7,
            Self::String => 8,
            Self::Array => 9,
            Self::U64 => 10,
            Self::I64 => 11,
            Self::F64 => 12,
        }
    }

    /// The fewest bytes one value of this type occupies (a string's or an array's header), used
    /// to reject absurd element counts before allocating.
    pub fn min_encoded_len(self) -> usize {
        match self {
            Self::U8 | Self::I8 | Self::Bool => 1,
            Self::U16 | Self::I16 => 2,
            Self::U32 | Self::I32 | Self::F32 => 4,
            Self::U64 | Self::I64 | Self::F64 | Self::String => 8,
            Self::Array => 12,
        }
    }
}

/// Defines [`Value`] (one variant per value type, holding `T`) and [`Array`] (the same
/// variants holding `Vec<T>`), with their type tags, from one list.
macro_rules! value_types {
    ($($(#[$doc:meta])* $variant:ident($t:ty)),* $(,)?) => {
        /// One GGUF metadata value.
        #[derive(Debug, Clone, PartialEq)]
        pub enum Value {
            $($(#[$doc])* $variant($t),)*
        }

        /// A homogeneous GGUF array, stored as a typed vector (token lists of 150k strings stay
        /// compact). Nested arrays may each have their own element type.
        #[derive(Debug, Clone, PartialEq)]
        pub enum Array {
            $($(#[$doc])* $variant(Vec<$t>),)*
        }

        impl Value {
            /// The value's type tag.
            pub fn value_type(&self) -> ValueType {
                match self {
                    $(Self::$variant(_) => ValueType::$variant,)*
                }
            }
        }

        impl Array {
            /// The element type tag.
            pub fn element_type(&self) -> ValueType {
                match self {
                    $(Self::$variant(_) => ValueType::$variant,)*
                }
            }

            /// The number of elements.
            pub fn len(&self) -> usize {
                match self {
                    $(Self::$variant(v) => v.len(),)*
                }
            }
        }
    };
}

value_types! {
    /// `u8`.
    U8(u8),
    /// `i8`.
    I8(i8),
    /// `u16`.
    U16(u16),
    /// `i16`.
    I16(i16),
    /// `u32`.
    U32(u32),
    /// `i32`.
    I32(i32),
    /// `f32`.
    F32(f32),
    /// `bool`.
    Bool(bool),
    /// A UTF-8 string.
    String(String),
    /// A homogeneous array.
    Array(Array),
    /// `u64`.
    U64(u64),
    /// `i64`.
    I64(i64),
    /// `f64`.
    F64(f64),
}

impl Value {
    /// The value as an integer of any width and sign, or `None` for a non-integer.
    pub fn as_integer(&self) -> Option<i128> {
        Some(match *self {
            Self::U8(v) => v.into(),
            Self::I8(v) => v.into(),
            Self::U16(v) => v.into(),
            Self::I16(v) => v.into(),
            Self::U32(v) => v.into(),
            Self::I32(v) => v.into(),
            Self::U64(v) => v.into(),
            Self::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// Appends the value's encoding (without its type tag) to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Self::U8(v) => out.push(*v),
            Self::I8(v) => out.extend_from_slice(&v.to_le_bytes()),
            Self::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
            Self::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
            Self::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
            Self::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
            Self::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
            Self::Bool(v) => out.push(u8::from(*v)),
            Self::String(s) => encode_str(s, out),
            Self::Array(a) => a.encode(out),
            Self::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
            Self::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
            Self::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
        }
    }
}

/// Appends a GGUF string (`u64` length, bytes) to `out`.
pub fn encode_str(s: &str, out: &mut Vec<u8>) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

impl Array {
    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements as integers of any width and sign, or `None` for a non-integer array.
    pub fn to_integers(&self) -> Option<Vec<i128>> {
        fn widen<T: Copy + Into<i128>>(v: &[T]) -> Vec<i128> {
            v.iter().map(|&x| x.into()).collect()
        }
        Some(match self {
            Self::U8(v) => widen(v),
            Self::I8(v) => widen(v),
            Self::U16(v) => widen(v),
            Self::I16(v) => widen(v),
            Self::U32(v) => widen(v),
            Self::I32(v) => widen(v),
            Self::U64(v) => widen(v),
            Self::I64(v) => widen(v),
            _ => return None,
        })
    }

    /// Appends the array's encoding (element type tag, length, elements) to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.element_type().tag().to_le_bytes());
        out.extend_from_slice(&(self.len() as u64).to_le_bytes());
        fn each<T: Copy>(v: &[T], out: &mut Vec<u8>, f: impl Fn(T) -> Value) {
            for &x in v {
                f(x).encode(out);
            }
        }
        match self {
            Self::U8(v) => out.extend_from_slice(v),
            Self::I8(v) => each(v, out, Value::I8),
            Self::U16(v) => each(v, out, Value::U16),
            Self::I16(v) => each(v, out, Value::I16),
            Self::U32(v) => each(v, out, Value::U32),
            Self::I32(v) => each(v, out, Value::I32),
            Self::F32(v) => each(v, out, Value::F32),
            Self::Bool(v) => each(v, out, Value::Bool),
            Self::String(v) => v.iter().for_each(|s| encode_str(s, out)),
            Self::Array(v) => v.iter().for_each(|a| a.encode(out)),
            Self::U64(v) => each(v, out, Value::U64),
            Self::I64(v) => each(v, out, Value::I64),
            Self::F64(v) => each(v, out, Value::F64),
        }
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Self::U8 => "u8",
            Self::I8 => "i8",
            Self::U16 => "u16",
            Self::I16 => "i16",
            Self::U32 => "u32",
            Self::I32 => "i32",
            Self::F32 => "f32",
            Self::Bool => "bool",
            Self::String => "string",
            Self::Array => "array",
            Self::U64 => "u64",
            Self::I64 => "i64",
            Self::F64 => "f64",
        };
        f.write_str(name)
    }
}

impl Value {
    /// A short description for error messages: the type, and the value for scalars.
    pub fn describe(&self) -> String {
        match self {
            Self::String(s) if s.len() <= 40 => format!("string {s:?}"),
            Self::String(s) => format!("string of {} bytes", s.len()),
            Self::Array(a) => format!("array of {} {}", a.len(), a.element_type()),
            Self::F32(v) => format!("f32 {v}"),
            Self::F64(v) => format!("f64 {v}"),
            Self::Bool(v) => format!("bool {v}"),
            other => format!(
                "{} {}",
                other.value_type(),
                other.as_integer().unwrap_or_default()
            ),
        }
    }
}

macro_rules! value_from {
    ($($t:ty => $scalar:ident),* $(,)?) => {$(
        impl From<$t> for Value {
            fn from(v: $t) -> Self {
                Value::$scalar(v)
            }
        }
        impl From<Vec<$t>> for Value {
            fn from(v: Vec<$t>) -> Self {
                Value::Array(Array::$scalar(v))
            }
        }
    )*};
}
value_from!(u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32, f32 => F32,
    bool => Bool, String => String, u64 => U64, i64 => I64, f64 => F64);

impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::String(v.to_owned())
    }
}

impl From<Vec<&str>> for Value {
    fn from(v: Vec<&str>) -> Self {
        Value::Array(Array::String(v.into_iter().map(str::to_owned).collect()))
    }
}

impl From<Array> for Value {
    fn from(v: Array) -> Self {
        Value::Array(v)
    }
}
