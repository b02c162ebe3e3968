//! A fleet for the tests: daemons on hosts of their own (each a veth pair,
//! the daemon on its receiving end), sharing a Redis (one server, or a
//! three-master Cluster) that runs in a namespace of its own and that each
//! host reaches over TCP through a veth of its own. So a test can cut one
//! host off from Redis (its Redis traffic dropped in its namespace, with
//! nft: the connection goes silent, as across a partition) while the others
//! keep theirs, stall Redis, and kill and restart a Cluster master.
//!
//! Addresses: the Redis namespace holds 198.19.201.1 (its loopback); host
//! `i` reaches it through 198.19.200.(4i+2)/30, the Redis side being
//! 198.19.200.(4i+1). Everything is deleted on drop: the daemons first, then
//! the hosts, then Redis and its namespace.

use std::{
    net::IpAddr,
    ops::Deref,
    process::Command,
    sync::{Mutex, MutexGuard, PoisonError},
    thread::sleep,
    time::{Duration, Instant},
};

use crate::{
    Daemon,
    fixture::Host,
    net::{NetNs, Receiver},
    redis::{RedisCluster, RedisServer},
    unique_tag,
};

/// Redis's address, in its namespace.
pub const REDIS_ADDR: &str = "198.19.201.1";
/// The single server's port.
const REDIS_PORT: u16 = 6379;
/// The test traffic's UDP port.
pub const PORT: u16 = 5999;

/// The Redis a fleet shares.
pub enum Backend {
    /// One `redis-server`.
    Single(RedisServer),
    /// Three masters, no replicas.
    Cluster(RedisCluster),
}

/// Redis in its namespace. Fields drop in order: the servers, then the
/// namespace.
pub struct RedisSide {
    /// The server(s).
    pub backend: Backend,
    /// Its namespace.
    pub ns: NetNs,
}

impl RedisSide {
    /// The URL the daemons are given.
    pub fn url(&self) -> String {
        match &self.backend {
            Backend::Single(s) => s.url(),
            Backend::Cluster(c) => c.url(),
        }
    }

    /// The Cluster.
    pub fn cluster(&mut self) -> &mut RedisCluster {
        match &mut self.backend {
            Backend::Cluster(c) => c,
            Backend::Single(_) => panic!("this fleet's Redis is one server"),
        }
    }

    /// The single server.
    pub fn server(&self) -> &RedisServer {
        match &self.backend {
            Backend::Single(s) => s,
            Backend::Cluster(_) => panic!("this fleet's Redis is a Cluster"),
        }
    }
}

/// One daemon of the fleet on a host of its own. The daemon comes first, so
/// that it is killed before its host's namespaces go. Stopped and started
/// through `&self`, so that a test restarts it while traffic flows to every
/// host.
pub struct Member {
    /// Its daemon (`None` while the test has it stopped).
    daemon: Mutex<Option<Daemon>>,
    /// Its host.
    pub host: Host,
    /// Its end of its link to Redis (in the host's receiving namespace).
    pub link: String,
    /// The arguments its daemon was started with.
    args: Vec<String>,
}

/// A member's running daemon.
pub struct Running<'a>(MutexGuard<'a, Option<Daemon>>);

impl Deref for Running<'_> {
    type Target = Daemon;
    fn deref(&self) -> &Daemon {
        self.0.as_ref().expect("the member's daemon is running")
    }
}

