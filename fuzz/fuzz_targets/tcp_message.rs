//! The TCP transport's receive path: arbitrary bytes from a peer socket.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    tutti_fuzz::tcp_message(data);
});
