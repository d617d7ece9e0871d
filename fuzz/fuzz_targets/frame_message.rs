#![no_main]
//! Frames fed at arbitrary splits, decoded into messages, re-encoded byte for byte.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| murmur_protocol::fuzzing::frames_and_messages(data));
