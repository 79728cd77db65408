#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ballast_fuzz::replica_dir(data));
