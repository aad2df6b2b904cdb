//! Stored responses on disk (`server.responses_dir`), so `previous_response_id` and `GET
//! /v1/responses/{id}` survive a restart. Each stored response is one file, `{id}.json`,
//! written (through a temporary file and a rename) when it is stored: its response object, its
//! own turn, its input items and the id of the response it continues. A file lives exactly as
//! long as its response does in memory: when the store drops a response that a newer one still
//! continues, the file stays, marked unlisted (it only serves that chain), and when the last
//! reference goes it is deleted. On start the directory is read back into the store, oldest
//! first, under the same limits; unlisted files nothing continues any more are deleted, and a
//! file that cannot be read (or whose chain is incomplete) is left as it is and reported.
//! A background response created with `stream` keeps its events in its file too, written again
//! once its last event is recorded, so `GET /v1/responses/{id}?stream=true` replays them after
//! a restart.

use crate::api::responses_input::ChatMessages;
use crate::files_disk::{DirLock, valid_id, write_atomic};
use crate::responses_background::Background;
use crate::responses_store::Stored;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// The `format` of a stored response's file.
const FORMAT: &str = "dsv4-stored-response/1";

/// The directory stored responses are kept in, locked for this server while it lives.
#[derive(Debug)]
pub struct Disk {
    dir: PathBuf,
    _lock: DirLock,
    /// Set when the store is dropped (the server stops): files then stay.
    closing: AtomicBool,
}

/// A stored response's file: deleted when the response's last reference goes, unless the
/// store is closing.
#[derive(Debug)]
pub struct DiskFile {
    disk: Arc<Disk>,
    id: String,
}

impl DiskFile {
    /// The response's id (its file's name).
    pub fn id(&self) -> &str {
        &self.id
    }
}

impl Drop for DiskFile {
    fn drop(&mut self) {
        if !self.disk.closing.load(Ordering::SeqCst) {
            self.disk.delete(&self.id);
        }
    }
}

/// One file's contents.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Record {
    format: String,
    id: String,
    /// Whether `GET /v1/responses/{id}` finds it (false: kept only for a newer response's
    /// conversation).
    listed: bool,
    previous: Option<String>,
    response: Value,
    turn: Value,
    input_items: Vec<Value>,
    /// A streamed background response's events, `(type, data)` in sequence order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    events: Option<Vec<(String, String)>>,
}

/// What reading the directory found.
#[derive(Debug, Default)]
pub struct Read {
    /// The listed responses, oldest first (by `created_at`, then id).
    pub listed: Vec<(String, Arc<Stored>)>,
    /// Files left as they were: unreadable, or continuing a response whose file is missing.
    pub skipped: Vec<String>,
}

/// The id of a stored response: its file's, else its response object's.
pub fn id_of(s: &Stored) -> Option<String> {
    s.file
        .as_ref()
        .map(|f| f.id.clone())
        .or_else(|| s.response["id"].as_str().map(String::from))
}

impl Disk {
    /// Use `dir` (created if missing) for stored responses.
    pub fn open(dir: &Path) -> std::io::Result<Arc<Self>> {
        if dir.exists() && !dir.is_dir() {
            return Err(std::io::Error::other("it exists and is not a directory"));
        }
        std::fs::create_dir_all(dir)?;
        Ok(Arc::new(Self {
            dir: dir.to_owned(),
            _lock: DirLock::take(dir, ".dsv4-responses.lock")?,
            closing: AtomicBool::new(false),
        }))
    }

    /// The server stops: keep every file from now on.
    pub fn close(&self) {
        self.closing.store(true, Ordering::SeqCst);
    }

