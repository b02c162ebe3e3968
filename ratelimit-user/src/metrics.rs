//! Prometheus metrics: the text exposition format over a minimal HTTP/1.1 server.
//! The server asks the daemon's loop for a fresh rendering on each scrape.

use std::fmt::Write as _;

use ratelimit_common::{Counter, EVENT_COUNT, Event, REASON_COUNT, Reason};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpListener,
    sync::{mpsc, oneshot},
};

use crate::kernel::Attached;

/// What one scrape reports.
pub struct Snapshot<'a> {
    /// The interface.
    pub iface: &'a str,
    /// The attach mode.
    pub mode: Attached,
    /// Counters by reason.
    pub counters: &'a [Counter; REASON_COUNT as usize],
    /// Tracked sources.
    pub tracked: usize,
    /// Rules.
    pub rules: usize,
    /// Counters by event.
    pub events: &'a [u64; EVENT_COUNT as usize],
}

/// Renders the exposition text.
pub fn render(s: &Snapshot<'_>) -> String {
    let mut out = String::new();
    let iface = s.iface.replace('\\', "\\\\").replace('"', "\\\"");
    let _ = writeln!(
        out,
        "# HELP ratelimit_packets_total Frames seen by the XDP program, by the reason of their verdict."
    );
    let _ = writeln!(out, "# TYPE ratelimit_packets_total counter");
    for r in Reason::ALL {
        let _ = writeln!(
            out,
            "ratelimit_packets_total{{iface=\"{iface}\",reason=\"{}\"}} {}",
            r.name(),
            s.counters[r as usize].packets
        );
    }
    let _ = writeln!(
        out,
        "# HELP ratelimit_bytes_total Bytes of those frames (whole frames from the Ethernet header)."
    );
    let _ = writeln!(out, "# TYPE ratelimit_bytes_total counter");
    for r in Reason::ALL {
        let _ = writeln!(
            out,
            "ratelimit_bytes_total{{iface=\"{iface}\",reason=\"{}\"}} {}",
            r.name(),
            s.counters[r as usize].bytes
        );
    }
    let _ = writeln!(
        out,
        "# HELP ratelimit_state_events_total States created for sources the doorkeeper saw twice, and promotions refused by the state-creation cap."
    );
    let _ = writeln!(out, "# TYPE ratelimit_state_events_total counter");
    for e in Event::ALL {
        let _ = writeln!(
            out,
            "ratelimit_state_events_total{{iface=\"{iface}\",event=\"{}\"}} {}",
            e.name(),
            s.events[e as usize]
        );
    }
    let _ = writeln!(
        out,
        "# HELP ratelimit_tracked_sources Sources with a bucket (refreshed every 10 s at most)."
    );
    let _ = writeln!(out, "# TYPE ratelimit_tracked_sources gauge");
    let _ = writeln!(
        out,
        "ratelimit_tracked_sources{{iface=\"{iface}\"}} {}",
        s.tracked
    );
    let _ = writeln!(
        out,
        "# HELP ratelimit_rules Prefix rules, besides the default rule."
    );
    let _ = writeln!(out, "# TYPE ratelimit_rules gauge");
    let _ = writeln!(out, "ratelimit_rules{{iface=\"{iface}\"}} {}", s.rules);
    let _ = writeln!(
        out,
        "# HELP ratelimit_attach_mode The XDP attach mode (1 for the mode in use)."
    );
    let _ = writeln!(out, "# TYPE ratelimit_attach_mode gauge");
    for m in [Attached::Native, Attached::Generic] {
        let _ = writeln!(
            out,
            "ratelimit_attach_mode{{iface=\"{iface}\",mode=\"{m}\"}} {}",
            u8::from(m == s.mode)
        );
    }
    out
}

/// Largest request head read.
const MAX_REQUEST: usize = 8192;

/// Serves `GET /metrics` until the daemon goes away.
pub async fn serve(listener: TcpListener, ask: mpsc::Sender<oneshot::Sender<String>>) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            continue;
        };
        let ask = ask.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; MAX_REQUEST];
            let mut len = 0;
            let read = tokio::time::timeout(std::time::Duration::from_secs(5), async {
                while len < buf.len() {
                    match stream.read(&mut buf[len..]).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            len += n;
                            if buf[..len].windows(4).any(|w| w == b"\r\n\r\n") {
                                break;
                            }
                        }
                    }
                }
            })
            .await;
            if read.is_err() {
                return;
            }
            let head = String::from_utf8_lossy(&buf[..len]);
            let path = head.split_whitespace().nth(1).unwrap_or("");
            let (status, body) = if head.starts_with("GET ") && (path == "/metrics" || path == "/")
            {
                let (tx, rx) = oneshot::channel();
                if ask.send(tx).await.is_err() {
                    return;
                }
                match rx.await {
                    Ok(body) => ("200 OK", body),
                    Err(_) => return,
                }
            } else {
                ("404 Not Found", "not found: try /metrics\n".to_string())
            };
            let response = format!(
                "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes()).await;
        });
    }
}
