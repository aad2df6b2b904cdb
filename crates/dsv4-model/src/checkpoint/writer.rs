//! Writing safetensors files and checkpoint directories (single file or HF-style shards with
//! an index), laid out as the official safetensors writer does.

use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use dsv4_core::{DType, Tensor};

use super::{CONFIG_FILE, INDEX_FILE, SINGLE_FILE};
use crate::config::ModelConfig;
use crate::error::ModelError;

/// Write `tensors` to one safetensors file at `path` (replaced atomically via a temporary
/// file). Tensors are stored by dtype (as the official writer orders them: wider and later
/// dtypes first, so every tensor stays aligned to its element size), then by name; the header
/// carries `"__metadata__": {"format": "pt"}` and is padded with spaces to a multiple of 8.
pub fn write_safetensors(path: &Path, tensors: &[(String, Tensor)]) -> Result<(), ModelError> {
    let items: Vec<(&str, &Tensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    check_names(&items)?;
    write_file(path, items)
}

/// Write a checkpoint directory: config.json plus either `model.safetensors`
/// (`max_shard_bytes` = None) or shards `model-0000i-of-0000N.safetensors` of at most
/// `max_shard_bytes` data bytes each (a larger tensor gets a shard of its own), filled in the
/// given order, with `model.safetensors.index.json`. Weights files of the other layout left
/// in `dir` by an earlier write are removed. Tensors are not checked against the manifest.
pub fn write_checkpoint(
    dir: &Path,
    cfg: &ModelConfig,
    tensors: &[(String, Tensor)],
    max_shard_bytes: Option<u64>,
) -> Result<(), ModelError> {
    let items: Vec<(&str, &Tensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    check_names(&items)?;
    std::fs::create_dir_all(dir).map_err(|e| ModelError::io("create directory", dir, e))?;
    let config_path = dir.join(CONFIG_FILE);
    std::fs::write(&config_path, cfg.to_json_pretty() + "\n")
        .map_err(|e| ModelError::io("write", &config_path, e))?;
    let Some(max) = max_shard_bytes else {
        write_file(&dir.join(SINGLE_FILE), items)?;
        return remove_stale(dir, &HashSet::from([SINGLE_FILE.to_string()]));
    };
    if max == 0 {
        return Err(ModelError::InvalidArgument {
            what: "max_shard_bytes".into(),
            message: "must be at least 1 byte".into(),
        });
    }
    let shards = split_shards(items, max);
    let n = shards.len();
    let mut weight_map = BTreeMap::new();
    let mut keep = HashSet::from([INDEX_FILE.to_string()]);
    let mut total_size: u64 = 0;
    for (i, shard) in shards.into_iter().enumerate() {
        let file = format!("model-{:05}-of-{n:05}.safetensors", i + 1);
        for (name, t) in &shard {
            weight_map.insert(name.to_string(), file.clone());
            total_size += t.data().len() as u64;
        }
        write_file(&dir.join(&file), shard)?;
        keep.insert(file);
    }
    let index = serde_json::json!({
        "metadata": { "total_size": total_size },
        "weight_map": weight_map,
    });
    let index_path = dir.join(INDEX_FILE);
    let text = serde_json::to_string_pretty(&index).unwrap_or_default() + "\n";
    std::fs::write(&index_path, text).map_err(|e| ModelError::io("write", &index_path, e))?;
    remove_stale(dir, &keep)
}

/// Reject duplicate and reserved names.
fn check_names(items: &[(&str, &Tensor)]) -> Result<(), ModelError> {
    let mut seen = HashSet::new();
    for (name, _) in items {
        if *name == "__metadata__" || name.is_empty() {
            return Err(ModelError::InvalidArgument {
                what: format!("tensor name `{name}`"),
                message: "is reserved or empty in safetensors; rename the tensor".into(),
            });
        }
        if !seen.insert(*name) {
            return Err(ModelError::InvalidArgument {
                what: format!("tensor `{name}`"),
                message: "appears twice; each tensor name must be unique".into(),
            });
        }
    }
    Ok(())
}

/// Greedy split in input order: start a new shard when the next tensor would overflow.
fn split_shards<'a>(
    items: Vec<(&'a str, &'a Tensor)>,
    max: u64,
) -> Vec<Vec<(&'a str, &'a Tensor)>> {
    let mut shards: Vec<Vec<(&'a str, &'a Tensor)>> = vec![Vec::new()];
    let mut used: u64 = 0;
    for item in items {
        let size = item.1.data().len() as u64;
        let current = shards.last().map_or(0, Vec::len);
        if current > 0 && used + size > max {
            shards.push(Vec::new());
            used = 0;
        }
        used += size;
        if let Some(last) = shards.last_mut() {
            last.push(item);
        }
    }
    shards
}

/// The official safetensors dtype order (its `Dtype` enum); files list higher ranks first.
fn dtype_rank(d: DType) -> u8 {
    match d {
        DType::U8 => 4,
        DType::I8 => 5,
        DType::F8E4M3 => 7,
        DType::F8E8M0 => 8,
        DType::F16 => 11,
        DType::BF16 => 12,
        DType::I32 => 13,
        DType::F32 => 15,
        DType::I64 => 17,
    }
}

/// Data order of the official writer: higher dtype rank first, then by name.
fn sort_for_writing(items: &mut [(&str, &Tensor)]) {
    items.sort_by_key(|(name, t)| (std::cmp::Reverse(dtype_rank(t.dtype())), *name));
}

/// The header JSON (compact, in data order) and the byte offsets.
fn header(items: &[(&str, &Tensor)]) -> Vec<u8> {
    let mut h = String::from(r#"{"__metadata__":{"format":"pt"}"#);
    let mut offset = 0usize;
    for (name, t) in items {
        let end = offset + t.data().len();
        let shape: Vec<String> = t.shape().iter().map(usize::to_string).collect();
        h.push_str(&format!(
            r#",{}:{{"dtype":"{}","shape":[{}],"data_offsets":[{offset},{end}]}}"#,
            serde_json::Value::from(*name),
            t.dtype().safetensors_name(),
            shape.join(",")
        ));
        offset = end;
    }
    h.push('}');
    let mut bytes = h.into_bytes();
    let pad = (8 - bytes.len() % 8) % 8;
    bytes.extend(std::iter::repeat_n(b' ', pad));
    bytes
}

fn write_file(path: &Path, mut items: Vec<(&str, &Tensor)>) -> Result<(), ModelError> {
    sort_for_writing(&mut items);
    let head = header(&items);
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".partial");
    let tmp = PathBuf::from(tmp);
    let io = |e| ModelError::io("write", &tmp, e);
    let mut w = BufWriter::new(File::create(&tmp).map_err(io)?);
    w.write_all(&(head.len() as u64).to_le_bytes())
        .map_err(io)?;
    w.write_all(&head).map_err(io)?;
    for (_, t) in &items {
        w.write_all(t.data()).map_err(io)?;
    }
    w.into_inner()
        .map_err(|e| io(e.into_error()))?
        .sync_all()
        .map_err(io)?;
    std::fs::rename(&tmp, path).map_err(|e| ModelError::io("rename into place", path, e))
}

/// Remove weights files of the other layout (or an older shard count) not in `keep`.
fn remove_stale(dir: &Path, keep: &HashSet<String>) -> Result<(), ModelError> {
    let entries = std::fs::read_dir(dir).map_err(|e| ModelError::io("list", dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| ModelError::io("list", dir, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let ours = name == SINGLE_FILE || name == INDEX_FILE || is_shard_name(&name);
        if ours && !keep.contains(&name) {
            let p = entry.path();
            std::fs::remove_file(&p).map_err(|e| ModelError::io("remove stale", &p, e))?;
        }
    }
    Ok(())
}

/// `model-DDDDD-of-DDDDD.safetensors`.
fn is_shard_name(name: &str) -> bool {
    let Some(mid) = name
        .strip_prefix("model-")
        .and_then(|s| s.strip_suffix(".safetensors"))
    else {
        return false;
    };
    let b = mid.as_bytes();
    b.len() == 14 && &b[5..9] == b"-of-" && b[..5].iter().chain(&b[9..]).all(u8::is_ascii_digit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_is_padded_and_ordered_like_the_official_writer() {
        let a = Tensor::from_f32(vec![1], &[1.0]).unwrap();
        let b = Tensor::zeros(vec![3], DType::F8E4M3);
        let mut items = vec![("b", &b), ("a", &a)];
        sort_for_writing(&mut items);
        let h = header(&items);
        assert!(h.len().is_multiple_of(8));
        let text = String::from_utf8(h).unwrap();
        assert!(text.starts_with(r#"{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":"#), "{text}");
        assert!(text.trim_end().ends_with("[4,7]}}"), "{text}");
    }

    #[test]
    fn shards_split_greedily() {
        let t = Tensor::zeros(vec![10], DType::U8);
        let big = Tensor::zeros(vec![50], DType::U8);
        let items = vec![("a", &t), ("b", &t), ("c", &big), ("d", &t)];
        let shards = split_shards(items, 25);
        let names: Vec<Vec<&str>> = shards
            .iter()
            .map(|s| s.iter().map(|x| x.0).collect())
            .collect();
        assert_eq!(names, vec![vec!["a", "b"], vec!["c"], vec!["d"]]);
    }

    #[test]
    fn shard_names_are_recognised() {
        assert!(is_shard_name("model-00001-of-00003.safetensors"));
        assert!(!is_shard_name("model-0001-of-00003.safetensors"));
        assert!(!is_shard_name("other-00001-of-00003.safetensors"));
        assert!(!is_shard_name("model.safetensors"));
    }
}
