//! Network namespaces joined by a veth pair, and raw-socket traffic between them.
//! Every guard deletes what it made on drop, even when a test panics; every
//! traffic loop is bounded in packets and in time.

use std::{
    cmp::Reverse,
    collections::{BinaryHeap, HashMap},
    fs::File,
    net::IpAddr,
    os::fd::AsRawFd,
    path::Path,
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use crate::unique_tag;

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("running ip");
    assert!(
        out.status.success(),
        "`ip {}` failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A network namespace, deleted on drop.
pub struct NetNs {
    /// Its name under /run/netns.
    pub name: String,
}

impl NetNs {
    /// Creates `rlt<tag><suffix>`.
    pub fn new(tag: &str, suffix: &str) -> Self {
        let name = format!("rlt{tag}{suffix}");
        ip(&["netns", "add", &name]);
        let ns = Self { name };
        ip(&["-n", &ns.name, "link", "set", "lo", "up"]);
        ns
    }

    /// A command that runs `program` inside this namespace (network only, so
    /// /sys/fs/bpf stays the host's and pins survive across processes).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net=/run/netns/{}", self.name))
            .arg(program);
        cmd
    }

    /// The body of `http://ADDR/metrics` fetched from inside this namespace
    /// (its loopback, its addresses); panics with the error if it fails.
    pub fn scrape(&self, addr: &str) -> String {
        let out = self
            .command("python3")
            .args([
                "-c",
                &format!("import urllib.request;print(urllib.request.urlopen('http://{addr}/metrics').read().decode(),end='')"),
            ])
            .output()
            .expect("scraping");
        assert!(
            out.status.success(),
            "scraping {addr}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Moves the calling thread into this namespace.
    pub fn enter(&self) {
        let f = File::open(Path::new("/run/netns").join(&self.name)).expect("opening netns");
        // SAFETY: a valid namespace fd.
        let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// Two namespaces, `tx` and `rx`, joined by a veth pair, with IPv4 and IPv6
/// addresses and static neighbour entries (no ARP or ND races).
pub struct Pair {
    /// Sending side (drop order: interfaces go with the namespaces).
    pub tx: NetNs,
    /// Receiving side, where the limiter runs.
    pub rx: NetNs,
    /// Interface in `tx`.
    pub tx_if: String,
    /// Interface in `rx`.
    pub rx_if: String,
    /// MAC of `tx_if`.
    pub tx_mac: [u8; 6],
    /// MAC of `rx_if`.
    pub rx_mac: [u8; 6],
    /// IPv4 of `rx_if` (198.18.0.2).
    pub rx_v4: IpAddr,
    /// IPv6 of `rx_if` (2001:db8::2).
    pub rx_v6: IpAddr,
}

fn mac_of(ns: &str, ifname: &str) -> [u8; 6] {
    let out = Command::new("ip")
        .args(["-n", ns, "-br", "link", "show", ifname])
        .output()
        .expect("ip link show");
    let text = String::from_utf8_lossy(&out.stdout);
    let mac = text
        .split_whitespace()
        .nth(2)
        .expect("a MAC in ip -br link");
    let mut m = [0u8; 6];
    for (i, part) in mac.split(':').enumerate() {
        m[i] = u8::from_str_radix(part, 16).expect("hex MAC");
    }
    m
}

fn fmt_mac(m: &[u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

impl Pair {
    /// Creates the pair.
    pub fn new() -> Self {
        let tag = unique_tag();
        Self::named(&format!("rl{tag}t"), &format!("rl{tag}r"))
    }

    /// Creates the pair with these interface names (one may be the other: the
    /// ends are in two namespaces).
    pub fn named(tx_if: &str, rx_if: &str) -> Self {
        let tag = unique_tag();
        let tx = NetNs::new(&tag, "t");
        let rx = NetNs::new(&tag, "r");
        let (tx_if, rx_if) = (tx_if.to_string(), rx_if.to_string());
        let (tx_mac, rx_mac) = link(&tx, &rx, &tx_if, &rx_if);
        Self {
            tx,
            rx,
            tx_if,
            rx_if,
            tx_mac,
            rx_mac,
            rx_v4: "198.18.0.2".parse().expect("addr"),
            rx_v6: "2001:db8::2".parse().expect("addr"),
        }
    }

    /// Creates the veth again, same names, addresses and neighbours (after the
    /// test deleted it).
    pub fn relink(&mut self) {
        (self.tx_mac, self.rx_mac) = link(&self.tx, &self.rx, &self.tx_if, &self.rx_if);
    }

    /// Whether an XDP program is attached to the receiving interface.
    pub fn rx_has_xdp(&self) -> bool {
        let out = Command::new("ip")
            .args(["-n", &self.rx.name, "link", "show", &self.rx_if])
            .output()
            .expect("ip link show");
        String::from_utf8_lossy(&out.stdout).contains("prog/xdp")
    }

    /// [`send`] from the sending end.
    pub fn send(&self, flows: &[Flow], duration: Duration) -> Vec<Sent> {
        send(&self.tx, &self.tx_if, flows, duration)
    }

    /// [`send_async`] from the sending end.
    pub fn send_async(&self, flows: &[Flow], duration: Duration) -> JoinHandle<Vec<Sent>> {
        send_async(&self.tx, &self.tx_if, flows, duration)
    }

    /// [`send_each`] from the sending end.
    pub fn send_each(&self, frames: &[Vec<u8>]) {
        send_each(&self.tx, &self.tx_if, frames);
    }

    /// A [`Receiver`] on the receiving end, counting UDP to `port`.
    pub fn receiver(&self, port: u16) -> Receiver {
        Receiver::start(&self.rx, &self.rx_if, port)
    }

    /// Sends frames from each source at `pps` to the receiver for `duration`;
    /// returns (frames sent, frames arrived) for each, in order.
    pub fn probe_sent(&self, sources: &[IpAddr], pps: u32, duration: Duration) -> Vec<(u64, u64)> {
        let rates: Vec<(IpAddr, u32)> = sources.iter().map(|src| (*src, pps)).collect();
        let (sent, got) = self.exchange(&rates, duration);
        sources
            .iter()
            .zip(sent)
            .map(|(src, s)| (s.frames, got.get(src).copied().unwrap_or(0)))
            .collect()
    }

    /// Sends frames from each `(source, frames per second)` to the receiver for
    /// `duration` and returns how many of each arrived.
    pub fn probe(&self, sources: &[(IpAddr, u32)], duration: Duration) -> HashMap<IpAddr, u64> {
        self.exchange(sources, duration).1
    }

    /// The probes' traffic: what was sent of each flow, and what arrived by
    /// source.
    fn exchange(
        &self,
        sources: &[(IpAddr, u32)],
        duration: Duration,
    ) -> (Vec<Sent>, HashMap<IpAddr, u64>) {
        const PORT: u16 = 5999;
        let rx = self.receiver(PORT);
        let flows: Vec<Flow> = sources
            .iter()
            .map(|(src, pps)| self.flow(*src, PORT, *pps))
            .collect();
        let sent = self.send(&flows, duration);
        (sent, rx.finish())
    }

    /// A stream of UDP frames from `src` to the receiver's `dport`, `pps`
    /// a second.
    pub fn flow(&self, src: IpAddr, dport: u16, pps: u32) -> Flow {
        Flow {
            frame: self.udp(src, dport).build(),
            pps,
        }
    }

    /// A UDP frame spec from `src` to the receiver, with the right MACs.
    pub fn udp(&self, src: IpAddr, dport: u16) -> crate::frames::Udp {
        let dst = if src.is_ipv4() {
            self.rx_v4
        } else {
            self.rx_v6
        };
        let mut u = crate::frames::Udp::new(src, dst);
        u.src_mac = self.tx_mac;
        u.dst_mac = self.rx_mac;
        u.dport = dport;
        u
    }
}

impl Drop for Pair {
    /// A daemon killed with SIGKILL leaves its pins; they would keep the maps (and
    /// their memory) alive after the interface is gone.
    fn drop(&mut self) {
        for iface in [&self.rx_if, &self.tx_if] {
            for dir in pin_dirs(iface) {
                let _ = std::fs::remove_dir_all(&dir);
                // Its namespace's, layout's and ratelimit's directories, each
                // while empty.
                let mut at = dir.parent();
                for _ in 0..3 {
                    match at {
                        Some(p) if std::fs::remove_dir(p).is_ok() => at = p.parent(),
                        _ => break,
                    }
                }
            }
        }
    }
}

/// The pin directories of `iface`, in any network namespace
/// (`/sys/fs/bpf/ratelimit/<layout>/<namespace>/<iface>`): the tests'
/// interface names are unique.
pub fn pin_dirs(iface: &str) -> Vec<std::path::PathBuf> {
    pin_dirs_of(iface, ratelimit_user::host::identity::PIN_LAYOUT)
}

/// [`pin_dirs`] under pin layout `layout` (an earlier version's).
pub fn pin_dirs_of(iface: &str, layout: &str) -> Vec<std::path::PathBuf> {
    let root = Path::new("/sys/fs/bpf/ratelimit").join(layout);
    let Ok(entries) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    entries
        .flatten()
        .map(|e| e.path().join(iface))
        .filter(|p| p.exists())
        .collect()
}

impl Default for Pair {
    fn default() -> Self {
        Self::new()
    }
}

fn ifindex(name: &str) -> u32 {
    let c = std::ffi::CString::new(name).expect("no NUL");
    // SAFETY: a valid C string.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    assert!(i != 0, "interface {name} not found in this namespace");
    i
}

/// A raw AF_PACKET socket bound to `ifname` in the calling thread's namespace.
pub fn packet_socket(ifname: &str) -> i32 {
    let proto = (libc::ETH_P_ALL as u16).to_be();
    // SAFETY: plain socket calls with valid arguments.
    unsafe {
        let fd = libc::socket(libc::AF_PACKET, libc::SOCK_RAW, i32::from(proto));
        assert!(
            fd >= 0,
            "AF_PACKET socket: {}",
            std::io::Error::last_os_error()
        );
        let mut sll: libc::sockaddr_ll = std::mem::zeroed();
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = proto;
        sll.sll_ifindex = ifindex(ifname) as i32;
        let rc = libc::bind(
            fd,
            (&sll as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as u32,
        );
        assert_eq!(rc, 0, "bind AF_PACKET: {}", std::io::Error::last_os_error());
        fd
    }
}

/// A [`packet_socket`] whose reads give up after 50 ms, so that a reader
/// looks at its stop flag often.
fn listening_socket(ifname: &str) -> i32 {
    let fd = packet_socket(ifname);
    let tv = libc::timeval {
        tv_sec: 0,
        tv_usec: 50_000,
    };
    // SAFETY: a valid option and size.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as u32,
        );
    }
    fd
}

/// One stream of identical frames at a fixed rate.
#[derive(Clone)]
pub struct Flow {
    /// The frame.
    pub frame: Vec<u8>,
    /// Frames per second.
    pub pps: u32,
}

/// What was sent for one flow.
#[derive(Clone, Debug)]
pub struct Sent {
    /// Frames sent.
    pub frames: u64,
    /// Time of the first frame.
    pub first: Instant,
    /// Time of the last frame.
    pub last: Instant,
    /// When each frame was sent (a sender held back sends its backlog at
    /// once: what a limiter admits depends on when).
    pub times: Vec<Instant>,
}

impl Sent {
    /// What an exact limiter of `rate`/s with a burst of `burst` admits of
    /// these frames, as they were sent (GCRA over [`Sent::times`]).
    pub fn admissible(&self, rate: f64, burst: f64) -> u64 {
        let t = 1.0 / rate;
        let tau = (burst - 1.0) * t;
        let Some(start) = self.times.first() else {
            return 0;
        };
        let mut tat = 0.0_f64;
        let mut admitted = 0;
        for at in &self.times {
            let now = at.duration_since(*start).as_secs_f64();
            if tat - tau <= now {
                tat = tat.max(now) + t;
                admitted += 1;
            }
        }
        admitted
    }
}

/// Sends `flows` from `ns`/`ifname`, interleaved and paced, for `duration`
/// (bounded: at most `duration` and `pps × duration` frames per flow). Returns
/// what was sent per flow.
pub fn send(ns: &NetNs, ifname: &str, flows: &[Flow], duration: Duration) -> Vec<Sent> {
    send_async(ns, ifname, flows, duration)
        .join()
        .expect("sender thread")
}

/// [`send`] in the background: join the handle for the result.
pub fn send_async(
    ns: &NetNs,
    ifname: &str,
    flows: &[Flow],
    duration: Duration,
) -> JoinHandle<Vec<Sent>> {
    let name = ns.name.clone();
    let ifname = ifname.to_string();
    let flows = flows.to_vec();
    std::thread::spawn(move || {
        NetNs { name: name.clone() }.enter_and_forget();
        let fd = packet_socket(&ifname);
        let start = Instant::now();
        // Each flow's next frame, soonest first (ties in the flows' order):
        // a heap, so that thousands of flows cost a sender no more than a few.
        let mut next: BinaryHeap<Reverse<(Duration, usize)>> = (0..flows.len())
            .map(|i| Reverse((Duration::ZERO, i)))
            .collect();
        let mut sent: Vec<Option<Sent>> = vec![None; flows.len()];
        let end = start + duration;
        loop {
            let Reverse((due, i)) = next.pop().expect("at least one flow");
            let at = start + due;
            if at >= end {
                break;
            }
            let now = Instant::now();
            if at > now {
                let wait = at - now;
                if wait > Duration::from_micros(200) {
                    std::thread::sleep(wait - Duration::from_micros(100));
                }
                while Instant::now() < at {
                    std::hint::spin_loop();
                }
            }
            let f = &flows[i].frame;
            // SAFETY: a valid buffer.
            let n = unsafe { libc::send(fd, f.as_ptr().cast(), f.len(), 0) };
            let t = Instant::now();
            if n == f.len() as isize {
                let s = sent[i].get_or_insert(Sent {
                    frames: 0,
                    first: t,
                    last: t,
                    times: Vec::new(),
                });
                s.frames += 1;
                s.last = t;
                s.times.push(t);
            }
            next.push(Reverse((
                due + Duration::from_nanos(1_000_000_000 / u64::from(flows[i].pps.max(1))),
                i,
            )));
        }
        // SAFETY: our fd.
        unsafe { libc::close(fd) };
        sent.into_iter()
            .map(|s| s.expect("every flow sent at least one frame"))
            .collect()
    })
}

/// Moves the calling thread into the namespace `name` (a test's, which its
/// guard deletes).
pub fn enter(name: &str) {
    NetNs {
        name: name.to_string(),
    }
    .enter_and_forget();
}

impl NetNs {
    /// Enters the namespace without owning it (the guard stays with the test).
    fn enter_and_forget(self) {
        self.enter();
        std::mem::forget(self);
    }
}

/// A thread in a namespace that sets up (a socket), says it is ready, then
/// works until told to stop: what [`Receiver`], [`Delivered`] and
/// [`Capture`] share. Stopped and joined on drop, so a test that panics
/// leaves no thread reading.
struct Listener<T> {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<T>>,
}

impl<T: Send + 'static> Listener<T> {
    /// Runs `setup` in `ns` on a thread of its own, then the loop it returns
    /// until [`Listener::finish`]; returns once `setup` is done, so that
    /// nothing sent after it is missed.
    fn start<L>(ns: &NetNs, what: &str, setup: impl FnOnce() -> L + Send + 'static) -> Self
    where
        L: FnOnce(&AtomicBool) -> T,
    {
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let name = ns.name.clone();
        let s = stop.clone();
        let handle = std::thread::spawn(move || {
            NetNs { name }.enter_and_forget();
            let work = setup();
            let _ = ready_tx.send(());
            work(&s)
        });
        ready_rx
            .recv_timeout(Duration::from_secs(5))
            .unwrap_or_else(|_| panic!("{what} did not start"));
        Self {
            stop,
            handle: Some(handle),
        }
    }

    /// Waits `settle` for what is in flight, stops, and returns what the
    /// loop gathered.
    fn finish(mut self, settle: Duration) -> T {
        std::thread::sleep(settle);
        self.stop.store(true, Ordering::Relaxed);
        self.handle
            .take()
            .expect("running")
            .join()
            .expect("listener thread")
    }
}

impl<T> Drop for Listener<T> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Counts UDP frames to a port by source address, on a raw socket on the
/// receiving interface: it sees what the XDP program passed, and nothing else.
pub struct Receiver(Listener<HashMap<IpAddr, Vec<Instant>>>);

/// Arrival times by source.
pub struct Arrivals(pub HashMap<IpAddr, Vec<Instant>>);

impl Arrivals {
    /// Frames from `src`.
    pub fn count(&self, src: &IpAddr) -> u64 {
        self.0.get(src).map_or(0, |v| v.len() as u64)
    }

    /// Frames from `src` that arrived in `[from, to)`.
    pub fn between(&self, src: &IpAddr, from: Instant, to: Instant) -> u64 {
        self.0.get(src).map_or(0, |v| {
            v.iter().filter(|t| **t >= from && **t < to).count() as u64
        })
    }

    /// Counts by source.
    pub fn counts(&self) -> HashMap<IpAddr, u64> {
        self.0.iter().map(|(k, v)| (*k, v.len() as u64)).collect()
    }
}

impl Receiver {
    /// Starts counting on `ns`/`ifname` for UDP destination port `port`.
    pub fn start(ns: &NetNs, ifname: &str, port: u16) -> Self {
        let ifname = ifname.to_string();
        Self(Listener::start(ns, "the receiver", move || {
            let fd = listening_socket(&ifname);
            // SAFETY: valid option and size.
            unsafe {
                let big: i32 = 16 << 20;
                libc::setsockopt(
                    fd,
                    libc::SOL_SOCKET,
                    libc::SO_RCVBUFFORCE,
                    (&big as *const i32).cast(),
                    4,
                );
            }
            move |stop: &AtomicBool| {
                let mut counts: HashMap<IpAddr, Vec<Instant>> = HashMap::new();
                let mut buf = vec![0u8; 2048];
                // SAFETY: an all-zero sockaddr_ll is a valid value.
                let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
                // Until stopped, then what is still queued (a receiver
                // starved of CPU counts late, never short).
                // (A bounded drain: a sender still at work is not waited for.)
                let mut draining: Option<Instant> = None;
                loop {
                    if draining.is_none() && stop.load(Ordering::Relaxed) {
                        draining = Some(Instant::now() + Duration::from_millis(500));
                    }
                    if draining.is_some_and(|until| Instant::now() > until) {
                        break;
                    }
                    let mut len = std::mem::size_of::<libc::sockaddr_ll>() as u32;
                    let flags = if draining.is_some() {
                        libc::MSG_DONTWAIT
                    } else {
                        0
                    };
                    // SAFETY: valid buffers.
                    let n = unsafe {
                        libc::recvfrom(
                            fd,
                            buf.as_mut_ptr().cast(),
                            buf.len(),
                            flags,
                            (&mut sll as *mut libc::sockaddr_ll).cast(),
                            &mut len,
                        )
                    };
                    if draining.is_some() && n < 0 {
                        break;
                    }
                    if n > 0 {
                        if sll.sll_pkttype == libc::PACKET_OUTGOING {
                            continue;
                        }
                        if let Some((src, dport)) =
                            crate::frames::parse_udp_source(&buf[..n as usize])
                            && dport == port
                        {
                            counts.entry(src).or_default().push(Instant::now());
                        }
                    }
                }
                // SAFETY: our fd.
                unsafe { libc::close(fd) };
                counts
            }
        }))
    }

    /// Stops after the queue drains and returns the counts.
    pub fn finish(self) -> HashMap<IpAddr, u64> {
        self.finish_timed().counts()
    }

    /// Stops after the queue drains and returns the arrival times.
    pub fn finish_timed(self) -> Arrivals {
        Arrivals(self.0.finish(Duration::from_millis(200)))
    }
}

/// Creates the veth `tx_if`/`rx_if` between `tx` and `rx` with the test
/// addresses and permanent neighbours; returns (tx MAC, rx MAC).
fn link(tx: &NetNs, rx: &NetNs, tx_if: &str, rx_if: &str) -> ([u8; 6], [u8; 6]) {
    ip(&[
        "link", "add", tx_if, "netns", &tx.name, "type", "veth", "peer", "name", rx_if, "netns",
        &rx.name,
    ]);
    for (ns, ifn, v4, v6) in [
        (tx, tx_if, "198.18.0.1/24", "2001:db8::1/64"),
        (rx, rx_if, "198.18.0.2/24", "2001:db8::2/64"),
    ] {
        ip(&["-n", &ns.name, "addr", "add", v4, "dev", ifn]);
        ip(&["-n", &ns.name, "addr", "add", v6, "dev", ifn, "nodad"]);
        ip(&["-n", &ns.name, "link", "set", ifn, "up"]);
    }
    let tx_mac = mac_of(&tx.name, tx_if);
    let rx_mac = mac_of(&rx.name, rx_if);
    for (ns, ifn, peer, mac) in [
        (tx, tx_if, ["198.18.0.2", "2001:db8::2"], rx_mac),
        (rx, rx_if, ["198.18.0.1", "2001:db8::1"], tx_mac),
    ] {
        for addr in peer {
            ip(&[
                "-n",
                &ns.name,
                "neigh",
                "replace",
                addr,
                "lladdr",
                &fmt_mac(&mac),
                "dev",
                ifn,
                "nud",
                "permanent",
            ]);
        }
    }
    (tx_mac, rx_mac)
}

impl Pair {
    /// Lets the receiver answer `sources` (spoofed by the sender): a route to
    /// the test ranges through its interface, and each source's neighbour
    /// entry at the sender's MAC, so a reply (a SYN-ACK) leaves on the veth.
    pub fn answer(&self, sources: &[IpAddr]) {
        for range in ["198.18.0.0/15", "2001:db8::/32"] {
            ip(&[
                "-n",
                &self.rx.name,
                "route",
                "replace",
                range,
                "dev",
                &self.rx_if,
            ]);
        }
        for src in sources {
            ip(&[
                "-n",
                &self.rx.name,
                "neigh",
                "replace",
                &src.to_string(),
                "lladdr",
                &fmt_mac(&self.tx_mac),
                "dev",
                &self.rx_if,
                "nud",
                "permanent",
            ]);
        }
    }
}

/// Sends each of `frames` once from `ns`/`ifname`, 200 µs apart (bounded by
/// the count).
pub fn send_each(ns: &NetNs, ifname: &str, frames: &[Vec<u8>]) {
    let name = ns.name.clone();
    let ifname = ifname.to_string();
    let frames = frames.to_vec();
    std::thread::spawn(move || {
        NetNs { name }.enter_and_forget();
        let fd = packet_socket(&ifname);
        for f in &frames {
            // SAFETY: a valid buffer.
            let n = unsafe { libc::send(fd, f.as_ptr().cast(), f.len(), 0) };
            assert_eq!(
                n,
                f.len() as isize,
                "sending a frame: {}",
                std::io::Error::last_os_error()
            );
            std::thread::sleep(Duration::from_micros(200));
        }
        // SAFETY: our fd.
        unsafe { libc::close(fd) };
    })
    .join()
    .expect("sender thread");
}

/// What the receiving host's stack delivered: UDP datagrams to a port, by
/// source, as a socket bound there gets them (after XDP, VLAN stripping,
/// reassembly and every check of the kernel's own). IPv4 sources and
/// IPv4-mapped IPv6 ones both show as IPv4, as an application sees them.
pub struct Delivered(Listener<HashMap<IpAddr, u64>>);

impl Delivered {
    /// Binds `[::]:port` (both families) in `ns` and counts.
    pub fn start(ns: &NetNs, port: u16) -> Self {
        Self(Listener::start(ns, "the UDP receiver", move || {
            let sock = std::net::UdpSocket::bind(("::", port)).expect("binding [::]:port");
            sock.set_read_timeout(Some(Duration::from_millis(50)))
                .expect("read timeout");
            move |stop: &AtomicBool| {
                let mut counts: HashMap<IpAddr, u64> = HashMap::new();
                let mut buf = [0u8; 2048];
                while !stop.load(Ordering::Relaxed) {
                    if let Ok((_, from)) = sock.recv_from(&mut buf) {
                        *counts.entry(from.ip().to_canonical()).or_default() += 1;
                    }
                }
                counts
            }
        }))
    }

    /// Stops after what is in flight arrived; the counts by source.
    pub fn finish(self) -> HashMap<IpAddr, u64> {
        self.0.finish(Duration::from_millis(300))
    }
}

/// Every frame seen on `ns`/`ifname` (both ways) while it runs: what left a
/// host, e.g. its SYN-ACKs.
pub struct Capture(Listener<Vec<Vec<u8>>>);

impl Capture {
    /// Starts capturing.
    pub fn start(ns: &NetNs, ifname: &str) -> Self {
        let ifname = ifname.to_string();
        Self(Listener::start(ns, "the capture", move || {
            let fd = listening_socket(&ifname);
            move |stop: &AtomicBool| {
                let mut frames = Vec::new();
                let mut buf = vec![0u8; 4096];
                // Bounded: at most 100 000 frames kept.
                while !stop.load(Ordering::Relaxed) && frames.len() < 100_000 {
                    // SAFETY: a valid buffer.
                    let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
                    if n > 0 {
                        frames.push(buf[..n as usize].to_vec());
                    }
                }
                // SAFETY: our fd.
                unsafe { libc::close(fd) };
                frames
            }
        }))
    }

    /// Stops after what is in flight arrived; the frames.
    pub fn finish(self) -> Vec<Vec<u8>> {
        self.0.finish(Duration::from_millis(300))
    }
}

/// The destinations of the TCP SYN-ACKs among `frames` (IPv4 or IPv6, no
/// tags, no extension headers: how a host answers).
pub fn syn_acks_to(frames: &[Vec<u8>]) -> Vec<IpAddr> {
    frames
        .iter()
        .filter_map(|f| {
            let et = u16::from_be_bytes([*f.get(12)?, *f.get(13)?]);
            let (dst, tcp) = match et {
                0x0800 if *f.get(23)? == 6 => {
                    let ihl = usize::from(f.get(14)? & 0x0f) * 4;
                    let d: [u8; 4] = f.get(30..34)?.try_into().ok()?;
                    (IpAddr::from(d), 14 + ihl)
                }
                0x86dd if *f.get(20)? == 6 => {
                    let d: [u8; 16] = f.get(38..54)?.try_into().ok()?;
                    (IpAddr::from(d), 54)
                }
                _ => return None,
            };
            (f.get(tcp + 13)? & 0x12 == 0x12).then_some(dst)
        })
        .collect()
}
