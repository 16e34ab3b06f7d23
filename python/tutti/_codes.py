"""Codes shared with the compiled module (``tutti._native``): collectives, data types, reductions.

They mirror ``crates/tutti-py/src/comm.rs``: a collective code names the core's
``Collective``, a data type code is the index in ``DataType::ALL`` and a reduction
code the index in ``ReduceOp::ALL``.
"""

# Collectives.
ALL_REDUCE = 0
BROADCAST = 1
REDUCE = 2
ALL_GATHER = 3
REDUCE_SCATTER = 4
ALL_TO_ALL = 5
ALL_TO_ALL_V = 6
GATHER = 7
SCATTER = 8
BARRIER = 9
SEND = 10
RECV = 11

# Data types (DataType::ALL order), plus two codes of tutti._native.buffer().
F32, F64, F16, BF16, I8, U8, I32, I64, U32, U64 = range(10)
BOOL = 10  # moved and reduced as u8; SUM/PRODUCT become MAX/MIN (logical or/and)
OTHER = -1  # any other fixed-size type: moved as bytes, never reduced

DTYPE_NAMES = {
    F32: "float32",
    F64: "float64",
    F16: "float16",
    BF16: "bfloat16",
    I8: "int8",
    U8: "uint8",
    I32: "int32",
    I64: "int64",
    U32: "uint32",
    U64: "uint64",
    BOOL: "bool",
}

# Reductions (ReduceOp::ALL order).
OP_SUM, OP_PROD, OP_MAX, OP_MIN, OP_AVG = range(5)
