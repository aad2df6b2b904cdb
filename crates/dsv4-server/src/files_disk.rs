//! The Files and Batch APIs on disk (`server.files_dir`), so files and batches survive a
//! restart. A file is two files: `{id}.data`, its bytes, and `{id}.json`, what `GET
//! /v1/files/{id}` answers (`format`, id, filename, purpose, created_at, bytes), written after
//! the bytes, so a file is listed only once its bytes are whole. A batch is `batches/{id}.json`,
//! its batch object, rewritten at each change of status, and while it runs its output and error
//! lines go to `batches/{id}.{output,error}.jsonl.part` (moved into place as the batch's files
//! when it ends; read back by [`crate::batches`] to go on after a restart). Everything else is
//! written through a temporary file and a rename. On start both are read back; a file whose
//! bytes are missing or of another length, and a record that cannot be read, are left as they
//! are and reported.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The `format` of a file's metadata.
const FORMAT: &str = "dsv4-file/1";

/// The lock file of a `server.files_dir` ([`DirLock`]).
const LOCK: &str = ".dsv4-files.lock";

/// The part files a running batch writes: its output lines and its failed lines.
pub const PART_KINDS: [&str; 2] = ["output", "error"];

/// Write `bytes` to `path` through `path.tmp` and a rename (a reader never sees half a file).
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let written = std::fs::write(&tmp, bytes).and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// An exclusive lock on a directory a server keeps its state in (`DIR/{name}`, holding the
/// server's pid), so a second server on the directory is refused at start instead of both
/// writing it. Released when dropped, or when the process dies.
#[derive(Debug)]
pub(crate) struct DirLock {
    /// Held open: the lock lasts as long as the file does.
    _file: std::fs::File,
}

impl DirLock {
    /// Take the lock file `name` in `dir`, or fail saying which process holds it.
    pub(crate) fn take(dir: &Path, name: &str) -> std::io::Result<Self> {
        use std::io::{Read, Write};
        let path = dir.join(name);
        let mut file = std::fs::File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut pid = String::new();
                let _ = file.read_to_string(&mut pid);
                let pid = pid.trim();
                let who = if pid.is_empty() {
                    "another process".to_string()
                } else {
                    format!("process {pid}")
                };
                return Err(std::io::Error::other(format!(
                    "another server uses it ({who} holds {}); give each server its own \
                     directory",
                    path.display()
                )));
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(e),
        }
        file.set_len(0)?;
        writeln!(file, "{}", std::process::id())?;
        Ok(Self { _file: file })
    }
}

/// Whether `id` is an id the server makes (and so a safe file name).
pub(crate) fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// What is kept of a file beside its bytes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileMeta {
    format: String,
    /// `file-…`.
    pub id: String,
    /// The name it was uploaded with.
    pub filename: String,
    /// `batch` or `batch_output`.
    pub purpose: String,
    /// Unix seconds.
    pub created_at: u64,
    /// When it goes away (Unix seconds), if ever (absent in records written before it was
    /// kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<u64>,
    /// Its length.
    pub bytes: usize,
}

impl FileMeta {
    /// The metadata of a file created and expiring at `(created_at, expires_at)`.
    pub fn new(
        id: &str,
        filename: &str,
        purpose: &str,
        (created_at, expires_at): (u64, Option<u64>),
        bytes: usize,
    ) -> Self {
        Self {
            format: FORMAT.into(),
            id: id.into(),
            filename: filename.into(),
            purpose: purpose.into(),
            created_at,
            expires_at,
            bytes,
        }
    }
}

/// What reading the directory found.
#[derive(Debug, Default)]
pub struct Found {
    /// Files whose bytes are whole, with the path of their bytes.
    pub files: Vec<(FileMeta, PathBuf)>,
    /// Batch objects.
    pub batches: Vec<Value>,
    /// Entries left as they were, and why.
    pub skipped: Vec<String>,
}

