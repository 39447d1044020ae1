//! Choosing the interface (and so the address) that sockets use, as `NCCL_SOCKET_IFNAME` does:
//! a comma list of name prefixes, `^` to exclude, `=` for exact names.

use crate::error::{Error, ErrorKind, Result};
use std::net::IpAddr;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Iface {
    pub name: String,
    pub ip: IpAddr,
    pub prefix_len: u8,
    pub loopback: bool,
}

/// Interfaces that are up, with their addresses (IPv4 and IPv6; link-local IPv6 skipped).
/// This machine's host name (`/proc/sys/kernel/hostname`, else `/etc/hostname`; empty when
/// neither reads).
pub fn hostname() -> String {
    let read = |p: &str| std::fs::read_to_string(p).map(|s| s.trim().to_string());
    read("/proc/sys/kernel/hostname")
        .or_else(|_| read("/etc/hostname"))
        .unwrap_or_default()
}

pub fn list() -> Result<Vec<Iface>> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head that we free with freeifaddrs below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(Error::io("getifaddrs", &std::io::Error::last_os_error()));
    }
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, valid until freeifaddrs.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        let up = ifa.ifa_flags & (libc::IFF_UP as u32) != 0;
        if !up || ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: ifa_name is a NUL-terminated C string owned by the list.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: ifa_addr is non-null and its family says which sockaddr it is.
        let (ip, mask) = unsafe { (sockaddr_ip(ifa.ifa_addr), sockaddr_ip(ifa.ifa_netmask)) };
        let Some(ip) = ip else { continue };
        if let IpAddr::V6(v6) = ip {
            if v6.segments()[0] & 0xffc0 == 0xfe80 {
                continue;
            }
        }
        let prefix_len = match mask {
            Some(IpAddr::V4(m)) => u32::from(m).count_ones() as u8,
            Some(IpAddr::V6(m)) => u128::from(m).count_ones() as u8,
            None => 0,
        };
        out.push(Iface {
            name,
            ip,
            prefix_len,
            loopback: ifa.ifa_flags & (libc::IFF_LOOPBACK as u32) != 0,
        });
    }
    // SAFETY: head came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

/// # Safety
/// `sa` must be null or point to a valid sockaddr of the family it declares.
unsafe fn sockaddr_ip(sa: *const libc::sockaddr) -> Option<IpAddr> {
    if sa.is_null() {
        return None;
    }
    match (*sa).sa_family as i32 {
        libc::AF_INET => {
            let sin = &*(sa as *const libc::sockaddr_in);
            Some(IpAddr::V4(u32::from_be(sin.sin_addr.s_addr).into()))
        }
        libc::AF_INET6 => {
            let sin6 = &*(sa as *const libc::sockaddr_in6);
            Some(IpAddr::V6(sin6.sin6_addr.s6_addr.into()))
        }
        _ => None,
    }
}

/// True when `name` passes the NCCL-style filter `spec`.
pub fn matches(spec: &str, name: &str) -> bool {
    let (exclude, list) = match spec.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, spec),
    };
    let hit = list
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .any(|p| match p.strip_prefix('=') {
            Some(exact) => name == exact,
            None => name.starts_with(p),
        });
    hit != exclude
}

fn same_subnet(a: IpAddr, b: IpAddr, prefix: u8) -> bool {
    match (a, b) {
        (IpAddr::V4(a), IpAddr::V4(b)) if prefix > 0 => {
            let m = u32::MAX
                .checked_shl(32 - prefix.min(32) as u32)
                .unwrap_or(0);
            u32::from(a) & m == u32::from(b) & m
        }
        (IpAddr::V6(a), IpAddr::V6(b)) if prefix > 0 => {
            let m = u128::MAX
                .checked_shl(128 - prefix.min(128) as u32)
                .unwrap_or(0);
            u128::from(a) & m == u128::from(b) & m
        }
        _ => false,
    }
}

/// Picks the interface for this rank. With `spec` set, the first matching interface (of the
/// root's address family when known). Otherwise: loopback when the root is on loopback, the
/// interface on the root's subnet, else the first non-loopback, non-virtual one.
pub fn choose(ifaces: &[Iface], spec: &str, toward: Option<IpAddr>) -> Result<Iface> {
    let family_ok = |i: &Iface| toward.is_none_or(|t| t.is_ipv4() == i.ip.is_ipv4());
    if !spec.trim().is_empty() {
        return ifaces
            .iter()
            .filter(|i| matches(spec, &i.name))
            .find(|i| family_ok(i))
            .cloned()
            .ok_or_else(|| {
                let names: Vec<&str> = ifaces.iter().map(|i| i.name.as_str()).collect();
                Error::new(
                    ErrorKind::InvalidArgument,
                    format!(
                        "RAILCC_SOCKET_IFNAME={spec:?} matches no usable interface (have: {})",
                        names.join(", ")
                    ),
                )
            });
    }
    if let Some(t) = toward {
        if t.is_loopback() {
            if let Some(i) = ifaces.iter().find(|i| i.loopback && family_ok(i)) {
                return Ok(i.clone());
            }
        }
        if let Some(i) = ifaces
            .iter()
            .find(|i| i.ip == t || same_subnet(i.ip, t, i.prefix_len))
        {
            return Ok(i.clone());
        }
    }
    const VIRTUAL: [&str; 4] = ["docker", "virbr", "veth", "br-"];
    ifaces
        .iter()
        .filter(|i| family_ok(i))
        .find(|i| !i.loopback && !VIRTUAL.iter().any(|v| i.name.starts_with(v)))
        .or_else(|| ifaces.iter().find(|i| i.loopback && family_ok(i)))
        .cloned()
        .ok_or_else(|| Error::new(ErrorKind::Unsupported, "no network interface is up"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ifc(name: &str, ip: &str, p: u8) -> Iface {
        let ip: IpAddr = ip.parse().unwrap();
        Iface {
            name: name.into(),
            ip,
            prefix_len: p,
            loopback: ip.is_loopback(),
        }
    }

    #[test]
    fn filter_syntax() {
        assert!(matches("eth", "eth0"));
        assert!(!matches("^eth", "eth0"));
        assert!(matches("^docker,lo", "eth1"));
        assert!(matches("=lo", "lo"));
        assert!(!matches("=eth", "eth0"));
    }

    #[test]
    fn default_follows_the_root() {
        let all = [
            ifc("lo", "127.0.0.1", 8),
            ifc("docker0", "172.17.0.1", 16),
            ifc("eth0", "10.1.2.3", 24),
            ifc("ib0", "10.9.0.5", 16),
        ];
        assert_eq!(
            choose(&all, "", Some("127.0.0.1".parse().unwrap()))
                .unwrap()
                .name,
            "lo"
        );
        assert_eq!(
            choose(&all, "", Some("10.9.7.7".parse().unwrap()))
                .unwrap()
                .name,
            "ib0"
        );
        assert_eq!(choose(&all, "", None).unwrap().name, "eth0");
        assert_eq!(choose(&all, "ib", None).unwrap().name, "ib0");
        assert!(choose(&all, "=mlx", None)
            .unwrap_err()
            .message
            .contains("matches no usable"));
    }

    #[test]
    fn real_interfaces_include_loopback() {
        let l = list().unwrap();
        assert!(l.iter().any(|i| i.loopback), "{l:?}");
    }
}
