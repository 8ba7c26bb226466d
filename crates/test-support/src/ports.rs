//! Free loopback ports.

use std::net::TcpListener;
use std::sync::atomic::{AtomicU32, Ordering};

/// A free loopback port for a server the test starts later.
///
/// Taken below the kernel's ephemeral range (`ip_local_port_range`): a port the kernel handed
/// out for `bind(0)` and released can be taken by any outgoing connection (a peer stream,
/// etcdctl) as its source port before the server binds it — CI saw a member fail with
/// "Address already in use" that way. Ports below the range are never picked for outgoing
/// connections; each is checked free by binding it, and a per-process counter (seeded by the
/// pid) keeps tests running in parallel from picking the same one.
pub fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32768)
        .clamp(2048, 65535);
    let (base, span) = (1024u32, low - 1024);
    let seed = std::process::id().wrapping_mul(7919);
    for _ in 0..span {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (base + seed.wrapping_add(n) % span) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port below {low}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_below_the_ephemeral_range_and_distinct() {
        let a = free_port();
        let b = free_port();
        assert_ne!(a, b);
        assert!(a >= 1024 && b >= 1024);
        TcpListener::bind(("127.0.0.1", a)).expect("the port is free");
    }
}