/// The directory of `server.files_dir`, locked for this server while it lives.
#[derive(Debug)]
pub struct FilesDir {
    dir: PathBuf,
    _lock: DirLock,
}

impl FilesDir {
    /// Use `dir` (created if missing, with its `batches/`).
    pub fn open(dir: &Path) -> std::io::Result<Self> {
        if dir.exists() && !dir.is_dir() {
            return Err(std::io::Error::other("it exists and is not a directory"));
        }
        std::fs::create_dir_all(dir.join("batches"))?;
        Ok(Self {
            dir: dir.to_owned(),
            _lock: DirLock::take(dir, LOCK)?,
        })
    }

    /// Where a file's bytes are.
    pub fn data_path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.data"))
    }

    /// Keep a file: its bytes, then its metadata; the path of its bytes.
    pub fn write_file(&self, meta: &FileMeta, content: &[u8]) -> std::io::Result<PathBuf> {
        let data = self.data_path(&meta.id);
        write_atomic(&data, content)?;
        let json = serde_json::to_vec(meta).map_err(std::io::Error::other)?;
        if let Err(e) = write_atomic(&self.dir.join(format!("{}.json", meta.id)), &json) {
            let _ = std::fs::remove_file(&data);
            return Err(e);
        }
        Ok(data)
    }

    /// Forget a file: its metadata first (so it is never listed without its bytes).
    pub fn remove_file(&self, id: &str) {
        for path in [self.dir.join(format!("{id}.json")), self.data_path(id)] {
            if let Err(e) = std::fs::remove_file(&path)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(path = %path.display(), error = %e, "server.files_dir: cannot delete");
            }
        }
    }

    /// Keep a batch's object.
    pub fn write_batch(&self, id: &str, object: &Value) -> std::io::Result<()> {
        let json = serde_json::to_vec(object).map_err(std::io::Error::other)?;
        write_atomic(&self.dir.join("batches").join(format!("{id}.json")), &json)
    }

    /// Forget a batch's record and any part files it left.
    pub fn remove_batch(&self, id: &str) {
        let _ = std::fs::remove_file(self.dir.join("batches").join(format!("{id}.json")));
        for kind in PART_KINDS {
            let _ = std::fs::remove_file(self.part_path(id, kind));
        }
    }

    /// Where a running batch writes its `output` or `error` lines until it ends.
    pub fn part_path(&self, batch: &str, kind: &str) -> PathBuf {
        self.dir
            .join("batches")
            .join(format!("{batch}.{kind}.jsonl.part"))
    }

    /// Make `part` (a batch's part file, already whole) the bytes of the file `meta`: move it
    /// into place, then write the metadata; the path of its bytes. Done again after a stop
    /// between the two steps, it writes the metadata of the bytes already moved.
    pub fn adopt(&self, meta: &FileMeta, part: &Path) -> std::io::Result<PathBuf> {
        let data = self.data_path(&meta.id);
        if part.exists() || !data.exists() {
            std::fs::rename(part, &data)?;
        }
        let json = serde_json::to_vec(meta).map_err(std::io::Error::other)?;
        write_atomic(&self.dir.join(format!("{}.json", meta.id)), &json)?;
        Ok(data)
    }

    /// Read back the files (oldest first) and batches; leftover temporary files are deleted.
    pub fn read(&self) -> std::io::Result<Found> {
        let mut found = Found::default();
        for (path, stem) in json_entries(&self.dir)? {
            let meta = std::fs::read(&path)
                .ok()
                .and_then(|b| serde_json::from_slice::<FileMeta>(&b).ok())
                .filter(|m| m.format == FORMAT && m.id == stem && valid_id(&stem));
            let Some(meta) = meta else {
                found
                    .skipped
                    .push(format!("{}: not a file record", path.display()));
                continue;
            };
            let data = self.data_path(&meta.id);
            match std::fs::metadata(&data) {
                Ok(m) if m.len() == meta.bytes as u64 => found.files.push((meta, data)),
                Ok(m) => found.skipped.push(format!(
                    "{}: {} bytes, its record says {}",
                    data.display(),
                    m.len(),
                    meta.bytes
                )),
                Err(e) => found.skipped.push(format!("{}: {e}", data.display())),
            }
        }
        found
            .files
            .sort_by(|a, b| (a.0.created_at, &a.0.id).cmp(&(b.0.created_at, &b.0.id)));
        for (path, stem) in json_entries(&self.dir.join("batches"))? {
            let object = std::fs::read(&path)
                .ok()
                .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
                .filter(|v| v["id"] == stem.as_str() && v["object"] == "batch" && valid_id(&stem));
            match object {
                Some(v) => found.batches.push(v),
                None => found
                    .skipped
                    .push(format!("{}: not a batch record", path.display())),
            }
        }
        found.batches.sort_by(|a, b| {
            (a["created_at"].as_u64(), a["id"].as_str())
                .cmp(&(b["created_at"].as_u64(), b["id"].as_str()))
        });
        Ok(found)
    }
}

