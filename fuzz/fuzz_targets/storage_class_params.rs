#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ballast_fuzz::storage_class_params(data));
