//! Small helpers the integration tests share.

use std::net::IpAddr;

/// Parses an address literal of a test.
pub fn ip(s: &str) -> IpAddr {
    s.parse().expect("address")
}

/// Asserts that `got` is within `tolerance` (relative) of `want`.
pub fn within(what: &str, got: u64, want: f64, tolerance: f64) {
    let err = (got as f64 - want).abs() / want;
    assert!(
        err <= tolerance,
        "{what}: received {got}, expected {want:.1} (off by {:.2} %, allowed {:.1} %)",
        err * 100.0,
        tolerance * 100.0
    );
}

/// A list of `n` distinct IPv6 /64s in 2001:db8::/32, one a line: a large
/// list to load with `deny --from`.
pub fn ipv6_list(n: u32) -> String {
    (0..n)
        .map(|i| format!("2001:db8:{:x}:{:x}::/64\n", i >> 16, i & 0xffff))
        .collect()
}

/// Packets under `reason` in `ratelimit stats --json` output.
pub fn counter(stats: &serde_json::Value, reason: &str) -> u64 {
    stats["reasons"]
        .as_array()
        .expect("reasons")
        .iter()
        .find(|r| r["reason"] == reason)
        .and_then(|r| r["packets"].as_u64())
        .unwrap_or_else(|| panic!("no {reason} in stats: {stats}"))
}
