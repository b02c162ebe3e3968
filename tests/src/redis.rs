//! Real Redis for the tests: Debian's `redis-server` (installed by
//! `cargo xtask setup` when missing), one per test on a free loopback port with
//! persistence off, killed on drop; and a three-master Redis Cluster. Either
//! may run in a network namespace of its own, on an address of it (see
//! `crate::fleet`), reached over TCP from other namespaces.

use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    path::Path,
    process::{Command, Stdio},
    thread::sleep,
    time::{Duration, Instant},
};

use crate::{ChildGuard, TempDir};

/// A `redis-server` on 127.0.0.1 (or an address of a namespace), killed on
/// drop (its [`ChildGuard`]).
pub struct RedisServer {
    child: Option<ChildGuard>,
    /// Its port.
    pub port: u16,
    dir: TempDir,
    cluster: bool,
    unix: bool,
    /// The namespace it runs in (`None`: this process's) and its address there.
    netns: Option<String>,
    host: String,
    /// More `redis-server` arguments.
    extra: Vec<String>,
}

fn free_port() -> u16 {
    // Cluster nodes also listen on port + 10000: keep both in range.
    loop {
        let l = TcpListener::bind("127.0.0.1:0").expect("binding a free loopback port");
        let port = l.local_addr().expect("local addr").port();
        if port < 55_000 {
            return port;
        }
    }
}

fn redis_server() -> &'static str {
    if Path::new("/usr/bin/redis-server").exists() {
        return "/usr/bin/redis-server";
    }
    panic!(
        "redis-server is not installed: run `cargo xtask setup` (it installs Debian's redis-server)"
    )
}

/// Sends one inline command; returns the raw reply.
pub fn command(port: u16, cmd: &str) -> std::io::Result<String> {
    command_at("127.0.0.1", port, cmd)
}

/// Sends one inline command to `host:port` in the network namespace `netns`
/// (from a thread that enters it; `None`: this one's).
pub fn command_in(
    netns: Option<&str>,
    host: &str,
    port: u16,
    cmd: &str,
) -> std::io::Result<String> {
    let Some(ns) = netns else {
        return command_at(host, port, cmd);
    };
    std::thread::scope(|s| {
        s.spawn(|| {
            let f = std::fs::File::open(Path::new("/run/netns").join(ns))?;
            use std::os::fd::AsRawFd as _;
            // SAFETY: a valid namespace fd; only this thread moves.
            if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
            command_at(host, port, cmd)
        })
        .join()
        .expect("a thread in the Redis namespace")
    })
}