/// The `*.json` files of `dir` with their stems; `*.tmp` leftovers are deleted.
fn json_entries(dir: &Path) -> std::io::Result<Vec<(PathBuf, String)>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_owned();
        if name.ends_with(".tmp") {
            let _ = std::fs::remove_file(&path);
            continue;
        }
        if let Some(stem) = name.strip_suffix(".json") {
            out.push((path.clone(), stem.to_owned()));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_and_batches_are_read_back_and_broken_ones_reported() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = FilesDir::open(tmp.path()).unwrap();
        let a = FileMeta::new("file-a", "a.jsonl", "batch", (5, None), 3);
        let b = FileMeta::new("file-b", "b.jsonl", "batch_output", (2, Some(9)), 4);
        dir.write_file(&a, b"abc").unwrap();
        dir.write_file(&b, b"wxyz").unwrap();
        dir.write_file(&FileMeta::new("file-c", "c", "batch", (9, None), 2), b"hi")
            .unwrap();
        std::fs::write(dir.data_path("file-c"), b"cut").unwrap();
        std::fs::write(tmp.path().join("file-d.json.tmp"), b"half").unwrap();
        std::fs::write(tmp.path().join("junk.json"), b"{").unwrap();
        let batch = serde_json::json!({"id": "batch_1", "object": "batch", "created_at": 1});
        dir.write_batch("batch_1", &batch).unwrap();
        let found = dir.read().unwrap();
        let ids: Vec<&str> = found.files.iter().map(|(m, _)| m.id.as_str()).collect();
        assert_eq!(ids, ["file-b", "file-a"], "oldest first");
        assert_eq!(found.files[0].0, b, "the expiry is read back");
        // A record written before files could expire reads back without one.
        let old = r#"{"format":"dsv4-file/1","id":"file-a","filename":"a.jsonl","purpose":"batch","created_at":5,"bytes":3}"#;
        assert_eq!(serde_json::from_str::<FileMeta>(old).unwrap(), a);
        assert_eq!(std::fs::read(&found.files[1].1).unwrap(), b"abc");
        assert_eq!(found.batches, [batch]);
        assert_eq!(found.skipped.len(), 2, "{:?}", found.skipped);
        assert!(!tmp.path().join("file-d.json.tmp").exists());
        dir.remove_file("file-a");
        dir.remove_batch("batch_1");
        let again = dir.read().unwrap();
        assert_eq!(again.files.len(), 1);
        assert!(again.batches.is_empty());
        let not_dir = tmp.path().join("file-b.data");
        assert!(FilesDir::open(&not_dir).is_err());
        // One server per directory: the second is refused, naming this process.
        let e = FilesDir::open(tmp.path()).unwrap_err().to_string();
        assert!(e.contains("another server uses it"), "{e}");
        assert!(e.contains(&std::process::id().to_string()), "{e}");
        drop(dir);
        FilesDir::open(tmp.path()).expect("free once the first is gone");
    }
}
