//! Element types, reduction operators and the reduction kernels.
//!
//! Kernels work on raw byte pointers because their operands often live in a
//! shared-memory ring or a peer's buffer, not in a typed Rust slice. Every
//! kernel reads and writes unaligned, so the untyped API may pass any bytes.
//! On x86-64 the kernels are compiled twice, for the baseline and for AVX2 +
//! F16C, and the faster one is chosen at run time.

pub mod copy;
mod kernels;
pub mod wire;

pub use kernels::{kernel, reduce, scale_avg, Kernel};

use half::{bf16, f16};
use std::fmt;
use std::str::FromStr;

/// The element types tutti can move and reduce.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DataType {
    /// 32-bit float.
    F32,
    /// 64-bit float.
    F64,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    Bf16,
    /// Signed 8-bit integer.
    I8,
    /// Unsigned 8-bit integer.
    U8,
    /// Signed 32-bit integer.
    I32,
    /// Signed 64-bit integer.
    I64,
    /// Unsigned 32-bit integer.
    U32,
    /// Unsigned 64-bit integer.
    U64,
}

impl DataType {
    /// Every data type, in a fixed order.
    pub const ALL: [DataType; 10] = [
        DataType::F32,
        DataType::F64,
        DataType::F16,
        DataType::Bf16,
        DataType::I8,
        DataType::U8,
        DataType::I32,
        DataType::I64,
        DataType::U32,
        DataType::U64,
    ];

    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            DataType::I8 | DataType::U8 => 1,
            DataType::F16 | DataType::Bf16 => 2,
            DataType::F32 | DataType::I32 | DataType::U32 => 4,
            DataType::F64 | DataType::I64 | DataType::U64 => 8,
        }
    }

    /// True for the floating-point types.
    pub const fn is_float(self) -> bool {
        matches!(
            self,
            DataType::F32 | DataType::F64 | DataType::F16 | DataType::Bf16
        )
    }

    /// The short name used on the command line and in tables (`f32`, `bf16`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DataType::F32 => "f32",
            DataType::F64 => "f64",
            DataType::F16 => "f16",
            DataType::Bf16 => "bf16",
            DataType::I8 => "i8",
            DataType::U8 => "u8",
            DataType::I32 => "i32",
            DataType::I64 => "i64",
            DataType::U32 => "u32",
            DataType::U64 => "u64",
        }
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DataType {
    type Err = crate::Error;
    fn from_str(s: &str) -> crate::Result<Self> {
        let l = s.to_ascii_lowercase();
        let t = match l.as_str() {
            "f32" | "float" | "float32" => DataType::F32,
            "f64" | "double" | "float64" => DataType::F64,
            "f16" | "half" | "float16" => DataType::F16,
            "bf16" | "bfloat16" => DataType::Bf16,
            "i8" | "int8" => DataType::I8,
            "u8" | "uint8" => DataType::U8,
            "i32" | "int" | "int32" => DataType::I32,
            "i64" | "int64" => DataType::I64,
            "u32" | "uint32" => DataType::U32,
            "u64" | "uint64" => DataType::U64,
            _ => {
                return Err(crate::Error::arg(format!(
                "unknown data type '{s}'; valid: f32, f64, f16, bf16, i8, u8, i32, i64, u32, u64"
            )))
            }
        };
        Ok(t)
    }
}

/// Reduction operators.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReduceOp {
    /// Sum.
    Sum,
    /// Product.
    Prod,
    /// Maximum.
    Max,
    /// Minimum.
    Min,
    /// Average: the sum divided by the number of ranks (integer division for integers).
    Avg,
}

impl ReduceOp {
    /// Every operator, in a fixed order.
    pub const ALL: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::Avg,
    ];

    /// The short name (`sum`, `prod`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::Avg => "avg",
        }
    }

    /// The operator applied on each step: `Avg` reduces with `Sum` and divides at the end.
    pub const fn step_op(self) -> ReduceOp {
        match self {
            ReduceOp::Avg => ReduceOp::Sum,
            o => o,
        }
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ReduceOp {
    type Err = crate::Error;
    fn from_str(s: &str) -> crate::Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "sum" => Ok(ReduceOp::Sum),
            "prod" | "product" => Ok(ReduceOp::Prod),
            "max" => Ok(ReduceOp::Max),
            "min" => Ok(ReduceOp::Min),
            "avg" | "mean" => Ok(ReduceOp::Avg),
            _ => Err(crate::Error::arg(format!(
                "unknown reduction '{s}'; valid: sum, prod, max, min, avg"
            ))),
        }
    }
}

/// A Rust type that tutti can send and reduce.
///
/// Implemented for `f32`, `f64`, [`half::f16`], [`half::bf16`], `i8`, `u8`,
/// `i32`, `i64`, `u32` and `u64`.
pub trait Element: bytemuck::Pod + Send + Sync + 'static {
    /// The matching [`DataType`].
    const DTYPE: DataType;
}

macro_rules! element {
    ($($t:ty => $d:ident),*) => { $(impl Element for $t { const DTYPE: DataType = DataType::$d; })* };
}
element!(f32 => F32, f64 => F64, f16 => F16, bf16 => Bf16, i8 => I8, u8 => U8,
         i32 => I32, i64 => I64, u32 => U32, u64 => U64);
