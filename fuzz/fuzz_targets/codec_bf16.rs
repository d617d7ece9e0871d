#![no_main]
//! The bf16 decoder on arbitrary parts: no panic, finite output, untouched accumulator on error.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| murmur_protocol::fuzzing::codec_decoder("bf16", data));
