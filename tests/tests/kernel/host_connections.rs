//! Frames of the host's own connections, found by their sockets in a
//! namespace of the test's own, pass a limit that drops everything else.

use ratelimit_common::Reason;
use ratelimit_tests::{
    frames::{Udp, tcp},
    net::NetNs,
    privileged,
    testrun::{Loaded, XDP_DROP, XDP_PASS},
    unique_tag,
};
use ratelimit_user::model::rules::{Action, HostConnections};

use super::{addr, expect, limit, rules};

/// Frames of the host's own connections (an established TCP connection, a
/// connected UDP socket, on an ephemeral local port) pass a limit that drops
/// everything else from their source; the same frames with another port, a
/// SYN, or with the rule set to `limit` are dropped. Sockets in a namespace of
/// the test's own, on 198.18.0.3 and 2001:db8::3.
#[test]
fn frames_of_the_hosts_own_connections_pass_a_limit() {
    privileged!("frames_of_the_hosts_own_connections_pass_a_limit");
    use std::net::{TcpListener, TcpStream, UdpSocket};
    let ns = NetNs::new(&unique_tag(), "hc");
    for (a, extra) in [("198.18.0.3/32", None), ("2001:db8::3/128", Some("nodad"))] {
        let mut cmd = ns.command("ip");
        cmd.args(["addr", "add", a, "dev", "lo"]);
        if let Some(x) = extra {
            cmd.arg(x);
        }
        assert!(cmd.status().expect("ip addr add").success(), "adding {a}");
    }
    std::thread::scope(|s| {
        s.spawn(|| {
            ns.enter();
            // A limit that admits nothing, for every source.
            let mut set = rules(limit("0/s", 1));
            let mut l = Loaded::new(&set);
            for host in ["198.18.0.3", "2001:db8::3"] {
                let ip = addr(host);
                let listener = TcpListener::bind((ip, 0)).expect("listen");
                let client = TcpStream::connect(listener.local_addr().unwrap()).expect("connect");
                let _server = listener.accept().expect("accept");
                let (local, remote) = (client.local_addr().unwrap(), client.peer_addr().unwrap());
                let udp = UdpSocket::bind((ip, 0)).expect("udp bind");
                udp.connect((ip, 5353)).expect("udp connect");
                let udp_local = udp.local_addr().unwrap();

                let frame = |sport: u16, dport: u16, tcp: Option<u8>| {
                    let mut f = Udp::new(ip, ip);
                    f.sport = sport;
                    f.dport = dport;
                    f.tcp = tcp;
                    f.build()
                };
                let ack = Some(tcp::ACK | tcp::PSH);
                expect(
                    &l,
                    &format!("{host}: TCP of an established connection"),
                    &frame(remote.port(), local.port(), ack),
                    XDP_PASS,
                    Reason::HostConnection,
                );
                expect(
                    &l,
                    &format!("{host}: UDP reply to a connected socket"),
                    &frame(5353, udp_local.port(), None),
                    XDP_PASS,
                    Reason::HostConnection,
                );
                expect(
                    &l,
                    &format!("{host}: UDP from another port"),
                    &frame(5354, udp_local.port(), None),
                    XDP_DROP,
                    Reason::Limited,
                );
                expect(
                    &l,
                    &format!("{host}: a SYN on the connection's ports"),
                    &frame(remote.port(), local.port(), Some(tcp::SYN)),
                    XDP_DROP,
                    Reason::Limited,
                );
                // A connection a client opened to a service of the host (a
                // local port outside the ephemeral range) is not the host's own.
                let service = TcpListener::bind((ip, 8080)).expect("listen on 8080");
                let visitor = TcpStream::connect((ip, 8080)).expect("connect to 8080");
                let _accepted = service.accept().expect("accept");
                expect(
                    &l,
                    &format!("{host}: an ACK of a client's connection to port 8080"),
                    &frame(visitor.local_addr().unwrap().port(), 8080, ack),
                    XDP_DROP,
                    Reason::Limited,
                );
            }
            // IPv6: the ports are found behind extension headers, within the
            // bound; a non-first fragment has none; a longer chain is not read.
            let ip = addr("2001:db8::3");
            let listener = TcpListener::bind((ip, 0)).expect("listen");
            let client = TcpStream::connect(listener.local_addr().unwrap()).expect("connect");
            // `n` extension headers, the fourth a first fragment (offset 0),
            // which the program reads past, up to its bound of eight.
            let with_fragment = |n: usize| {
                let mut c = vec![(0, 0), (60, 0), (43, 0), (44, 0)];
                c.resize(n, (60, 0));
                c
            };
            type Case = (&'static str, Vec<(u8, u16)>, u32, Reason);
            let ext_cases: [Case; 5] = [
                (
                    "hop-by-hop, routing, destination options",
                    vec![(0, 0), (43, 0), (60, 0)],
                    XDP_PASS,
                    Reason::HostConnection,
                ),
                (
                    "a first fragment",
                    vec![(44, 0)],
                    XDP_PASS,
                    Reason::HostConnection,
                ),
                (
                    "a non-first fragment",
                    vec![(44, 8)],
                    XDP_DROP,
                    Reason::Limited,
                ),
                (
                    "eight extension headers",
                    with_fragment(8),
                    XDP_PASS,
                    Reason::HostConnection,
                ),
                (
                    "nine extension headers (over the bound: unjudged, dropped)",
                    with_fragment(9),
                    XDP_DROP,
                    Reason::Unjudged,
                ),
            ];
            for (what, ext, verdict, reason) in ext_cases {
                let mut f = Udp::new(ip, ip);
                f.sport = client.peer_addr().unwrap().port();
                f.dport = client.local_addr().unwrap().port();
                f.tcp = Some(tcp::ACK);
                f.ipv6_ext = ext;
                expect(
                    &l,
                    &format!("IPv6 TCP behind {what}"),
                    &f.build(),
                    verdict,
                    reason,
                );
            }

            // Limited like everything else when the rule says so.
            let Action::Limit(mut d) = set.default else {
                unreachable!()
            };
            d.host_connections = HostConnections::Limit;
            set.default = Action::Limit(d);
            l.maps.apply(&set).expect("host connections limited");
            let ip = addr("198.18.0.3");
            let listener = TcpListener::bind((ip, 0)).expect("listen");
            let client = TcpStream::connect(listener.local_addr().unwrap()).expect("connect");
            let mut f = Udp::new(ip, ip);
            f.sport = client.peer_addr().unwrap().port();
            f.dport = client.local_addr().unwrap().port();
            f.tcp = Some(tcp::ACK);
            expect(
                &l,
                "TCP of an established connection, host connections limited",
                &f.build(),
                XDP_DROP,
                Reason::Limited,
            );
        })
        .join()
        .expect("test thread");
    });
}
