//! Who calls: the bearer token of a request (HTTP's `Authorization` header,
//! gRPC's `authorization` metadata), and the digest tokens are kept by.
//!
//! The config holds SHA-256 digests of the tokens (`sha256:HEX`), or names a
//! file holding the tokens themselves; a token is looked up by its digest,
//! so the service never keeps a token it was not sent.

/// SHA-256 of `token`.
pub(super) fn digest(token: &str) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// `sha256:HEX` (64 hex digits) as a digest.
pub(super) fn parse_digest(s: &str) -> Option<[u8; 32]> {
    let hex = s.strip_prefix("sha256:")?;
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(i * 2..i * 2 + 2)?, 16).ok()?;
    }
    Some(out)
}

/// The shortest token accepted, characters: a token is a secret, not a name.
pub(super) const MIN_TOKEN: usize = 16;

/// What an `Authorization` value holds: `Ok(None)` when there is none,
/// `Ok(Some(token))` for `Bearer TOKEN`, `Err` for anything else.
pub(super) fn bearer(value: Option<&[u8]>) -> Result<Option<&str>, &'static str> {
    let Some(v) = value else { return Ok(None) };
    let v = std::str::from_utf8(v).map_err(|_| "not text")?.trim();
    match v.split_once(' ') {
        Some((scheme, token))
            if scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty() =>
        {
            Ok(Some(token.trim()))
        }
        _ => Err("not `Bearer TOKEN`"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_kept_by_digest() {
        // printf %s abc | sha256sum
        let d =
            parse_digest("sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
                .unwrap();
        assert_eq!(digest("abc"), d);
        assert_eq!(parse_digest("sha256:ba78"), None);
        assert_eq!(
            parse_digest("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
            None
        );
        assert_eq!(bearer(None), Ok(None));
        assert_eq!(bearer(Some(b"Bearer abc")), Ok(Some("abc")));
        assert_eq!(bearer(Some(b"bearer  abc ")), Ok(Some("abc")));
        assert!(bearer(Some(b"Basic YWJj")).is_err());
        assert!(bearer(Some(b"Bearer ")).is_err());
    }
}
