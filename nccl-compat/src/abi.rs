//! NCCL's ABI: result codes, data types and reduction ops as numbered in nccl.h (2.x), the
//! 128-byte unique id, and the fields of `ncclConfig_t` we read.

use railcc_core::{DataType, ErrorKind, ReduceOp};
use std::os::raw::c_int;

pub type NcclResult = c_int;
pub const SUCCESS: NcclResult = 0;
pub const UNHANDLED_CUDA_ERROR: NcclResult = 1;
pub const SYSTEM_ERROR: NcclResult = 2;
pub const INTERNAL_ERROR: NcclResult = 3;
pub const INVALID_ARGUMENT: NcclResult = 4;
pub const INVALID_USAGE: NcclResult = 5;
pub const REMOTE_ERROR: NcclResult = 6;
pub const IN_PROGRESS: NcclResult = 7;

/// The NCCL API level we implement, as `ncclGetVersion` reports it: 2.28.9, the NCCL our
/// measurements compare with. nccl-tests and PyTorch gate features on it: avg and bfloat16
/// (2.10), premultiplied sums (2.11), fp8 (2.24) and ncclAlltoAll (2.28) are implemented; what
/// 2.28 declares and railcc does not implement (symmetric windows, the device API,
/// ncclCommShrink) fails with ncclInvalidUsage and says why in ncclGetLastError.
pub const VERSION_CODE: c_int = 22809;
pub const VERSION_STRING: &str = "2.28.9";

/// ncclDataType_t: ncclInt8 0 .. ncclBfloat16 9, ncclFloat8e4m3 10, ncclFloat8e5m2 11: the
/// order of railcc's DataType.
pub fn dtype(v: c_int) -> Option<DataType> {
    usize::try_from(v)
        .ok()
        .and_then(|i| DataType::ALL.get(i).copied())
}

/// ncclRedOp_t: ncclSum 0, ncclProd 1, ncclMax 2, ncclMin 3, ncclAvg 4.
pub fn red_op(v: c_int) -> Option<ReduceOp> {
    usize::try_from(v)
        .ok()
        .and_then(|i| ReduceOp::ALL.get(i).copied())
}

/// NCCL's wording, except that details are in ncclGetLastError (railcc logs them too).
pub fn error_string(r: NcclResult) -> &'static std::ffi::CStr {
    match r {
        SUCCESS => c"no error",
        UNHANDLED_CUDA_ERROR => c"unhandled cuda error (ncclGetLastError says more)",
        SYSTEM_ERROR => c"unhandled system error (ncclGetLastError says more)",
        INTERNAL_ERROR => c"internal error (ncclGetLastError says more)",
        INVALID_ARGUMENT => c"invalid argument (ncclGetLastError says more)",
        INVALID_USAGE => c"invalid usage (ncclGetLastError says more)",
        REMOTE_ERROR => c"remote process exited or there was a network error",
        IN_PROGRESS => c"NCCL operation in progress",
        _ => c"unknown result code",
    }
}

/// The NCCL result for a railcc error.
pub fn result_of(kind: ErrorKind, message: &str) -> NcclResult {
    match kind {
        ErrorKind::InvalidArgument | ErrorKind::Mismatch => INVALID_ARGUMENT,
        ErrorKind::Unsupported if message.contains("CUDA") || message.contains("NVRTC") => {
            UNHANDLED_CUDA_ERROR
        }
        ErrorKind::Unsupported | ErrorKind::Aborted => INVALID_USAGE,
        ErrorKind::PeerClosed | ErrorKind::Protocol | ErrorKind::Unauthorized => REMOTE_ERROR,
        ErrorKind::Timeout | ErrorKind::Io => SYSTEM_ERROR,
    }
}

/// ncclUniqueId: 128 bytes, passed by value; railcc's bootstrap id (root address and secret)
/// fills it (`railcc_core::bootstrap::UniqueId::to_bytes`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UniqueId {
    pub internal: [u8; 128],
}

/// The head of ncclConfig_t (every NCCL 2.14+ layout starts so): size, magic, version, then
/// blocking, cgaClusterSize, minCTAs, maxCTAs.
#[repr(C)]
pub struct ConfigHead {
    pub size: usize,
    pub magic: u32,
    pub version: u32,
    pub blocking: c_int,
    pub cga_cluster_size: c_int,
    pub min_ctas: c_int,
    pub max_ctas: c_int,
}

/// NCCL_CONFIG_INITIALIZER's magic.
pub const CONFIG_MAGIC: u32 = 0xcafe_beef;
/// NCCL_CONFIG_UNDEF_INT: a field the caller left unset.
pub const CONFIG_UNDEF_INT: c_int = c_int::MIN;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enums_match_nccl_h() {
        assert_eq!(dtype(0), Some(DataType::I8));
        assert_eq!(dtype(6), Some(DataType::F16));
        assert_eq!(dtype(7), Some(DataType::F32));
        assert_eq!(dtype(9), Some(DataType::Bf16));
        assert_eq!(dtype(10), Some(DataType::F8E4M3));
        assert_eq!(dtype(11), Some(DataType::F8E5M2));
        assert_eq!(dtype(12), None);
        assert_eq!(dtype(-1), None);
        assert_eq!(red_op(4), Some(ReduceOp::Avg));
        assert_eq!(red_op(5), None); // ncclNumOps and up: premultiplied-sum handles
        assert_eq!(std::mem::size_of::<UniqueId>(), 128);
    }
}
