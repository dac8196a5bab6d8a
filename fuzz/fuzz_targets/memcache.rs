#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ember_fuzz_targets::memcache(data));
