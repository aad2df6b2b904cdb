//! OpenAI's Files API store: uploaded batch input files and the output and error files batches
//! write, within `server.files_mib` ([`FileStore`]): in memory, or with `server.files_dir` on
//! disk ([`crate::files_disk`]), read back at start.
//!
//! Uploads are refused while the files fill the budget; a batch's output is always kept (the
//! work is done), so outputs can push the total past it, and then uploads and new batches wait
//! until files are deleted.

use crate::api::common::unix_now;
use crate::error::ApiError;
use crate::files_disk::{FileMeta, FilesDir};
use axum::body::Bytes;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The purposes a file may have: what clients upload, and what batches write.
pub const UPLOAD_PURPOSE: &str = "batch";
/// The purpose of a batch's output and error files.
pub const OUTPUT_PURPOSE: &str = "batch_output";
/// The purpose of a Message Batch's requests, kept as a batch input file the server writes
/// (`POST /v1/messages/batches`); not one of the Files API's files.
pub const MESSAGE_INPUT_PURPOSE: &str = "dsv4_message_batch";
/// The purpose of a Message Batch's output and error files, read back as its results; not one
/// of the Files API's files.
pub const MESSAGE_OUTPUT_PURPOSE: &str = "dsv4_message_batch_output";

/// Whether files of `purpose` are the Files API's (a Message Batch's own files are not listed
/// or served by `/v1/files`).
pub fn is_public(purpose: &str) -> bool {
    purpose == UPLOAD_PURPOSE || purpose == OUTPUT_PURPOSE
}

/// Where a file's bytes are.
#[derive(Debug)]
pub enum Content {
    /// In memory.
    Memory(Bytes),
    /// In `server.files_dir`, `len` bytes.
    Disk {
        /// The file.
        path: PathBuf,
        /// Its length.
        len: usize,
    },
}

