//! Network interfaces, and `TUTTI_SOCKET_IFNAME` in NCCL's syntax:
//! `eth` (names starting with eth), `^docker,lo` (all but those prefixes),
//! `=eth0` (exactly eth0), several entries separated by commas.

use crate::error::{Error, Result};
use std::net::{IpAddr, Ipv4Addr};

/// An interface with an IPv4 address.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Interface {
    /// Interface name.
    pub name: String,
    /// Its IPv4 address.
    pub addr: IpAddr,
    /// Link speed in Mbit/s, where the kernel knows it.
    pub speed_mbps: Option<u64>,
}

/// Every interface that is up and has an IPv4 address.
pub fn list() -> Result<Vec<Interface>> {
    let mut out = Vec::new();
    let mut ifa: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `ifa` with a list we free below.
    if unsafe { libc::getifaddrs(&mut ifa) } != 0 {
        return Err(Error::io(
            "listing network interfaces",
            std::io::Error::last_os_error(),
        ));
    }
    let mut p = ifa;
    while !p.is_null() {
        // SAFETY: p is a node of the list getifaddrs returned, not yet freed.
        let a = unsafe { &*p };
        p = a.ifa_next;
        if a.ifa_addr.is_null() || a.ifa_flags & libc::IFF_UP as u32 == 0 {
            continue;
        }
        // SAFETY: ifa_addr is non-null and points to a sockaddr.
        if unsafe { (*a.ifa_addr).sa_family } as i32 != libc::AF_INET {
            continue;
        }
        // SAFETY: the family is AF_INET, so it is a sockaddr_in.
        let sin = unsafe { &*(a.ifa_addr as *const libc::sockaddr_in) };
        let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let name = unsafe { std::ffi::CStr::from_ptr(a.ifa_name) }
            .to_string_lossy()
            .into_owned();
        let speed_mbps = std::fs::read_to_string(format!("/sys/class/net/{name}/speed"))
            .ok()
            .and_then(|s| s.trim().parse::<i64>().ok())
            .filter(|s| *s > 0)
            .map(|s| s as u64);
        out.push(Interface {
            name,
            addr: IpAddr::V4(ip),
            speed_mbps,
        });
    }
    // SAFETY: ifa came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(ifa) };
    Ok(out)
}

/// True if interface `name` matches the NCCL-style `spec`.
pub fn matches(spec: &str, name: &str) -> bool {
    let (exclude, list) = match spec.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, spec),
    };
    let hit = list
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .any(|e| match e.strip_prefix('=') {
            Some(exact) => name == exact,
            None => name.starts_with(e),
        });
    hit != exclude
}

/// The address of the first interface matching `spec` (non-loopback first).
pub fn pick(spec: &str) -> Result<Option<IpAddr>> {
    let mut v: Vec<Interface> = list()?
        .into_iter()
        .filter(|i| matches(spec, &i.name))
        .collect();
    v.sort_by_key(|i| i.addr.is_loopback());
    Ok(v.first().map(|i| i.addr))
}

#[cfg(test)]
mod tests {
    use super::matches;

    #[test]
    fn nccl_syntax() {
        assert!(matches("eth", "eth0"));
        assert!(!matches("eth", "lo"));
        assert!(matches("^lo,docker", "eth0"));
        assert!(!matches("^lo,docker", "docker0"));
        assert!(matches("=eth0", "eth0"));
        assert!(!matches("=eth0", "eth01"));
        assert!(matches("veth,lo", "lo"));
    }
}
