#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| zonedd_fuzz::lsl_load(data));
