//! Addresses to listen on, as the user writes them: `HOST:PORT`, `[V6]:PORT`,
//! a name such as `localhost:PORT`, or `:PORT` for every IPv4 address. One
//! parser for `ratelimit run --metrics` and `ratelimit serve --listen`, called
//! while the options are validated, before anything is attached or bound.

use std::net::{SocketAddr, ToSocketAddrs as _};

use crate::{Invalid, Result};

/// Resolves `s`, the value of `field`, to the address to bind. A name is
/// resolved now (the system resolver: /etc/hosts first, as configured) and the
/// first address it gives is taken. `example_port` is the field's usual port,
/// for the error message.
pub fn listen_addr(field: &str, s: &str, example_port: u16) -> Result<SocketAddr> {
    let full = match s.strip_prefix(':') {
        Some(port) => format!("0.0.0.0:{port}"),
        None => s.to_string(),
    };
    let bad = |why: &str| {
        Invalid::new(
            field,
            format!(
                "{s:?} is not an address to listen on ({why}); write HOST:PORT, like \
                 127.0.0.1:{example_port}, [::1]:{example_port}, localhost:{example_port}, \
                 or :{example_port} for every IPv4 address ([::]:{example_port} for every \
                 IPv4 and IPv6 address)"
            ),
        )
    };
    let mut addrs = full.to_socket_addrs().map_err(|e| bad(&e.to_string()))?;
    addrs
        .next()
        .ok_or_else(|| bad("the name resolves to no address"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(s: &str) -> String {
        match listen_addr("--metrics", s, 9477) {
            Err(Invalid { field, message }) => {
                assert_eq!(field, "--metrics");
                message
            }
            other => panic!("{s:?}: expected an invalid --metrics, got {other:?}"),
        }
    }

    #[test]
    fn every_documented_form_is_accepted() {
        let ok = |s: &str| listen_addr("--metrics", s, 9477).unwrap();
        assert_eq!(ok(":9477"), "0.0.0.0:9477".parse().unwrap());
        assert_eq!(ok("127.0.0.1:9477"), "127.0.0.1:9477".parse().unwrap());
        assert_eq!(ok("[::1]:9477"), "[::1]:9477".parse().unwrap());
        assert_eq!(ok("[::]:9477"), "[::]:9477".parse().unwrap());
        let local = ok("localhost:9477");
        assert!(
            local.ip().is_loopback() && local.port() == 9477,
            "localhost:9477 resolved to {local}"
        );
    }

    #[test]
    fn a_bad_address_names_the_flag_and_the_forms() {
        for bad in ["9477", "localhost", "127.0.0.1:99999", ":http", ""] {
            let message = refused(bad);
            for form in ["127.0.0.1:9477", "[::1]:9477", "localhost:9477", ":9477"] {
                assert!(message.contains(form), "{bad:?}: {message}");
            }
        }
    }
}
