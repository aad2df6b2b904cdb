//! One memory-mapped safetensors file: header parsing with every offset checked against the
//! file, so a truncated or malformed file is an error naming the file, never a panic.
//!
//! Format: 8-byte little-endian header length N, N bytes of JSON
//! `{name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {..}}`, then the data;
//! offsets are relative to the start of the data. Overlapping ranges are rejected; gaps between
//! tensors are tolerated.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use dsv4_core::DType;
use memmap2::Mmap;
use serde_json::Value;

use super::TensorRef;
use crate::error::ModelError;

/// Largest header dsv4 accepts (the official reader's limit is the same 100 MB).
const MAX_HEADER_BYTES: u64 = 100_000_000;

/// Where one tensor lives in a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) dtype: DType,
    pub(crate) shape: Vec<usize>,
    /// Absolute byte range in the file.
    pub(crate) start: usize,
    pub(crate) end: usize,
}

/// A parsed, memory-mapped safetensors file.
#[derive(Debug)]
pub struct SafetensorsFile {
    path: PathBuf,
    map: Mmap,
    entries: BTreeMap<String, Entry>,
    metadata: BTreeMap<String, String>,
}

impl SafetensorsFile {
    /// Memory-map and parse `path`; every header entry is checked against the file's length.
    pub fn open(path: &Path) -> Result<Self, ModelError> {
        let file = File::open(path).map_err(|e| ModelError::io("open", path, e))?;
        let len = file
            .metadata()
            .map_err(|e| ModelError::io("stat", path, e))?
            .len();
        if len < 8 {
            return Err(ModelError::corrupt(
                path,
                format!("file is {len} bytes, shorter than the 8-byte header length"),
            ));
        }
        // SAFETY: the map is read-only; a checkpoint file changed by another process while
        // mapped is outside what this reader can defend against (as for every mmap loader).
        let map = unsafe { Mmap::map(&file) }.map_err(|e| ModelError::io("memory-map", path, e))?;
        let (entries, metadata) = parse_header(path, &map)?;
        Ok(Self {
            path: path.to_path_buf(),
            map,
            entries,
            metadata,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The header's `__metadata__` map (empty if absent).
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }

    /// Tensor names in the file, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }

    /// Whether the file has tensor `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// A view of tensor `name`; missing → error naming the tensor and this file.
    pub fn tensor(&self, name: &str) -> Result<TensorRef<'_>, ModelError> {
        let (key, entry) =
            self.entries
                .get_key_value(name)
                .ok_or_else(|| ModelError::MissingTensor {
                    name: name.to_string(),
                    location: self.path.display().to_string(),
                })?;
        Ok(TensorRef {
            name: key,
            dtype: entry.dtype,
            shape: &entry.shape,
            // In range: parse_header checked start ≤ end ≤ file length.
            data: &self.map[entry.start..entry.end],
        })
    }
}

type Header = (BTreeMap<String, Entry>, BTreeMap<String, String>);

/// Parse and check the header of a whole file's bytes.
fn parse_header(path: &Path, bytes: &[u8]) -> Result<Header, ModelError> {
    let bad = |reason: String| ModelError::corrupt(path, reason);
    let Some(len8) = bytes.first_chunk::<8>() else {
        return Err(bad(format!(
            "file is {} bytes, shorter than the 8-byte header length",
            bytes.len()
        )));
    };
    let n = u64::from_le_bytes(*len8);
    let file_len = bytes.len() as u64;
    if n > MAX_HEADER_BYTES {
        return Err(bad(format!(
            "header length {n} exceeds the {MAX_HEADER_BYTES}-byte limit"
        )));
    }
    if n > file_len - 8 {
        return Err(bad(format!(
            "header length {n} runs past the end of the {file_len}-byte file"
        )));
    }
    let data_start = 8 + n as usize;
    let header: Value = serde_json::from_slice(&bytes[8..data_start])
        .map_err(|e| bad(format!("header is not valid JSON ({e})")))?;
    let Value::Object(obj) = header else {
        return Err(bad("header is not a JSON object".into()));
    };
    let data_len = bytes.len() - data_start;
    let mut entries = BTreeMap::new();
    let mut metadata = BTreeMap::new();
    for (name, v) in obj {
        if name == "__metadata__" {
            metadata = parse_metadata(&v)
                .ok_or_else(|| bad("`__metadata__` must be an object of string values".into()))?;
            continue;
        }
        let e = parse_entry(path, &name, &v, data_len)?;
        entries.insert(
            name,
            Entry {
                start: e.start + data_start,
                end: e.end + data_start,
                ..e
            },
        );
    }
    check_no_overlap(path, &entries)?;
    Ok((entries, metadata))
}

fn parse_metadata(v: &Value) -> Option<BTreeMap<String, String>> {
    v.as_object()?
        .iter()
        .map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
        .collect()
}

/// One header entry; offsets are relative to the data section.
fn parse_entry(path: &Path, name: &str, v: &Value, data_len: usize) -> Result<Entry, ModelError> {
    let bad = |reason: &str| ModelError::corrupt(path, format!("tensor `{name}`: {reason}"));
    let dtype_name = v
        .get("dtype")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("header entry has no string `dtype`"))?;
    let dtype = DType::from_safetensors_name(dtype_name).map_err(|_| ModelError::UnknownDType {
        path: path.to_path_buf(),
        tensor: name.to_string(),
        dtype: dtype_name.to_string(),
    })?;
    let shape = v
        .get("shape")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("header entry has no `shape` array"))?
        .iter()
        .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
        .collect::<Option<Vec<usize>>>()
        .ok_or_else(|| bad("`shape` must hold non-negative integers"))?;
    let offsets = v
        .get("data_offsets")
        .and_then(Value::as_array)
        .filter(|a| a.len() == 2)
        .and_then(|a| Some([a[0].as_u64()?, a[1].as_u64()?]))
        .ok_or_else(|| bad("`data_offsets` must be two non-negative integers"))?;
    let [begin, end] = offsets;
    if begin > end {
        return Err(bad(&format!("data_offsets [{begin}, {end}] are reversed")));
    }
    if end > data_len as u64 {
        return Err(bad(&format!(
            "data_offsets end {end} is past the {data_len} data bytes in the file (truncated?)"
        )));
    }
    let need = shape
        .iter()
        .try_fold(dtype.size() as u64, |acc, &d| acc.checked_mul(d as u64));
    if need != Some(end - begin) {
        return Err(bad(&format!(
            "shape {shape:?} of {dtype} needs {} bytes but data_offsets span {}",
            need.map_or("overflowing".to_string(), |n| n.to_string()),
            end - begin
        )));
    }
    Ok(Entry {
        dtype,
        shape,
        start: begin as usize,
        end: end as usize,
    })
}

