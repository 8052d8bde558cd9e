//! WebSocket binary message parsing and the `/api/chat` query-string validation.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| moshi_native_fuzz::ws_message(data));
