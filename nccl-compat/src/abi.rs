//! NCCL's ABI: result codes, data types and reduction ops as numbered in nccl.h (2.x), the
//! 128-byte unique id, and the fields of `ncclConfig_t` we read.

use railcc_core::{DataType, ErrorKind, ReduceOp};
use std::os::raw::{c_char, c_int};

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

/// ncclConfig_t as NCCL 2.28 lays it out (`ncclConfig_v22800`). Older layouts are prefixes of
/// it: a field is read only where the caller's `size` covers it ([`read_config`]).
#[repr(C)]
pub struct ConfigHead {
    pub size: usize,
    pub magic: u32,
    pub version: u32,
    pub blocking: c_int,
    pub cga_cluster_size: c_int,
    pub min_ctas: c_int,
    pub max_ctas: c_int,
    pub net_name: *const c_char,
    pub split_share: c_int,
    pub traffic_class: c_int,
    pub comm_name: *const c_char,
    pub collnet_enable: c_int,
    pub cta_policy: c_int,
    pub shrink_share: c_int,
    pub nvls_ctas: c_int,
    pub n_channels_per_net_peer: c_int,
    pub nvlink_centric_sched: c_int,
}

/// What railcc applies of a communicator's ncclConfig_t (unset fields: None).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommConfig {
    /// `blocking` (NCCL's default 1).
    pub nonblocking: bool,
    /// `minCTAs`, `maxCTAs`: the thread blocks per GPU of this communicator's kernels.
    pub min_ctas: Option<usize>,
    pub max_ctas: Option<usize>,
    /// `netName`: "IB" (RDMA) or "Socket" (TCP).
    pub net_name: Option<String>,
    /// `trafficClass`: the RDMA traffic class.
    pub traffic_class: Option<u8>,
    /// `commName`: named in this communicator's log lines and errors.
    pub comm_name: Option<String>,
    /// `splitShare`: accepted; a split communicator has resources of its own either way.
    pub split_share: bool,
}

impl CommConfig {
    /// Applies the fields that railcc settings carry over `cfg` (the process's settings).
    pub fn apply(&self, cfg: &mut railcc_core::Config) -> Result<(), String> {
        if let Some(n) = self.max_ctas {
            cfg.gpu_max_blocks = n;
        }
        if let Some(n) = self.min_ctas {
            cfg.gpu_min_blocks = n;
        }
        if let Some(name) = &self.net_name {
            cfg.transport = railcc_core::nccl_env::transport_of_net(name)
                .ok_or_else(|| {
                    format!(
                        "config.netName \"{name}\": railcc's networks are \"IB\" and \"Socket\""
                    )
                })?
                .into();
        }
        if let Some(tc) = self.traffic_class {
            cfg.ib_tc = tc;
        }
        Ok(())
    }
}

/// Reads `p` (NULL: defaults) field by field, each only where `size` covers it; values out of
/// NCCL's ranges are errors naming the field.
///
/// # Safety
/// `p` is NULL or points to at least `(*p).size` readable bytes laid out as ncclConfig_t,
/// whose string fields are NULL or NUL-terminated.
pub unsafe fn read_config(p: *const ConfigHead) -> Result<CommConfig, String> {
    let mut c = CommConfig::default();
    if p.is_null() {
        return Ok(c);
    }
    // SAFETY: the head (size, magic) is in every layout; the caller's contract.
    let (size, magic) = unsafe { ((*p).size, (*p).magic) };
    if magic != CONFIG_MAGIC {
        return Err("config was not made with NCCL_CONFIG_INITIALIZER".into());
    }
    fn pointee_size<T>(_: *const T) -> usize {
        std::mem::size_of::<T>()
    }
    macro_rules! field {
        ($f:ident) => {{
            // SAFETY: only the field's address is computed (no reference, no read).
            let at = unsafe { std::ptr::addr_of!((*p).$f) };
            let end = std::mem::offset_of!(ConfigHead, $f) + pointee_size(at);
            // SAFETY: the caller's `size` says the field is there.
            (end <= size).then(|| unsafe { at.read() })
        }};
    }
    let int = |v: Option<c_int>| v.filter(|&x| x != CONFIG_UNDEF_INT);
    let text = |v: Option<*const c_char>| {
        v.filter(|s| !s.is_null())
            // SAFETY: a non-NULL string field is NUL-terminated (the caller's contract).
            .map(|s| {
                unsafe { std::ffi::CStr::from_ptr(s) }
                    .to_string_lossy()
                    .into_owned()
            })
    };
    c.nonblocking = int(field!(blocking)) == Some(0);
    let ctas = |v: Option<c_int>, name: &str| -> Result<Option<usize>, String> {
        match int(v) {
            None => Ok(None),
            Some(n) if n > 0 => Ok(Some(n as usize)),
            Some(n) => Err(format!("config.{name} = {n}: must be at least 1")),
        }
    };
    c.min_ctas = ctas(field!(min_ctas), "minCTAs")?;
    c.max_ctas = ctas(field!(max_ctas), "maxCTAs")?;
    if let (Some(lo), Some(hi)) = (c.min_ctas, c.max_ctas) {
        // NCCL lowers minCTAs to maxCTAs.
        c.min_ctas = Some(lo.min(hi));
    }
    c.net_name = text(field!(net_name));
    c.split_share = int(field!(split_share)).is_some_and(|v| v != 0);
    c.traffic_class = match int(field!(traffic_class)) {
        None => None,
        Some(t) => Some(
            u8::try_from(t).map_err(|_| format!("config.trafficClass = {t}: must be 0 to 255"))?,
        ),
    };
    c.comm_name = text(field!(comm_name));
    Ok(c)
}

