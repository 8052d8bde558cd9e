//! Access control for `/api/chat`: one shared secret, given by the client either as an
//! `Authorization: Bearer` header or as the `worker_auth_id` query parameter (which Kyutai's web
//! client already sends, so it works unchanged), and checked before any model work.

use std::net::IpAddr;

use axum::http::{header, HeaderMap};

use crate::protocol::percent_decode;

/// Query parameter that carries the token (the name Kyutai's web client uses).
pub const TOKEN_QUERY_PARAM: &str = "worker_auth_id";

/// Whether the request carries `expected`, in its `Authorization: Bearer` header or in the
/// `worker_auth_id` query parameter.
pub fn is_authorized(expected: &str, headers: &HeaderMap, query: Option<&str>) -> bool {
    let mut ok = false;
    // Raw bytes, not `to_str`: a token may hold non-ASCII (UTF-8) bytes.
    for value in headers.get_all(header::AUTHORIZATION) {
        if let Some(token) = value.as_bytes().trim_ascii().strip_prefix(b"Bearer ") {
            ok |= same_secret(expected.as_bytes(), token.trim_ascii());
        }
    }
    for pair in query.unwrap_or("").split('&') {
        if let Some((name, value)) = pair.split_once('=') {
            if percent_decode(name) == TOKEN_QUERY_PARAM {
                ok |= same_secret(expected.as_bytes(), percent_decode(value).as_bytes());
            }
        }
    }
    ok
}

/// Compares two secrets in time that depends only on their lengths, not on where they differ,
/// so that response times do not reveal how much of a guess was right.
pub fn same_secret(expected: &[u8], given: &[u8]) -> bool {
    let mut diff = (expected.len() != given.len()) as u8;
    for (i, &e) in expected.iter().enumerate() {
        let g = given.get(i).copied().unwrap_or(!e);
        diff |= e ^ g;
    }
    std::hint::black_box(diff) == 0
}

/// A warning for a server reachable from other machines with neither a token nor TLS, or `None`.
/// `host` is the address the server binds (`localhost` and loopback addresses are safe).
pub fn exposure_warning(host: &str, has_token: bool, has_tls: bool) -> Option<String> {
    let loopback = host.eq_ignore_ascii_case("localhost")
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    if loopback || (has_token && has_tls) {
        return None;
    }
    let missing = match (has_token, has_tls) {
        (false, false) => "without --auth-token or TLS: anyone who can reach it can use the model, and audio travels in clear",
        (false, true) => "without --auth-token: anyone who can reach it can use the model",
        _ => "without TLS: the token and the audio travel in clear",
    };
    Some(format!("listening on {host} {missing}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn bearer(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_bytes(v.as_bytes()).unwrap(),
        );
        h
    }

    #[test]
    fn secrets_compare_by_content_and_length() {
        assert!(same_secret(b"s3cret", b"s3cret"));
        assert!(!same_secret(b"s3cret", b"s3creT"));
        assert!(!same_secret(b"s3cret", b"s3cre"));
        assert!(!same_secret(b"s3cret", b"s3cret!"));
        assert!(!same_secret(b"s3cret", b""));
        // A byte equal to the complement of the expected one must not match past the end.
        assert!(!same_secret(b"a", &[b'a', !b'a']));
        assert!(same_secret(b"", b""));
    }

    #[test]
    fn token_from_header_or_query() {
        let none = HeaderMap::new();
        assert!(is_authorized("tok en", &bearer("Bearer tok en"), None));
        assert!(!is_authorized("tok en", &bearer("Bearer nope"), None));
        assert!(!is_authorized("tok en", &bearer("Basic tok en"), None));
        assert!(is_authorized("tök", &bearer("Bearer tök"), None));
        assert!(is_authorized(
            "tok en",
            &none,
            Some("text_seed=1&worker_auth_id=tok%20en&email=x")
        ));
        assert!(!is_authorized("tok en", &none, Some("worker_auth_id=tok")));
        assert!(!is_authorized("tok en", &none, Some("other=tok%20en")));
        assert!(!is_authorized("tok en", &none, None));
    }

    #[test]
    fn exposure_warnings() {
        assert_eq!(exposure_warning("127.0.0.1", false, false), None);
        assert_eq!(exposure_warning("::1", false, false), None);
        assert_eq!(exposure_warning("[::1]", false, false), None);
        assert_eq!(exposure_warning("localhost", false, false), None);
        assert_eq!(exposure_warning("0.0.0.0", true, true), None);
        for (token, tls) in [(false, false), (true, false), (false, true)] {
            let w = exposure_warning("0.0.0.0", token, tls).expect("warning");
            assert!(w.contains("0.0.0.0"), "{w}");
        }
        assert!(exposure_warning("0.0.0.0", false, true)
            .unwrap()
            .contains("--auth-token"));
        assert!(exposure_warning("10.0.0.5", true, false)
            .unwrap()
            .contains("TLS"));
    }
}