impl Member {
    fn slot(&self) -> MutexGuard<'_, Option<Daemon>> {
        self.daemon.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Its daemon.
    pub fn d(&self) -> Running<'_> {
        Running(self.slot())
    }

    /// Stops its daemon with `sig`.
    pub fn stop(&self, sig: i32) {
        let d = self.slot().take();
        if let Some(d) = d {
            d.stop(sig);
        }
    }

    /// Starts its daemon again, with `extra` arguments besides its own.
    pub fn start(&self, extra: &[&str]) {
        assert!(self.slot().is_none(), "stop the daemon first");
        let mut args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        args.extend_from_slice(extra);
        let d = self.host.daemon(&args);
        *self.slot() = Some(d);
    }

    /// `nft` in its receiving namespace.
    fn nft(&self, script: &str) {
        let out = self
            .host
            .pair
            .rx
            .command("nft")
            .args(["-f", "-"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut c| {
                use std::io::Write as _;
                c.stdin
                    .take()
                    .expect("stdin")
                    .write_all(script.as_bytes())?;
                c.wait_with_output()
            })
            .expect("running nft");
        assert!(
            out.status.success(),
            "nft -f - <<{script}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Cuts the host off from Redis: everything to and from Redis's address
    /// dropped in its namespace (its connections go silent, new ones never
    /// open), as across a partition.
    pub fn partition(&self) {
        self.nft(&format!(
            "table inet rltpart {{\n chain out {{ type filter hook output priority 0; ip daddr {REDIS_ADDR} drop; }}\n chain in {{ type filter hook input priority 0; ip saddr {REDIS_ADDR} drop; }}\n}}\n"
        ));
    }

    /// Ends the partition.
    pub fn heal(&self) {
        self.nft("delete table inet rltpart\n");
    }

    /// The daemon's `status --json`'s `fleet`.
    pub fn fleet_status(&self) -> serde_json::Value {
        self.d().json(&["status"])["fleet"].clone()
    }
}

/// A fleet: its members, then its Redis (fields drop in order).
pub struct Fleet {
    /// The members.
    pub members: Vec<Member>,
    /// Their Redis.
    pub redis: RedisSide,
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("running ip");
    assert!(
        out.status.success(),
        "`ip {}` failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Fleet {
    /// `n` members with `args` (besides `--fleet URL`), each with the rule
    /// `rule` (`ratelimit set` arguments) once started, sharing one server
    /// (`cluster`: a three-master Cluster).
    pub fn start(n: usize, cluster: bool, args: &[&str], rule: &[&str]) -> Self {
        let ns = NetNs::new(&unique_tag(), "redis");
        ip(&[
            "-n",
            &ns.name,
            "addr",
            "add",
            &format!("{REDIS_ADDR}/32"),
            "dev",
            "lo",
        ]);
        let backend = if cluster {
            Backend::Cluster(RedisCluster::start_in(&ns.name, REDIS_ADDR))
        } else {
            Backend::Single(RedisServer::start_in(
                &ns.name, REDIS_ADDR, REDIS_PORT, false,
            ))
        };
        let redis = RedisSide { backend, ns };
        let url = redis.url();
        let members = (0..n)
            .map(|i| {
                let host = Host::bare(&format!("fleet{i}"));
                let link = link(&redis.ns, &host, i);
                let mut all = vec!["--fleet".to_string(), url.clone()];
                all.extend(args.iter().map(|a| a.to_string()));
                let m = Member {
                    daemon: Mutex::new(None),
                    host,
                    link,
                    args: all,
                };
                m.start(&[]);
                let mut set = vec!["set"];
                set.extend_from_slice(rule);
                m.d().cli_ok(&set);
                m
            })
            .collect();
        Self { members, redis }
    }

    /// Waits until every member counts `n` daemons and reaches Redis.
    pub fn wait_in_step(&self, n: u64, within: Duration) {
        let start = Instant::now();
        loop {
            let seen: Vec<serde_json::Value> =
                self.members.iter().map(Member::fleet_status).collect();
            if seen
                .iter()
                .all(|f| f["daemons"] == n && f["redis_up"] == true)
            {
                return;
            }
            assert!(
                start.elapsed() < within,
                "the fleet was not in step with {n} daemons within {within:?}: {seen:?}"
            );
            sleep(Duration::from_millis(100));
        }
    }

    /// Sends `pps` from `src` to each host in `to` for `dur`; frames
    /// received per host, in the order of `to`.
    pub fn flood(&self, src: IpAddr, pps: u32, to: &[usize], dur: Duration) -> Vec<u64> {
        let receivers: Vec<Receiver> = to
            .iter()
            .map(|i| self.members[*i].host.pair.receiver(PORT))
            .collect();
        let senders: Vec<_> = to
            .iter()
            .map(|i| {
                let pair = &self.members[*i].host.pair;
                pair.send_async(&[pair.flow(src, PORT, pps)], dur)
            })
            .collect();
        for s in senders {
            s.join().expect("sender");
        }
        receivers
            .into_iter()
            .map(|r| r.finish().get(&src).copied().unwrap_or(0))
            .collect()
    }

    /// Sends `pps` from each of `sources` to each host in `to` for `dur`;
    /// for each source, all hosts together: (frames sent, frames received);
    /// and how long the senders took (longer than `dur` when they could not
    /// keep pace: they send their backlog).
    pub fn flood_many(
        &self,
        sources: &[IpAddr],
        pps: u32,
        to: &[usize],
        dur: Duration,
    ) -> (Vec<(u64, u64)>, Duration) {
        let receivers: Vec<Receiver> = to
            .iter()
            .map(|i| self.members[*i].host.pair.receiver(PORT))
            .collect();
        let flows: Vec<Vec<_>> = to
            .iter()
            .map(|i| {
                let pair = &self.members[*i].host.pair;
                sources.iter().map(|s| pair.flow(*s, PORT, pps)).collect()
            })
            .collect();
        let start = Instant::now();
        let senders: Vec<_> = to
            .iter()
            .zip(&flows)
            .map(|(i, flows)| self.members[*i].host.pair.send_async(flows, dur))
            .collect();
        let mut out = vec![(0, 0); sources.len()];
        for s in senders {
            for (o, sent) in out.iter_mut().zip(s.join().expect("sender")) {
                o.0 += sent.frames;
            }
        }
        let took = start.elapsed();
        for r in receivers {
            let got = r.finish();
            for (o, src) in out.iter_mut().zip(sources) {
                o.1 += got.get(src).copied().unwrap_or(0);
            }
        }
        (out, took)
    }
}

/// A veth from the host's receiving namespace to Redis's; the host's end.
fn link(redis: &NetNs, host: &Host, i: usize) -> String {
    let tag = unique_tag();
    let (here, there) = (format!("rlf{tag}h"), format!("rlf{tag}r"));
    let rx = &host.pair.rx.name;
    ip(&[
        "link",
        "add",
        &here,
        "netns",
        rx,
        "type",
        "veth",
        "peer",
        "name",
        &there,
        "netns",
        &redis.name,
    ]);
    let base = 4 * i as u32;
    let mine = format!("198.19.200.{}/30", base + 2);
    let theirs = format!("198.19.200.{}", base + 1);
    ip(&["-n", rx, "addr", "add", &mine, "dev", &here]);
    ip(&[
        "-n",
        &redis.name,
        "addr",
        "add",
        &format!("{theirs}/30"),
        "dev",
        &there,
    ]);
    ip(&["-n", rx, "link", "set", &here, "up"]);
    ip(&["-n", &redis.name, "link", "set", &there, "up"]);
    ip(&[
        "-n",
        rx,
        "route",
        "add",
        &format!("{REDIS_ADDR}/32"),
        "via",
        &theirs,
    ]);
    here
}
