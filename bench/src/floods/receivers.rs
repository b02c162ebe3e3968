//! What receives a flood: the floors (XDP programs that only count and drop),
//! ratelimit, nftables and iptables with the same limits, each on a fresh veth
//! pair whose receiving NAPI runs threaded on CPU 1; and how each counts what it
//! took in.

use std::{
    collections::BTreeSet,
    path::Path,
    time::{Duration, Instant},
};

use aya::{Ebpf, EbpfLoader};
use ratelimit_tests::{Daemon, TempDir, net::Pair};
use serde_json::Value;

use super::{AGGREGATE, BURST, RATE};
use crate::{in_ns, sh};

/// What receives the flood.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Receiver_ {
    Floor,
    /// The floor that reads the source address first.
    ParseFloor,
    /// The exact floor: the limiter's 20-byte key in an LRU hash, updated by
    /// compare-and-swap.
    ExactFloor,
    /// The exact floor of the state table the program keeps IPv4 sources in:
    /// a slot in one of two 64-byte lines, updated by compare-and-swap.
    TableFloor,
    Ratelimit {
        generic: bool,
        coarse: bool,
    },
    Nft,
    Iptables,
}

impl Receiver_ {
    pub(super) fn name(self) -> &'static str {
        match self {
            Receiver_::Floor => "XDP_DROP floor (counting)",
            Receiver_::ParseFloor => "floor that reads the source, then drops",
            Receiver_::ExactFloor => "exact floor (LRU lookup + compare-and-swap)",
            Receiver_::TableFloor => "exact floor of the table (line lookup + compare-and-swap)",
            Receiver_::Ratelimit {
                generic: false,
                coarse: false,
            } => "ratelimit (native)",
            Receiver_::Ratelimit {
                generic: false,
                coarse: true,
            } => "ratelimit (native, --clock coarse)",
            Receiver_::Ratelimit { generic: true, .. } => "ratelimit (generic)",
            Receiver_::Nft => "nftables",
            Receiver_::Iptables => "iptables",
        }
    }
}

/// One receiver set up on a fresh pair, ready to count. Fields drop in
/// order: the daemon is killed and the floor detached before the pair's
/// namespaces go.
pub(super) struct Setup {
    daemon: Option<Daemon>,
    floor: Option<Ebpf>,
    kind: Receiver_,
    /// The receiving NAPI thread.
    pub(super) napi: Option<u32>,
    _run: TempDir,
    pub(super) pair: Pair,
}

impl Setup {
    pub(super) fn new(kind: Receiver_) -> Self {
        let pair = Pair::new();
        let run = TempDir::new("bench-flood");
        let mut setup = Self {
            pair,
            _run: run,
            daemon: None,
            floor: None,
            kind,
            napi: None,
        };
        let (rx, rx_if) = (&setup.pair.rx, setup.pair.rx_if.clone());
        match kind {
            Receiver_::Floor
            | Receiver_::ParseFloor
            | Receiver_::ExactFloor
            | Receiver_::TableFloor => {
                let name = match kind {
                    Receiver_::Floor => "floor_count",
                    Receiver_::ParseFloor => "floor_parse",
                    Receiver_::TableFloor => "floor_table_count",
                    _ => "floor_exact_count",
                };
                let mut obj = EbpfLoader::new()
                    .load(ratelimit_tests::FLOORS_OBJECT)
                    .expect("floors");
                let prog: &mut aya::programs::Xdp = obj
                    .program_mut(name)
                    .expect("floor program")
                    .try_into()
                    .expect("xdp");
                prog.load().expect("load a floor");
                in_ns(rx, || {
                    prog.attach(&rx_if, aya::programs::XdpMode::Driver)
                        .expect("attach a floor")
                });
                setup.floor = Some(obj);
            }
            Receiver_::Ratelimit { generic, coarse } => {
                if generic {
                    // Without a native XDP program the veth takes frames by NAPI
                    // only with GRO on.
                    sh(rx, &format!("ethtool -K {rx_if} gro on >/dev/null"));
                }
                let config = setup._run.0.join("flood.toml");
                std::fs::write(&config, ratelimit_config(coarse)).expect("writing the config");
                let args = [
                    "--config",
                    config.to_str().expect("utf-8 path"),
                    "--mode",
                    if generic { "generic" } else { "native" },
                ];
                setup.daemon = Some(Daemon::start(rx, &rx_if, &setup._run.0, &args));
            }
            Receiver_::Nft => {
                sh(rx, &format!("ethtool -K {rx_if} gro on >/dev/null"));
                sh(rx, &format!("nft -f - <<'EOF'\n{}\nEOF", nft_rules()));
            }
            Receiver_::Iptables => {
                sh(rx, &format!("ethtool -K {rx_if} gro on >/dev/null"));
                for cmd in iptables_rules() {
                    sh(rx, &cmd);
                }
            }
        }
        setup.napi = threaded_napi(&setup.pair);
        setup
    }

    /// Frames the receiver took in so far.
    pub(super) fn frames(&self) -> u64 {
        match self.kind {
            Receiver_::Floor
            | Receiver_::ParseFloor
            | Receiver_::ExactFloor
            | Receiver_::TableFloor => {
                let obj = self.floor.as_ref().expect("floor");
                let m: aya::maps::PerCpuArray<&aya::maps::MapData, u64> =
                    aya::maps::PerCpuArray::try_from(obj.map("FLOOR_COUNT").expect("map"))
                        .expect("percpu");
                m.get(&0, 0).expect("read").iter().sum()
            }
            Receiver_::Ratelimit { .. } => {
                let v = self.daemon.as_ref().expect("daemon").json(&["stats"]);
                v["reasons"]
                    .as_array()
                    .expect("reasons")
                    .iter()
                    .filter_map(|r| r["packets"].as_u64())
                    .sum()
            }
            // Netfilter: frames the receiving veth took in.
            Receiver_::Nft | Receiver_::Iptables => {
                let text = sh(
                    &self.pair.rx,
                    &format!("ip -s -j link show dev {}", self.pair.rx_if),
                );
                let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
                v[0]["stats64"]["rx"]["packets"].as_u64().unwrap_or(0)
            }
        }
    }

