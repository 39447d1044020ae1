//! NVLink counts between GPUs from NVML (`libnvidia-ml.so.1`, loaded at run time like the
//! driver). CUDA's P2P attributes say whether peers reach each other, not over how many
//! links, and `railcc topo` prints `NV18` as `nvidia-smi topo -m` does:
//! - a link whose far end is a GPU counts for that pair (its remote PCI address names it);
//! - links to an NVSwitch (HGX boards) reach every GPU the switch reaches: a pair that NVML
//!   says is NVLink-capable gets the smaller of the two GPUs' switch-link counts.

use railcc_core::{Error, ErrorKind, Result};
use std::ffi::{c_char, c_int, c_uint, c_void, CString};

/// NVML_NVLINK_MAX_LINKS in nvml.h.
const MAX_LINKS: c_uint = 18;
/// NVML_NVLINK_DEVICE_TYPE_SWITCH.
const REMOTE_SWITCH: c_int = 2;
/// NVML_P2P_CAPS_INDEX_NVLINK, and NVML_P2P_STATUS_OK.
const P2P_NVLINK: c_int = 2;
const P2P_OK: c_int = 0;

/// nvmlPciInfo_t (nvml.h): only `busId` is read.
#[repr(C)]
struct PciInfo {
    bus_id_legacy: [c_char; 16],
    domain: c_uint,
    bus: c_uint,
    device: c_uint,
    pci_device_id: c_uint,
    pci_sub_system_id: c_uint,
    bus_id: [c_char; 32],
}

type Dev = *mut c_void;

/// (domain, bus, device, function) of `0000:18:00.0` or `00000000:18:00.0`.
pub fn parse_bus_id(s: &str) -> Option<(u32, u32, u32, u32)> {
    let mut it = s.trim().split(':');
    let (d, b, df) = (it.next()?, it.next()?, it.next()?);
    let (dev, f) = df.split_once('.')?;
    let h = |x: &str| u32::from_str_radix(x, 16).ok();
    Some((h(d)?, h(b)?, h(dev)?, h(f)?))
}

fn nvml_err(what: &str) -> Error {
    Error::new(ErrorKind::Unsupported, format!("nvml: {what}"))
}

/// For GPUs given by PCI bus id, the number of active NVLinks between each pair (`m[i][j]`).
pub fn nvlink_counts(bus_ids: &[String]) -> Result<Vec<Vec<u32>>> {
    // SAFETY: loading NVML runs its initialisers; it is NVIDIA's library, as libcuda is.
    let lib = unsafe { libloading::Library::new("libnvidia-ml.so.1") }
        .map_err(|e| nvml_err(&format!("cannot load libnvidia-ml.so.1: {e}")))?;
    // SAFETY: the symbol types match nvml.h's declarations.
    unsafe {
        let init: libloading::Symbol<unsafe extern "C" fn() -> c_int> =
            lib.get(b"nvmlInit_v2\0")
                .map_err(|e| nvml_err(&e.to_string()))?;
        let by_bus: libloading::Symbol<unsafe extern "C" fn(*const c_char, *mut Dev) -> c_int> =
            lib.get(b"nvmlDeviceGetHandleByPciBusId_v2\0")
                .map_err(|e| nvml_err(&e.to_string()))?;
        let state: libloading::Symbol<unsafe extern "C" fn(Dev, c_uint, *mut c_int) -> c_int> = lib
            .get(b"nvmlDeviceGetNvLinkState\0")
            .map_err(|e| nvml_err(&e.to_string()))?;
        let remote: libloading::Symbol<unsafe extern "C" fn(Dev, c_uint, *mut PciInfo) -> c_int> =
            lib.get(b"nvmlDeviceGetNvLinkRemotePciInfo_v2\0")
                .map_err(|e| nvml_err(&e.to_string()))?;
        let remote_type: libloading::Symbol<
            unsafe extern "C" fn(Dev, c_uint, *mut c_int) -> c_int,
        > = lib
            .get(b"nvmlDeviceGetNvLinkRemoteDeviceType\0")
            .map_err(|e| nvml_err(&e.to_string()))?;
        let p2p: libloading::Symbol<unsafe extern "C" fn(Dev, Dev, c_int, *mut c_int) -> c_int> =
            lib.get(b"nvmlDeviceGetP2PStatus\0")
                .map_err(|e| nvml_err(&e.to_string()))?;
        let shutdown: libloading::Symbol<unsafe extern "C" fn() -> c_int> = lib
            .get(b"nvmlShutdown\0")
            .map_err(|e| nvml_err(&e.to_string()))?;
        let r = init();
        if r != 0 {
            return Err(nvml_err(&format!("nvmlInit failed ({r})")));
        }
        let keys: Vec<Option<(u32, u32, u32, u32)>> =
            bus_ids.iter().map(|b| parse_bus_id(b)).collect();
        let mut m = vec![vec![0u32; bus_ids.len()]; bus_ids.len()];
        let mut devs: Vec<Dev> = vec![std::ptr::null_mut(); bus_ids.len()];
        let mut to_switch = vec![0u32; bus_ids.len()];
        for (i, b) in bus_ids.iter().enumerate() {
            let Ok(c) = CString::new(b.as_str()) else {
                continue;
            };
            let mut dev: Dev = std::ptr::null_mut();
            if by_bus(c.as_ptr(), &mut dev) != 0 {
                continue;
            }
            devs[i] = dev;
            for link in 0..MAX_LINKS {
                let mut on: c_int = 0;
                // Links past the GPU's count return an error: skip them.
                if state(dev, link, &mut on) != 0 || on == 0 {
                    continue;
                }
                let mut kind: c_int = -1;
                if remote_type(dev, link, &mut kind) == 0 && kind == REMOTE_SWITCH {
                    to_switch[i] += 1;
                    continue;
                }
                let mut info: PciInfo = std::mem::zeroed();
                if remote(dev, link, &mut info) != 0 {
                    continue;
                }
                let id = std::ffi::CStr::from_ptr(info.bus_id.as_ptr()).to_string_lossy();
                let key = parse_bus_id(&id);
                if let Some(j) = keys.iter().position(|k| k.is_some() && *k == key) {
                    m[i][j] += 1;
                }
            }
        }
        for i in 0..devs.len() {
            for j in 0..devs.len() {
                if i == j || m[i][j] > 0 || devs[i].is_null() || devs[j].is_null() {
                    continue;
                }
                let mut st: c_int = -1;
                if p2p(devs[i], devs[j], P2P_NVLINK, &mut st) == 0 && st == P2P_OK {
                    m[i][j] = to_switch[i].min(to_switch[j]);
                }
            }
        }
        shutdown();
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn bus_ids_of_both_widths_agree() {
        assert_eq!(
            super::parse_bus_id("00000000:18:00.0"),
            super::parse_bus_id("0000:18:00.0")
        );
        assert_eq!(super::parse_bus_id("0000:1a:00.1"), Some((0, 0x1a, 0, 1)));
        assert_eq!(super::parse_bus_id("nonsense"), None);
    }
}
