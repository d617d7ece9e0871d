//! Replays the fuzzers' corpora (`fuzz/corpus/<target>/`) through the same entry points the
//! fuzz targets call, so that every input a fuzzer once found interesting stays a
//! regression test in CI. Bounded: each corpus is capped in files and in time.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use murmur_protocol::fuzzing;

const MAX_FILES: usize = 20_000;
const MAX_TIME: Duration = Duration::from_secs(120);

fn replay(target: &str, entry: impl Fn(&[u8])) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("corpus {} is missing: {e}", dir.display()))
        .map(|entry| entry.expect("readable corpus entry").path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "corpus {} is empty", dir.display());
    assert!(
        files.len() <= MAX_FILES,
        "corpus {} has {} files; minimize it",
        dir.display(),
        files.len()
    );
    let start = Instant::now();
    for file in &files {
        let data = std::fs::read(file).expect("readable corpus file");
        entry(&data);
        assert!(
            start.elapsed() < MAX_TIME,
            "replaying {target} took over {MAX_TIME:?}"
        );
    }
}

#[test]
fn frame_message_corpus() {
    replay("frame_message", fuzzing::frames_and_messages);
}

macro_rules! codec_corpus {
    ($($test:ident => $codec:literal),* $(,)?) => {$(
        #[test]
        fn $test() {
            replay(concat!("codec_", $codec), |data| fuzzing::codec_decoder($codec, data));
        }
    )*};
}

codec_corpus! {
    codec_f32_corpus => "f32",
    codec_f16_corpus => "f16",
    codec_bf16_corpus => "bf16",
    codec_int8_corpus => "int8",
    codec_int4_corpus => "int4",
    codec_sign1_corpus => "sign1",
    codec_topk_corpus => "topk",
}