/// Tensors' byte ranges must not overlap (empty tensors are exempt).
fn check_no_overlap(path: &Path, entries: &BTreeMap<String, Entry>) -> Result<(), ModelError> {
    let mut ranges: Vec<(&str, usize, usize)> = entries
        .iter()
        .filter(|(_, e)| e.end > e.start)
        .map(|(n, e)| (n.as_str(), e.start, e.end))
        .collect();
    ranges.sort_by_key(|r| (r.1, r.2));
    for w in ranges.windows(2) {
        if w[1].1 < w[0].2 {
            return Err(ModelError::corrupt(
                path,
                format!(
                    "tensors `{}` and `{}` have overlapping data_offsets",
                    w[0].0, w[1].0
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_with_header(header: &str, data: usize) -> Vec<u8> {
        let mut b = (header.len() as u64).to_le_bytes().to_vec();
        b.extend_from_slice(header.as_bytes());
        b.extend(std::iter::repeat_n(0u8, data));
        b
    }

    fn parse(bytes: &[u8]) -> Result<Header, ModelError> {
        parse_header(Path::new("x.safetensors"), bytes)
    }

    #[test]
    fn parses_entries_and_metadata() {
        let h = r#"{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
        let (e, m) = parse(&file_with_header(h, 8)).unwrap();
        assert_eq!(m["format"], "pt");
        let a = &e["a"];
        assert_eq!(
            (a.dtype, a.start, a.end),
            (DType::F32, 8 + h.len(), 16 + h.len())
        );
    }

    #[test]
    fn rejects_malformed_headers() {
        let cases = [
            (
                r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#,
                4,
                "past the",
            ),
            (
                r#"{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#,
                8,
                "needs 12 bytes",
            ),
            (
                r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}}"#,
                8,
                "reversed",
            ),
            (
                r#"{"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}"#,
                8,
                "non-negative",
            ),
            (r#"{"a":{"shape":[2],"data_offsets":[0,8]}}"#, 8, "dtype"),
            (r#"{"a":{"dtype":"F32","shape":[2]}}"#, 8, "data_offsets"),
            (r#"[1,2]"#, 0, "not a JSON object"),
            (r#"{"a": "#, 0, "not valid JSON"),
            (r#"{"__metadata__":{"k":1}}"#, 0, "__metadata__"),
            (
                r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#,
                12,
                "overlapping",
            ),
        ];
        for (h, data, needle) in cases {
            let err = parse(&file_with_header(h, data)).unwrap_err().to_string();
            assert!(
                err.contains(needle) && err.contains("x.safetensors"),
                "{h}: {err}"
            );
        }
    }

    #[test]
    fn unknown_dtype_names_tensor_and_dtype() {
        let h = r#"{"w":{"dtype":"F8_E5M2","shape":[1],"data_offsets":[0,1]}}"#;
        let err = parse(&file_with_header(h, 1)).unwrap_err();
        assert!(
            matches!(&err, ModelError::UnknownDType { tensor, dtype, .. } if tensor == "w" && dtype == "F8_E5M2"),
            "{err}"
        );
    }

    #[test]
    fn header_length_past_end_or_huge_is_rejected() {
        let mut b = file_with_header("{}", 0);
        b[..8].copy_from_slice(&1000u64.to_le_bytes());
        assert!(
            parse(&b)
                .unwrap_err()
                .to_string()
                .contains("runs past the end")
        );
        b[..8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(parse(&b).unwrap_err().to_string().contains("exceeds"));
    }
}