/// NCCL_CONFIG_INITIALIZER's magic.
pub const CONFIG_MAGIC: u32 = 0xcafe_beef;
/// NCCL_CONFIG_UNDEF_INT: a field the caller left unset.
pub const CONFIG_UNDEF_INT: c_int = c_int::MIN;

#[cfg(test)]
mod tests {
    use super::*;

    fn initializer() -> ConfigHead {
        ConfigHead {
            size: std::mem::size_of::<ConfigHead>(),
            magic: CONFIG_MAGIC,
            version: 22809,
            blocking: CONFIG_UNDEF_INT,
            cga_cluster_size: CONFIG_UNDEF_INT,
            min_ctas: CONFIG_UNDEF_INT,
            max_ctas: CONFIG_UNDEF_INT,
            net_name: std::ptr::null(),
            split_share: CONFIG_UNDEF_INT,
            traffic_class: CONFIG_UNDEF_INT,
            comm_name: std::ptr::null(),
            collnet_enable: CONFIG_UNDEF_INT,
            cta_policy: CONFIG_UNDEF_INT,
            shrink_share: CONFIG_UNDEF_INT,
            nvls_ctas: CONFIG_UNDEF_INT,
            n_channels_per_net_peer: CONFIG_UNDEF_INT,
            nvlink_centric_sched: CONFIG_UNDEF_INT,
        }
    }

    #[test]
    fn config_fields_as_nccl_applies_them() {
        // SAFETY: every config below is a whole ConfigHead (or NULL).
        unsafe {
            assert_eq!(read_config(std::ptr::null()), Ok(CommConfig::default()));
            assert_eq!(read_config(&initializer()), Ok(CommConfig::default()));
            let name = c"tp-group";
            let net = c"Socket";
            let c = ConfigHead {
                blocking: 0,
                min_ctas: 16,
                max_ctas: 8,
                net_name: net.as_ptr(),
                traffic_class: 106,
                comm_name: name.as_ptr(),
                split_share: 1,
                ..initializer()
            };
            let got = read_config(&c).unwrap();
            assert!(got.nonblocking && got.split_share);
            // minCTAs above maxCTAs is lowered to it, as NCCL does.
            assert_eq!((got.min_ctas, got.max_ctas), (Some(8), Some(8)));
            assert_eq!(got.comm_name.as_deref(), Some("tp-group"));
            let mut cfg = railcc_core::Config::default();
            got.apply(&mut cfg).unwrap();
            assert_eq!(
                (
                    cfg.gpu_max_blocks,
                    cfg.gpu_min_blocks,
                    cfg.transport.as_str(),
                    cfg.ib_tc
                ),
                (8, 8, "tcp", 106)
            );
            // An older, shorter layout: the fields past its size are not read.
            let old = ConfigHead {
                size: std::mem::offset_of!(ConfigHead, net_name),
                max_ctas: 4,
                traffic_class: 7,
                ..initializer()
            };
            let got = read_config(&old).unwrap();
            assert_eq!((got.max_ctas, got.traffic_class), (Some(4), None));
            // Bad values name the field.
            let bad = |c: ConfigHead| read_config(&c).unwrap_err();
            assert!(bad(ConfigHead {
                max_ctas: 0,
                ..initializer()
            })
            .contains("maxCTAs"));
            assert!(bad(ConfigHead {
                traffic_class: 300,
                ..initializer()
            })
            .contains("trafficClass"));
            assert!(bad(ConfigHead {
                magic: 1,
                ..initializer()
            })
            .contains("NCCL_CONFIG_INITIALIZER"));
            let gloo = c"Gloo";
            let e = read_config(&ConfigHead {
                net_name: gloo.as_ptr(),
                ..initializer()
            })
            .unwrap()
            .apply(&mut cfg)
            .unwrap_err();
            assert!(e.contains("netName"), "{e}");
        }
    }

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
