//! WebSocket binary message parsing and the `/api/chat` query-string validation.
#![no_main]
use libfuzzer_sys::fuzz_target;
use server::protocol::{parse_client_message, SessionParams};

fuzz_target!(|data: &[u8]| {
    let _ = parse_client_message(data);
    if let Ok(q) = std::str::from_utf8(data) {
        let _ = SessionParams::from_query(Some(q));
        let _ = server::protocol::percent_decode(q);
    }
});
