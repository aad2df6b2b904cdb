//! Fuzz target for the safetensors reader: arbitrary file bytes are mapped and parsed, then
//! every tensor the header lists is decoded (to f32, to i64 and to an owned tensor). A
//! malformed file must be an error naming it, never a panic or an out-of-bounds read.
//!
//! Input: the file's bytes. Seeds: `fuzz/seeds/safetensors/` (small files of every dtype).
#![no_main]

use std::io::Write;
use std::sync::OnceLock;

use dsv4_model::checkpoint::SafetensorsFile;
use libfuzzer_sys::fuzz_target;

fn dir() -> &'static tempfile::TempDir {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().expect("a temporary directory"))
}

fuzz_target!(|data: &[u8]| {
    let path = dir().path().join("model.safetensors");
    let mut f = std::fs::File::create(&path).expect("the fuzz file is writable");
    f.write_all(data).expect("the fuzz file is written");
    drop(f);
    let Ok(file) = SafetensorsFile::open(&path) else {
        return;
    };
    let names: Vec<String> = file.names().map(str::to_string).collect();
    for name in names {
        let t = file.tensor(&name).expect("a listed tensor opens");
        let _ = t.to_f32();
        let _ = t.to_i64();
        let _ = t.to_tensor();
    }
    let _ = file.metadata();
});