    /// The receiving program's (run time ns, runs) so far, from the kernel's
    /// BPF statistics (netfilter: none).
    pub(super) fn prog_stats(&self) -> Option<(u64, u64)> {
        let name = match self.kind {
            Receiver_::Floor => "floor_count",
            Receiver_::ParseFloor => "floor_parse",
            Receiver_::ExactFloor => "floor_exact_count",
            Receiver_::TableFloor => "floor_table_count",
            Receiver_::Ratelimit { .. } => "ratelimit",
            Receiver_::Nft | Receiver_::Iptables => return None,
        };
        // The kernel keeps 15 bytes of a name.
        let name = &name.as_bytes()[..name.len().min(15)];
        let mut out = (0, 0);
        for info in aya::programs::loaded_programs().flatten() {
            if info.name() == name {
                out.0 += info.run_time().as_nanos() as u64;
                out.1 += info.run_count();
            }
        }
        Some(out)
    }

    /// Frames the receiver passed up the stack so far (ratelimit only).
    pub(super) fn passed(&self) -> Option<u64> {
        let d = self.daemon.as_ref()?;
        let v = d.json(&["stats"]);
        let rows = v["reasons"].as_array()?;
        Some(
            rows.iter()
                .filter(|r| {
                    matches!(
                        r["reason"].as_str(),
                        Some("passed" | "new_source" | "allowed" | "not_ip" | "would_drop")
                    )
                })
                .filter_map(|r| r["packets"].as_u64())
                .sum(),
        )
    }
}

/// The ratelimit config of every case.
fn ratelimit_config(coarse: bool) -> String {
    format!(
        r#"clock = "{}"
[default]
rate = "{RATE}/s"
burst = {BURST}
aggregate = "{AGGREGATE}/s"
"#,
        if coarse { "coarse" } else { "precise" }
    )
}

/// The same limits in nftables: a meter per source, then the aggregate.
fn nft_rules() -> String {
    format!(
        "table inet rl {{
  chain pre {{
    type filter hook prerouting priority -300; policy accept;
    meter m4 size 1048576 {{ ip saddr limit rate over {RATE}/second burst {BURST} packets }} drop
    meter m6 size 1048576 {{ ip6 saddr limit rate over {RATE}/second burst {BURST} packets }} drop
    limit rate over {AGGREGATE}/second burst {AGGREGATE} packets drop
  }}
}}"
    )
}

/// The same limits in iptables: hashlimit per source, then for all sources.
fn iptables_rules() -> Vec<String> {
    let mut out = Vec::new();
    for (ipt, mask) in [("iptables", 32), ("ip6tables", 64)] {
        out.push(format!(
            "{ipt} -t raw -A PREROUTING -m hashlimit --hashlimit-above {RATE}/sec --hashlimit-burst {BURST} \
             --hashlimit-mode srcip --hashlimit-srcmask {mask} --hashlimit-name src{mask} \
             --hashlimit-htable-size 1048576 --hashlimit-htable-max 1048576 -j DROP"
        ));
        out.push(format!(
            "{ipt} -t raw -A PREROUTING -m hashlimit --hashlimit-above {}/sec --hashlimit-burst {AGGREGATE} \
             --hashlimit-name all{mask} -j DROP",
            AGGREGATE
        ));
    }
    out
}

/// Makes the receiving veth's NAPI threaded and pins its thread to CPU 1;
/// returns the thread's pid.
fn threaded_napi(pair: &Pair) -> Option<u32> {
    let before = napi_threads();
    // `ip netns exec` mounts the namespace's own sysfs, where its devices are.
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", &pair.rx.name, "sh", "-c"])
        .arg(format!("echo 1 > /sys/class/net/{}/threaded", pair.rx_if))
        .output()
        .expect("ip netns exec");
    assert!(
        out.status.success(),
        "making the NAPI of {} threaded failed: {}",
        pair.rx_if,
        String::from_utf8_lossy(&out.stderr)
    );
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(2) {
        let after = napi_threads();
        if let Some(pid) = after.difference(&before).next() {
            let ok = std::process::Command::new("taskset")
                .args(["-pc", "1", &pid.to_string()])
                .output()
                .map(|o| o.status.success())
                .unwrap_or(false);
            assert!(ok, "pinning the NAPI thread {pid} to CPU 1 failed");
            return Some(*pid);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

fn napi_threads() -> BTreeSet<u32> {
    let mut out = BTreeSet::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
        if comm.starts_with("napi/") {
            out.insert(pid);
        }
    }
    out
}

/// A thread's time on CPU so far, ns (schedstat).
pub(super) fn cpu_ns(pid: u32) -> u64 {
    std::fs::read_to_string(Path::new("/proc").join(pid.to_string()).join("schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

pub(super) fn ensure_netfilter_tools() -> Result<(), String> {
    let have = |t: &str| {
        std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("command -v {t}"))
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    };
    if have("nft") && have("iptables") && have("ip6tables") && have("ethtool") && have("taskset") {
        return Ok(());
    }
    println!("installing nftables, iptables and ethtool from the distribution's packages");
    let ok = std::process::Command::new("sh")
        .arg("-c")
        .arg("apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nftables iptables ethtool util-linux")
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if ok {
        Ok(())
    } else {
        Err("could not install nftables, iptables and ethtool with apt-get".into())
    }
}
