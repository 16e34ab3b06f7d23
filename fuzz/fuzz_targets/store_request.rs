//! The bootstrap store's decoders: request frames read off a byte stream
//! (`read_frame`) and their payloads (`parse_request`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    tutti_fuzz::store_request(data);
});
