//! The point-to-point TCP link: messages of variable length on one socket.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    tutti_fuzz::tcp_stream(data);
});