    fn path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    fn delete(&self, id: &str) {
        if let Err(e) = std::fs::remove_file(self.path(id))
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(id, error = %e, "server.responses_dir: cannot delete a stored response");
        }
    }

    /// The file handle of `id`, whose file exists.
    pub fn file(self: &Arc<Self>, id: &str) -> DiskFile {
        DiskFile {
            disk: Arc::clone(self),
            id: id.to_owned(),
        }
    }

    /// Write `stored` as `id` (`listed`: found by id); whether it was written (a failure is
    /// logged: the response is then kept in memory only).
    pub fn save(&self, id: &str, stored: &Stored, listed: bool) -> bool {
        if !valid_id(id) {
            tracing::warn!(
                id,
                "server.responses_dir: not a file name; kept in memory only"
            );
            return false;
        }
        let record = Record {
            format: FORMAT.into(),
            id: id.into(),
            listed,
            previous: stored.previous.as_deref().and_then(id_of),
            response: stored.response.clone(),
            turn: stored.turn.to_json(),
            input_items: stored.input_items.as_ref().clone(),
            events: stored
                .events
                .as_ref()
                .filter(|bg| bg.keeps_events())
                .map(|bg| bg.events_from(0).events),
        };
        let written = serde_json::to_vec(&record)
            .map_err(std::io::Error::other)
            .and_then(|bytes| write_atomic(&self.path(id), &bytes));
        if let Err(e) = &written {
            tracing::warn!(id, error = %e, "server.responses_dir: cannot write a stored response; kept in memory only");
        }
        written.is_ok()
    }

    /// Read every stored response back: the listed ones oldest first, each with the chain it
    /// continues. Leftover temporary files are deleted.
    pub fn read(self: &Arc<Self>) -> std::io::Result<Read> {
        let mut out = Read::default();
        let mut records: HashMap<String, (Record, ChatMessages)> = HashMap::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let path = entry?.path();
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            if name.ends_with(".json.tmp") {
                let _ = std::fs::remove_file(&path);
                continue;
            }
            let Some(stem) = name.strip_suffix(".json") else {
                continue;
            };
            let record = std::fs::read(&path)
                .ok()
                .and_then(|bytes| serde_json::from_slice::<Record>(&bytes).ok())
                .filter(|r| r.format == FORMAT && r.id == stem && valid_id(stem));
            match record.and_then(|r| ChatMessages::from_json(&r.turn).map(|t| (r, t))) {
                Some((r, turn)) => {
                    records.insert(stem.to_owned(), (r, turn));
                }
                None => out.skipped.push(name.to_owned()),
            }
        }
        let mut built: HashMap<String, Arc<Stored>> = HashMap::new();
        let mut broken: HashSet<String> = HashSet::new();
        let mut ids: Vec<String> = records.keys().cloned().collect();
        ids.sort();
        for id in &ids {
            // The chain back to a response already built (or the first of it), newest first.
            let mut chain = Vec::new();
            let mut at = Some(id.clone());
            let whole = loop {
                match at {
                    None => break true,
                    Some(a) if built.contains_key(&a) => break true,
                    Some(a) if broken.contains(&a) || chain.contains(&a) => break false,
                    Some(a) => match records.get(&a) {
                        None => break false,
                        Some((r, _)) => {
                            at = r.previous.clone();
                            chain.push(a);
                        }
                    },
                }
            };
            if !whole {
                broken.extend(chain);
                continue;
            }
            for a in chain.into_iter().rev() {
                let (r, turn) = &records[&a];
                let input_items = Arc::new(r.input_items.clone());
                let stored = Stored {
                    response: r.response.clone(),
                    previous: r.previous.as_ref().map(|p| Arc::clone(&built[p])),
                    turn: turn.clone(),
                    events: r.events.clone().map(|events| {
                        Arc::new(Background::restored(
                            r.response.clone(),
                            events,
                            Arc::clone(&input_items),
                        ))
                    }),
                    input_items,
                    file: Some(self.file(&a)),
                };
                built.insert(a, Arc::new(stored));
            }
        }
        let mut broken: Vec<String> = broken.into_iter().map(|id| format!("{id}.json")).collect();
        broken.sort();
        out.skipped.extend(broken);
        let created = |s: &Stored| s.response["created_at"].as_i64().unwrap_or(0);
        let mut listed: Vec<(String, Arc<Stored>)> = built
            .iter()
            .filter(|(id, _)| records[*id].0.listed)
            .map(|(id, s)| (id.clone(), Arc::clone(s)))
            .collect();
        listed.sort_by(|a, b| created(&a.1).cmp(&created(&b.1)).then(a.0.cmp(&b.0)));
        out.listed = listed;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use crate::responses_store::{ResponseStore, Stored};
    use dsv4_chat::pyjson::OrderedJson;
    use serde_json::{Value, json};
    use std::path::Path;
    use std::sync::Arc;

    /// A stored response `id` (created at `t`) continuing `previous`, whose turn is one user
    /// message `text`.
    fn stored(id: &str, t: i64, previous: Option<Arc<Stored>>, text: &str) -> Stored {
        let mut turn = crate::api::responses_input::ChatMessages::default();
        let msg = OrderedJson::parse(&json!({"role": "user", "content": text}).to_string());
        turn.push(msg.unwrap(), "input");
        Stored {
            response: json!({"id": id, "created_at": t, "output": [{"text": text}]}),
            previous,
            turn,
            input_items: Arc::new(vec![json!({"id": format!("msg_{id}"), "text": text})]),
            events: None,
            file: None,
        }
    }

    fn texts(s: &Stored) -> Vec<String> {
        s.conversation()
            .messages
            .iter()
            .map(|m| m.get("content").unwrap().as_str().unwrap().to_string())
            .collect()
    }

    /// The directory's entries but the server's lock file.
    fn files(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n != ".dsv4-responses.lock")
            .collect();
        names.sort();
        names
    }

    fn open(dir: &Path, capacity: usize) -> ResponseStore {
        let (store, skipped) = ResponseStore::open(capacity, usize::MAX, dir).unwrap();
        assert!(skipped.is_empty(), "{skipped:?}");
        store
    }

    #[test]
    fn responses_and_their_chains_survive_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = open(dir.path(), 2);
            store.insert("resp_a".into(), stored("resp_a", 1, None, "one"));
            let a = store.get("resp_a").unwrap();
            store.insert("resp_b".into(), stored("resp_b", 2, Some(a), "two"));
            let b = store.get("resp_b").unwrap();
            store.insert("resp_c".into(), stored("resp_c", 3, Some(b), "three"));
            // a left the store but c's conversation still needs it: its file stays.
            assert!(store.get("resp_a").is_none());
            assert_eq!(files(dir.path()).len(), 3);
        }
        let store = open(dir.path(), 2);
        assert_eq!(store.len(), 2);
        assert!(
            store.get("resp_a").is_none(),
            "a was not listed; it stays unlisted"
        );
        let c = store.get("resp_c").unwrap();
        assert_eq!(texts(&c), ["one", "two", "three"]);
        assert_eq!(c.response["output"][0]["text"], "three");
        assert_eq!(c.input_items[0]["id"], "msg_resp_c");
        assert_eq!(texts(&store.get("resp_b").unwrap()), ["one", "two"]);

        // Deleting c keeps b (listed) and a (b continues it); deleting b then frees a too.
        drop(c);
        assert!(store.remove("resp_c"));
        assert_eq!(files(dir.path()), ["resp_a.json", "resp_b.json"]);
        assert!(store.remove("resp_b"));
        assert!(files(dir.path()).is_empty(), "{:?}", files(dir.path()));
    }

    #[test]
    fn a_streamed_background_response_keeps_every_event_across_a_restart() {
        use crate::responses_background::Background;
        use crate::responses_store::Found;
        let dir = tempfile::tempdir().unwrap();
        let events = |bg: &Background| bg.events_from(0).events;
        let before = {
            let store = open(dir.path(), 4);
            let bg = Arc::new(Background::new(
                json!({"id": "resp_s"}),
                true,
                Arc::default(),
            ));
            store
                .start_background("resp_s".into(), Arc::clone(&bg))
                .unwrap();
            bg.record("response.created", &json!({"sequence_number": 0}));
            bg.record("response.output_text.delta", &json!({"delta": "hi"}));
            let mut s = stored("resp_s", 1, None, "hi");
            s.events = Some(Arc::clone(&bg));
            store.insert("resp_s".into(), s);
            // The last event comes after the response is stored, as the route records it.
            bg.record("response.completed", &json!({"sequence_number": 2}));
            bg.finish(json!({"id": "resp_s", "status": "completed"}));
            store.end_background("resp_s");
            events(&bg)
        };
        assert_eq!(before.len(), 3);
        let store = open(dir.path(), 4);
        let Some(Found::Stored(s)) = store.find("resp_s") else {
            panic!("read back");
        };
        let bg = s.events.as_ref().expect("its events read back");
        assert!(bg.keeps_events() && bg.is_done());
        assert_eq!(events(bg), before, "every event, in order");
        assert_eq!(bg.events_from(2).events, before[2..]);
    }

    #[test]
    fn a_deleted_response_that_a_newer_one_continues_stays_unlisted() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = open(dir.path(), 8);
            store.insert("resp_a".into(), stored("resp_a", 1, None, "one"));
            let a = store.get("resp_a").unwrap();
            store.insert("resp_b".into(), stored("resp_b", 2, Some(a), "two"));
            assert!(store.remove("resp_a"));
        }
        let store = open(dir.path(), 8);
        assert!(
            store.get("resp_a").is_none(),
            "a deleted response is not found again"
        );
        assert_eq!(texts(&store.get("resp_b").unwrap()), ["one", "two"]);
        assert_eq!(store.len(), 1);
    }

    #[test]
    fn a_restart_keeps_the_newest_within_the_limits() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = open(dir.path(), 8);
            for (k, id) in ["resp_a", "resp_b", "resp_c"].into_iter().enumerate() {
                store.insert(id.into(), stored(id, k as i64, None, id));
            }
        }
        let store = open(dir.path(), 2);
        assert!(
            store.get("resp_a").is_none(),
            "the oldest goes past the capacity"
        );
        assert!(store.get("resp_b").is_some() && store.get("resp_c").is_some());
        assert_eq!(files(dir.path()), ["resp_b.json", "resp_c.json"]);
    }

    #[test]
    fn unreadable_files_and_broken_chains_are_left_and_reported() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = open(dir.path(), 8);
            store.insert("resp_a".into(), stored("resp_a", 1, None, "one"));
            let a = store.get("resp_a").unwrap();
            store.insert("resp_b".into(), stored("resp_b", 2, Some(a), "two"));
            store.insert("resp_z".into(), stored("resp_z", 3, None, "alone"));
        }
        // b's predecessor is gone, a file is cut short, another is not ours, a write was cut.
        std::fs::remove_file(dir.path().join("resp_a.json")).unwrap();
        let z = std::fs::read(dir.path().join("resp_z.json")).unwrap();
        std::fs::write(dir.path().join("resp_y.json"), &z[..z.len() / 2]).unwrap();
        std::fs::write(dir.path().join("notes.txt"), "mine").unwrap();
        std::fs::write(dir.path().join("resp_x.json.tmp"), "{").unwrap();
        let (store, skipped) = ResponseStore::open(8, usize::MAX, dir.path()).unwrap();
        assert_eq!(skipped, ["resp_y.json", "resp_b.json"]);
        assert_eq!(store.len(), 1);
        assert_eq!(texts(&store.get("resp_z").unwrap()), ["alone"]);
        // Nothing of the user's is deleted; the cut temporary file is.
        assert_eq!(
            files(dir.path()),
            ["notes.txt", "resp_b.json", "resp_y.json", "resp_z.json"]
        );
        let _: Value = serde_json::from_slice(&z).unwrap();
    }

    #[test]
    fn a_directory_that_cannot_be_made_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a-file");
        std::fs::write(&file, "x").unwrap();
        assert!(ResponseStore::open(8, usize::MAX, &file).is_err());
        assert!(ResponseStore::open(8, usize::MAX, &file.join("below")).is_err());
    }
}
