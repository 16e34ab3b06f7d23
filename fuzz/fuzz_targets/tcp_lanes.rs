//! The TCP transport's receive path on a link of several sockets: arbitrary
//! and mutated frames spread over the lanes.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    tutti_fuzz::tcp_lanes(data);
});