fn command_at(host: &str, port: u16, cmd: &str) -> std::io::Result<String> {
    let mut s = TcpStream::connect((host, port))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    s.write_all(format!("{cmd}\r\n").as_bytes())?;
    let mut buf = [0u8; 16384];
    let n = s.read(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}

impl RedisServer {
    /// Starts one on a free port and waits until it answers PING.
    pub fn start() -> Self {
        Self::start_with(false)
    }

    /// Starts one that also listens on a unix socket: reachable from every
    /// network namespace (see [`RedisServer::unix_url`]).
    pub fn start_unix() -> Self {
        let mut server = Self {
            child: None,
            port: free_port(),
            dir: TempDir::new("redis"),
            cluster: false,
            unix: true,
            netns: None,
            host: "127.0.0.1".into(),
            extra: Vec::new(),
        };
        server.spawn();
        server
    }

    fn start_with(cluster: bool) -> Self {
        Self::start_args(cluster, &[])
    }

    fn start_args(cluster: bool, extra: &[&str]) -> Self {
        let mut server = Self {
            child: None,
            port: free_port(),
            dir: TempDir::new("redis"),
            cluster,
            unix: false,
            netns: None,
            host: "127.0.0.1".into(),
            extra: extra.iter().map(|a| a.to_string()).collect(),
        };
        server.spawn();
        server
    }

    /// Starts one in the network namespace `netns` on `host:port` (an
    /// address of that namespace), a Cluster node if `cluster`.
    pub fn start_in(netns: &str, host: &str, port: u16, cluster: bool) -> Self {
        let mut server = Self {
            child: None,
            port,
            dir: TempDir::new("redis"),
            cluster,
            unix: false,
            netns: Some(netns.to_string()),
            host: host.to_string(),
            extra: Vec::new(),
        };
        server.spawn();
        server
    }

    /// Its address: `HOST:PORT`.
    pub fn addr(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    /// Whether it answers PING.
    fn answers(&self) -> bool {
        matches!(command_in(self.netns.as_deref(), &self.host, self.port, "PING"), Ok(r) if r.starts_with("+PONG"))
    }

    fn spawn(&mut self) {
        let mut cmd = match &self.netns {
            None => Command::new(redis_server()),
            Some(ns) => {
                let mut c = Command::new("nsenter");
                c.arg(format!("--net=/run/netns/{ns}")).arg(redis_server());
                c
            }
        };
        cmd.args([
            "--port",
            &self.port.to_string(),
            "--bind",
            &self.host,
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "no",
        ])
        .arg("--dir")
        .arg(&self.dir.0)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        if self.cluster {
            cmd.args([
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
            ]);
            if self.netns.is_some() {
                // A master down costs its own slots only (no replicas here).
                cmd.args(["--cluster-require-full-coverage", "no"]);
            }
        }
        cmd.args(&self.extra);
        if self.unix {
            cmd.arg("--unixsocket")
                .arg(self.dir.0.join("redis.sock"))
                .args(["--unixsocketperm", "700"]);
        }
        self.child = Some(ChildGuard::spawn(cmd, "redis-server"));
        let start = Instant::now();
        while !self.answers() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "redis-server on {} did not answer within 10 s",
                self.addr()
            );
            sleep(Duration::from_millis(20));
        }
    }

    /// `redis://HOST:PORT` (127.0.0.1 unless started in a namespace).
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr())
    }

    /// `redis+unix:///…/redis.sock` (after [`RedisServer::start_unix`]).
    pub fn unix_url(&self) -> String {
        format!("redis+unix://{}", self.dir.0.join("redis.sock").display())
    }

    /// Its process id (while it runs).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.pid() as u32)
    }

    /// Stops it (SIGKILL): clients see the connection fail.
    pub fn stop(&mut self) {
        // The guard kills it and waits.
        self.child = None;
    }

    /// Starts it again on the same port, empty (no persistence): scripts and
    /// keys are gone.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }

    /// Stops the process (SIGSTOP) without closing its connections: a stall.
    /// Commands sent meanwhile wait in its sockets and run on [`Self::resume`].
    pub fn pause(&self) {
        self.child.as_ref().expect("running").signal(libc::SIGSTOP);
    }

    /// Lets a paused process run again (SIGCONT) and waits until it answers.
    pub fn resume(&self) {
        self.child.as_ref().expect("running").signal(libc::SIGCONT);
        let start = Instant::now();
        while !self.answers() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "redis-server on {} did not answer within 10 s of SIGCONT",
                self.addr()
            );
            sleep(Duration::from_millis(20));
        }
    }

    /// Fills memory up to `maxmemory` (set 2 MB above what is used now, with
    /// `noeviction`): from now on every write is refused with OOM. Returns the
    /// refusal Redis gave.
    pub fn fill_to_maxmemory(&self) -> String {
        let info = self.cmd("INFO memory");
        let used: u64 = info
            .lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no used_memory in INFO: {info}"));
        assert!(
            self.cmd("CONFIG SET maxmemory-policy noeviction")
                .starts_with("+OK")
        );
        let max = used + (2 << 20);
        assert!(
            self.cmd(&format!("CONFIG SET maxmemory {max}"))
                .starts_with("+OK")
        );
        // 256 KiB values: at most about 8 of them fit.
        for i in 0..64 {
            let r = self.cmd(&format!("SETRANGE fill:{i} 262143 x"));
            if r.starts_with("-OOM") {
                return r;
            }
        }
        panic!("Redis took 16 MB past a maxmemory {max} bytes with noeviction")
    }

    /// Script calls it has run (`EVALSHA` and `EVAL`), from `INFO
    /// commandstats`.
    pub fn script_calls(&self) -> u64 {
        self.cmd("INFO commandstats")
            .lines()
            .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
            .filter_map(|l| {
                l.split("calls=")
                    .nth(1)?
                    .split(',')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum()
    }

    /// Runs one inline command, e.g. `SCRIPT FLUSH`.
    pub fn cmd(&self, cmd: &str) -> String {
        command_in(self.netns.as_deref(), &self.host, self.port, cmd)
            .unwrap_or_else(|e| panic!("redis {cmd}: {e}"))
    }
}

/// A Redis Cluster of three masters, no replicas.
pub struct RedisCluster {
    /// Its nodes.
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts three nodes, joins them with `redis-cli --cluster create`, waits
    /// until every node says `cluster_state:ok`.
    pub fn start() -> Self {
        Self::start_args(&[])
    }

    /// The same, each node run with `extra` arguments too (e.g.
    /// `--cluster-require-full-coverage no`: the masters that are up serve
    /// their slots while another is down).
    pub fn start_args(extra: &[&str]) -> Self {
        Self::join(
            (0..3)
                .map(|_| RedisServer::start_args(true, extra))
                .collect(),
            None,
        )
    }

    /// Starts three nodes in the network namespace `netns`, on `host` and
    /// ports 7000 to 7002, as [`RedisCluster::start`] (a master down there
    /// costs its own slots only: `cluster-require-full-coverage no`).
    pub fn start_in(netns: &str, host: &str) -> Self {
        let nodes = (0..3)
            .map(|i| RedisServer::start_in(netns, host, 7000 + i, true))
            .collect();
        Self::join(nodes, Some(netns))
    }

    fn join(nodes: Vec<RedisServer>, netns: Option<&str>) -> Self {
        let addrs: Vec<String> = nodes.iter().map(RedisServer::addr).collect();
        let mut cli = match netns {
            None => Command::new("redis-cli"),
            Some(ns) => {
                let mut c = Command::new("nsenter");
                c.arg(format!("--net=/run/netns/{ns}")).arg("redis-cli");
                c
            }
        };
        let out = cli
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("running redis-cli (Debian's redis-tools, installed with redis-server)");
        assert!(
            out.status.success(),
            "redis-cli --cluster create: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let start = Instant::now();
        while !nodes
            .iter()
            .all(|n| n.cmd("CLUSTER INFO").contains("cluster_state:ok"))
        {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "the cluster did not reach cluster_state:ok"
            );
            sleep(Duration::from_millis(100));
        }
        Self { nodes }
    }

    /// `redis+cluster://HOST:P1,HOST:P2,HOST:P3`.
    pub fn url(&self) -> String {
        let nodes: Vec<String> = self.nodes.iter().map(RedisServer::addr).collect();
        format!("redis+cluster://{}", nodes.join(","))
    }

    /// The node that serves `key`: the one that answers it without a
    /// redirection.
    pub fn owner(&self, key: &str) -> usize {
        self.nodes
            .iter()
            .position(|n| !n.cmd(&format!("EXISTS {key}")).starts_with("-MOVED"))
            .unwrap_or_else(|| panic!("no node serves {key}"))
    }

    /// Keys held by each node (`DBSIZE`).
    pub fn keys_per_node(&self) -> Vec<u64> {
        self.nodes
            .iter()
            .map(|n| {
                let r = n.cmd("DBSIZE");
                r.trim().trim_start_matches(':').parse().unwrap_or(0)
            })
            .collect()
    }
}
