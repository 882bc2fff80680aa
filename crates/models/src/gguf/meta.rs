//! GGUF metadata values: the thirteen value types, read from the header with every length and
//! count checked against the bytes that remain.

use std::fmt;

use anyhow::{bail, Context, Result};

use super::Reader;

/// Arrays may nest (the spec allows arrays of arrays); a header nesting deeper than this is
/// treated as hostile rather than recursed into.
pub const MAX_ARRAY_DEPTH: usize = 8;

/// A metadata value type, by its GGUF id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MetaType {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    F32,
    Bool,
    String,
    Array,
    U64,
    I64,
    F64,
}

impl MetaType {
    const ALL: [MetaType; 13] = [
        MetaType::U8,
        MetaType::I8,
        MetaType::U16,
        MetaType::I16,
        MetaType::U32,
        MetaType::I32,
        MetaType::F32,
        MetaType::Bool,
        MetaType::String,
        MetaType::Array,
        MetaType::U64,
        MetaType::I64,
        MetaType::F64,
    ];

    pub fn from_id(id: u32) -> Option<MetaType> {
        MetaType::ALL.get(id as usize).copied()
    }

    pub fn id(self) -> u32 {
        MetaType::ALL.iter().position(|&t| t == self).expect("listed") as u32
    }

    /// The fewest bytes one value of this type takes (a string or array is at least its length).
    fn min_bytes(self) -> usize {
        match self {
            MetaType::U8 | MetaType::I8 | MetaType::Bool => 1,
            MetaType::U16 | MetaType::I16 => 2,
            MetaType::U32 | MetaType::I32 | MetaType::F32 => 4,
            MetaType::U64 | MetaType::I64 | MetaType::F64 | MetaType::String => 8,
            MetaType::Array => 12,
        }
    }
}

impl fmt::Display for MetaType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            MetaType::U8 => "uint8",
            MetaType::I8 => "int8",
            MetaType::U16 => "uint16",
            MetaType::I16 => "int16",
            MetaType::U32 => "uint32",
            MetaType::I32 => "int32",
            MetaType::F32 => "float32",
            MetaType::Bool => "bool",
            MetaType::String => "string",
            MetaType::Array => "array",
            MetaType::U64 => "uint64",
            MetaType::I64 => "int64",
            MetaType::F64 => "float64",
        };
        f.write_str(name)
    }
}

/// One metadata value. An array keeps its element type, so an empty array still says what it
/// would hold.
#[derive(Clone, Debug, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(MetaType, Vec<MetaValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl MetaValue {
    pub fn meta_type(&self) -> MetaType {
        match self {
            MetaValue::U8(_) => MetaType::U8,
            MetaValue::I8(_) => MetaType::I8,
            MetaValue::U16(_) => MetaType::U16,
            MetaValue::I16(_) => MetaType::I16,
            MetaValue::U32(_) => MetaType::U32,
            MetaValue::I32(_) => MetaType::I32,
            MetaValue::F32(_) => MetaType::F32,
            MetaValue::Bool(_) => MetaType::Bool,
            MetaValue::String(_) => MetaType::String,
            MetaValue::Array(..) => MetaType::Array,
            MetaValue::U64(_) => MetaType::U64,
            MetaValue::I64(_) => MetaType::I64,
            MetaValue::F64(_) => MetaType::F64,
        }
    }

    /// A short description for errors: `uint32`, `array of string`.
    pub fn type_name(&self) -> String {
        match self {
            MetaValue::Array(elem, _) => format!("array of {elem}"),
            v => v.meta_type().to_string(),
        }
    }

    /// The type name with its article, for messages: `a uint32`, `an int8`, `an array of string`.
    pub fn a_type_name(&self) -> String {
        let name = self.type_name();
        let article = if name.starts_with(['a', 'i']) { "an" } else { "a" };
        format!("{article} {name}")
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// Any integer value that is not negative. Writers differ on the width they use for counts
    /// and lengths, so every integer type is accepted.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::U8(v) => Some(v.into()),
            MetaValue::U16(v) => Some(v.into()),
            MetaValue::U32(v) => Some(v.into()),
            MetaValue::U64(v) => Some(v),
            MetaValue::I8(v) => u64::try_from(v).ok(),
            MetaValue::I16(v) => u64::try_from(v).ok(),
            MetaValue::I32(v) => u64::try_from(v).ok(),
            MetaValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// A float32 value, or a float64 one rounded to f32.
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            MetaValue::F32(v) => Some(v),
            MetaValue::F64(v) => Some(v as f32),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(_, values) => Some(values),
            _ => None,
        }
    }
}

/// `count` as a length, refused when the remaining bytes cannot hold that many items of at least
/// `min_bytes` each, so that nothing is ever allocated for a count a header merely claims.
pub(super) fn check_count(r: &Reader, count: u64, min_bytes: usize, what: &dyn Fn() -> String) -> Result<usize> {
    let room = (r.remaining() / min_bytes) as u64;
    if count > room {
        bail!(
            "{} claims {count} entries of at least {min_bytes} bytes each, but only {} bytes remain after byte {} \
             (truncated or corrupt file)",
            what(),
            r.remaining(),
            r.pos
        );
    }
    Ok(count as usize)
}

pub(super) fn read_type(r: &mut Reader) -> Result<MetaType> {
    let at = r.pos;
    let id = r.u32("a metadata value type")?;
    MetaType::from_id(id).with_context(|| format!("unknown metadata value type {id} at byte {at}"))
}

pub(super) fn read_value(r: &mut Reader, ty: MetaType, depth: usize) -> Result<MetaValue> {
    let v = match ty {
        MetaType::U8 => MetaValue::U8(r.take(1, "a uint8")?[0]),
        MetaType::I8 => MetaValue::I8(r.take(1, "an int8")?[0] as i8),
        MetaType::U16 => MetaValue::U16(u16::from_le_bytes(r.array("a uint16")?)),
        MetaType::I16 => MetaValue::I16(i16::from_le_bytes(r.array("an int16")?)),
        MetaType::U32 => MetaValue::U32(r.u32("a uint32")?),
        MetaType::I32 => MetaValue::I32(i32::from_le_bytes(r.array("an int32")?)),
        MetaType::F32 => MetaValue::F32(f32::from_le_bytes(r.array("a float32")?)),
        MetaType::U64 => MetaValue::U64(r.u64("a uint64")?),
        MetaType::I64 => MetaValue::I64(i64::from_le_bytes(r.array("an int64")?)),
        MetaType::F64 => MetaValue::F64(f64::from_le_bytes(r.array("a float64")?)),
        MetaType::Bool => {
            let at = r.pos;
            match r.take(1, "a bool")?[0] {
                0 => MetaValue::Bool(false),
                1 => MetaValue::Bool(true),
                b => bail!("bool at byte {at} is {b}, not 0 or 1"),
            }
        }
        MetaType::String => MetaValue::String(r.string("a string")?),
        MetaType::Array => {
            if depth >= MAX_ARRAY_DEPTH {
                bail!("arrays nested more than {MAX_ARRAY_DEPTH} deep at byte {}", r.pos);
            }
            let elem = read_type(r)?;
            let count = r.u64("an array length")?;
            let n = check_count(r, count, elem.min_bytes(), &|| format!("an array of {elem}"))?;
            let mut values = Vec::with_capacity(n);
            for i in 0..n {
                values.push(read_value(r, elem, depth + 1).with_context(|| format!("array element {i}"))?);
            }
            MetaValue::Array(elem, values)
        }
    };
    Ok(v)
}