impl Content {
    /// The length in bytes.
    pub fn len(&self) -> usize {
        match self {
            Content::Memory(b) => b.len(),
            Content::Disk { len, .. } => *len,
        }
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes (read from disk when they are there: call off the runtime's workers).
    pub fn read(&self) -> std::io::Result<Bytes> {
        match self {
            Content::Memory(b) => Ok(b.clone()),
            Content::Disk { path, .. } => std::fs::read(path).map(Bytes::from),
        }
    }
}

/// One stored file.
#[derive(Debug)]
pub struct StoredFile {
    /// `file-…`.
    pub id: String,
    /// The name it was uploaded with (or the batch output's name).
    pub filename: String,
    /// `batch` or `batch_output` (or a Message Batch's own purposes).
    pub purpose: &'static str,
    /// Unix seconds.
    pub created_at: u64,
    /// When it goes away (Unix seconds), if ever.
    pub expires_at: Option<u64>,
    /// The bytes, or where they are.
    pub content: Content,
}

/// What names a file and when it lives, for keeping one.
#[derive(Debug, Clone)]
pub struct FileInfo {
    /// `file-…`.
    pub id: String,
    /// Its name.
    pub filename: String,
    /// Unix seconds.
    pub created_at: u64,
    /// When it goes away (Unix seconds), if ever.
    pub expires_at: Option<u64>,
}

impl FileInfo {
    /// The metadata kept beside its `bytes` bytes on disk.
    fn meta(&self, purpose: &str, bytes: usize) -> FileMeta {
        FileMeta::new(
            &self.id,
            &self.filename,
            purpose,
            (self.created_at, self.expires_at),
            bytes,
        )
    }

    /// The stored file with `content`.
    fn stored(self, purpose: &'static str, content: Content) -> StoredFile {
        StoredFile {
            id: self.id,
            filename: self.filename,
            purpose,
            created_at: self.created_at,
            expires_at: self.expires_at,
            content,
        }
    }
}

impl StoredFile {
    /// OpenAI's file object.
    pub fn object(&self) -> Value {
        json!({
            "id": self.id,
            "object": "file",
            "bytes": self.content.len(),
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": null,
        })
    }

    /// Whether it has expired at `now` (Unix seconds).
    pub fn expired(&self, now: u64) -> bool {
        self.expires_at.is_some_and(|at| at <= now)
    }
}

/// The files, oldest first, within a byte budget.
#[derive(Debug)]
pub struct FileStore {
    limit: usize,
    disk: Option<FilesDir>,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Files by upload order (a serial), so listing is by age.
    files: BTreeMap<u64, Arc<StoredFile>>,
    next: u64,
    /// Bytes of the files held, and of uploads being written.
    bytes: usize,
}

impl Inner {
    fn add(&mut self, file: StoredFile) -> Arc<StoredFile> {
        let file = Arc::new(file);
        self.files.insert(self.next, file.clone());
        self.next += 1;
        file
    }

    fn find(&self, id: &str) -> Option<(u64, &Arc<StoredFile>)> {
        self.files
            .iter()
            .find(|(_, f)| f.id == id)
            .map(|(k, f)| (*k, f))
    }
}

/// The purpose names a file can have, as the `'static` strings files hold.
fn purpose_of(name: &str) -> Option<&'static str> {
    [
        UPLOAD_PURPOSE,
        OUTPUT_PURPOSE,
        MESSAGE_INPUT_PURPOSE,
        MESSAGE_OUTPUT_PURPOSE,
    ]
    .into_iter()
    .find(|p| *p == name)
}

impl FileStore {
    /// A store of at most `limit` bytes in memory; 0 turns the Files and Batch APIs off.
    pub fn new(limit: usize) -> Self {
        Self {
            limit,
            disk: None,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// A store of at most `limit` bytes in `dir`, with the files a previous run left there;
    /// also what was found of the batches, and the entries left as they were.
    pub fn open(limit: usize, dir: FilesDir) -> std::io::Result<(Self, Vec<Value>, Vec<String>)> {
        let found = dir.read()?;
        let mut skipped = found.skipped;
        let mut inner = Inner::default();
        for (meta, path) in found.files {
            let Some(purpose) = purpose_of(&meta.purpose) else {
                skipped.push(format!("{}: purpose {:?}", path.display(), meta.purpose));
                continue;
            };
            inner.bytes += meta.bytes;
            inner.add(StoredFile {
                id: meta.id,
                filename: meta.filename,
                purpose,
                created_at: meta.created_at,
                expires_at: meta.expires_at,
                content: Content::Disk {
                    path,
                    len: meta.bytes,
                },
            });
        }
        let store = Self {
            limit,
            disk: Some(dir),
            inner: Mutex::new(inner),
        };
        Ok((store, found.batches, skipped))
    }

    /// The directory of `server.files_dir`, when files are kept on disk.
    pub fn disk(&self) -> Option<&FilesDir> {
        self.disk.as_ref()
    }

    /// Whether the Files and Batch APIs are on (`server.files_mib` > 0).
    pub fn enabled(&self) -> bool {
        self.limit > 0
    }

    /// Bytes the files hold.
    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }

    /// Files held.
    pub fn len(&self) -> usize {
        self.lock().files.len()
    }

    /// Whether no file is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// 400 `files_full` unless `more` bytes fit beside the files held (expired files are
    /// forgotten first).
    pub fn check_room(&self, more: usize) -> Result<(), ApiError> {
        self.expire(unix_now());
        let held = self.bytes();
        if held.saturating_add(more) <= self.limit {
            return Ok(());
        }
        Err(self.full(held, more))
    }

    fn full(&self, held: usize, more: usize) -> ApiError {
        ApiError::bad_request(format!(
            "the server's files hold {held} of {} bytes (server.files_mib) and this needs {more} \
             more; delete files (DELETE /v1/files/{{id}}) or ended message batches (DELETE \
             /v1/messages/batches/{{id}}), or raise server.files_mib",
            self.limit
        ))
        .with_code("files_full")
    }

    /// Keep an upload, or 400 `files_full` when it does not fit (500 when the disk refuses it).
    /// Writes to disk with `server.files_dir`: call off the runtime's workers.
    pub fn upload(&self, info: FileInfo, content: Bytes) -> Result<Arc<StoredFile>, ApiError> {
        self.upload_as(info, UPLOAD_PURPOSE, content)
    }

    /// Keep a batch input file of `purpose` ([`UPLOAD_PURPOSE`], or a Message Batch's
    /// [`MESSAGE_INPUT_PURPOSE`]) as [`FileStore::upload`] does.
    pub fn upload_as(
        &self,
        info: FileInfo,
        purpose: &'static str,
        content: Bytes,
    ) -> Result<Arc<StoredFile>, ApiError> {
        self.expire(info.created_at);
        let len = content.len();
        {
            // Reserve the room before writing, so two uploads cannot both take the last of it.
            let mut inner = self.lock();
            if inner.bytes.saturating_add(len) > self.limit {
                let held = inner.bytes;
                drop(inner);
                return Err(self.full(held, len));
            }
            inner.bytes += len;
        }
        match self.keep(info, purpose, content) {
            Ok(file) => Ok(file),
            Err(e) => {
                self.lock().bytes -= len;
                Err(ApiError::internal(format!(
                    "the upload could not be written to server.files_dir: {e}"
                )))
            }
        }
    }

    /// Keep a batch's output or error file in memory (a store without `server.files_dir`;
    /// with one, [`FileStore::adopt_output`]), whatever room is left: the work is done.
    /// `purpose` is [`OUTPUT_PURPOSE`], or [`MESSAGE_OUTPUT_PURPOSE`] for a Message Batch's.
    pub fn put_output(
        &self,
        info: FileInfo,
        purpose: &'static str,
        content: Bytes,
    ) -> Arc<StoredFile> {
        let mut inner = self.lock();
        inner.bytes += content.len();
        inner.add(info.stored(purpose, Content::Memory(content)))
    }

    /// Keep a batch's part file in `server.files_dir` as its output or error file `id`: `None`
    /// when it has no lines (the part is removed). Done again after a stop part-way, it finds
    /// the file already kept or finishes keeping it. Call off the runtime's workers.
    pub fn adopt_output(
        &self,
        info: FileInfo,
        purpose: &'static str,
        part: &Path,
    ) -> std::io::Result<Option<Arc<StoredFile>>> {
        let id = info.id.as_str();
        if let Some((_, file)) = self.lock().find(id) {
            return Ok(Some(file.clone()));
        }
        let Some(dir) = &self.disk else {
            return Err(std::io::Error::other("no server.files_dir to keep it in"));
        };
        let data = dir.data_path(id);
        let len = match std::fs::metadata(part).or_else(|_| std::fs::metadata(&data)) {
            Ok(m) => m.len() as usize,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        if len == 0 {
            let _ = std::fs::remove_file(part);
            return Ok(None);
        }
        let path = dir.adopt(&info.meta(purpose, len), part)?;
        let mut inner = self.lock();
        inner.bytes += len;
        Ok(Some(
            inner.add(info.stored(purpose, Content::Disk { path, len })),
        ))
    }

    /// Write a file where this store keeps them and list it (its bytes are already counted).
    fn keep(
        &self,
        info: FileInfo,
        purpose: &'static str,
        content: Bytes,
    ) -> std::io::Result<Arc<StoredFile>> {
        let content = match &self.disk {
            None => Content::Memory(content),
            Some(dir) => {
                let path = dir.write_file(&info.meta(purpose, content.len()), &content)?;
                Content::Disk {
                    path,
                    len: content.len(),
                }
            }
        };
        Ok(self.lock().add(info.stored(purpose, content)))
    }

    /// A file by id (not one that has expired).
    pub fn get(&self, id: &str) -> Option<Arc<StoredFile>> {
        let now = unix_now();
        self.lock()
            .find(id)
            .map(|(_, f)| f.clone())
            .filter(|f| !f.expired(now))
    }

    /// Forget the files that have expired at `now` (Unix seconds); their ids.
    pub fn expire(&self, now: u64) -> Vec<String> {
        let ids: Vec<String> = self
            .lock()
            .files
            .values()
            .filter(|f| f.expired(now))
            .map(|f| f.id.clone())
            .collect();
        ids.into_iter().filter(|id| self.delete(id)).collect()
    }

    /// Forget a file; whether there was one. A batch reading it keeps its own copy in memory;
    /// on disk, a batch already reading it has read it whole.
    pub fn delete(&self, id: &str) -> bool {
        let mut inner = self.lock();
        let Some((key, _)) = inner.find(id) else {
            return false;
        };
        if let Some(f) = inner.files.remove(&key) {
            inner.bytes -= f.content.len();
        }
        drop(inner);
        if let Some(dir) = &self.disk {
            dir.remove_file(id);
        }
        true
    }

    /// The files of `purpose` (all without one) that have not expired, oldest first.
    pub fn all(&self, purpose: Option<&str>) -> Vec<Arc<StoredFile>> {
        let now = unix_now();
        self.lock()
            .files
            .values()
            .filter(|f| purpose.is_none_or(|p| f.purpose == p) && !f.expired(now))
            .cloned()
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(n: usize) -> Bytes {
        Bytes::from(vec![b'x'; n])
    }

    fn info(id: &str, created_at: u64, expires_at: Option<u64>) -> FileInfo {
        FileInfo {
            id: id.into(),
            filename: format!("{id}.jsonl"),
            created_at,
            expires_at,
        }
    }

    #[test]
    fn uploads_stop_at_the_budget_and_outputs_are_always_kept() {
        let store = FileStore::new(100);
        store.upload(info("file-a", 1, None), bytes(60)).unwrap();
        let e = store
            .upload(info("file-b", 2, None), bytes(41))
            .unwrap_err();
        assert_eq!(e.code.as_deref(), Some("files_full"));
        assert!(e.message.contains("60 of 100 bytes"), "{}", e.message);
        store.upload(info("file-b", 2, None), bytes(40)).unwrap();
        store.put_output(info("file-o", 3, None), OUTPUT_PURPOSE, bytes(50));
        assert_eq!(store.bytes(), 150);
        assert!(store.check_room(0).is_err());
        assert!(store.delete("file-o"));
        assert!(!store.delete("file-o"));
        assert_eq!(store.bytes(), 100);
        assert!(store.check_room(0).is_ok());
        assert_eq!(store.get("file-a").unwrap().content.len(), 60);
    }

    #[test]
    fn files_list_by_age_and_purpose() {
        let store = FileStore::new(1000);
        for i in 0..3 {
            store
                .upload(info(&format!("file-{i}"), i, None), bytes(1))
                .unwrap();
        }
        store.put_output(info("file-out", 9, None), OUTPUT_PURPOSE, bytes(1));
        let ids =
            |v: Vec<Arc<StoredFile>>| -> Vec<String> { v.iter().map(|f| f.id.clone()).collect() };
        assert_eq!(
            ids(store.all(None)),
            ["file-0", "file-1", "file-2", "file-out"]
        );
        assert_eq!(ids(store.all(Some("batch_output"))), ["file-out"]);
        assert_eq!(store.all(Some("batch")).len(), 3);
    }

    #[test]
    fn expired_files_are_not_served_and_are_forgotten() {
        let store = FileStore::new(100);
        store.upload(info("file-a", 1, None), bytes(5)).unwrap();
        // Expired long ago by the clock, but kept until swept.
        store.upload(info("file-x", 1, Some(10)), bytes(7)).unwrap();
        store.put_output(info("file-o", 2, Some(11)), OUTPUT_PURPOSE, bytes(3));
        assert!(
            store.get("file-x").is_none(),
            "an expired file is not served"
        );
        assert_eq!(store.all(None).len(), 1);
        assert_eq!(store.bytes(), 15);
        assert!(store.expire(9).is_empty());
        assert_eq!(store.expire(10), ["file-x"]);
        assert_eq!(store.expire(20), ["file-o"]);
        assert_eq!(store.bytes(), 5);
        assert_eq!(store.len(), 1);
        let o = store.put_output(info("file-p", 2, Some(3600)), OUTPUT_PURPOSE, bytes(1));
        assert_eq!(o.object()["expires_at"], 3600);
        assert_eq!(
            store.get("file-a").unwrap().object()["expires_at"],
            Value::Null
        );
    }
}
