//! Temporary git repositories for the ledger tests.

use git2::{Repository, Signature};
use std::path::{Path, PathBuf};

/// The test profile: one key set, with a comment the edit must keep.
pub const PROFILE: &str = "# A test profile.\n\n[backend]\nkind = \"cuda-sm120\"\n\n[exec]\n# Side streams.\nmulti_stream_overlap = true # overlap the side streams\n\n[numerics]\nindex_k_dtype = \"bf16\"\n";

/// An A/B bundle as `dsv4 ab` is to write it.
pub const BUNDLE: &str = r#"{"format":"dsv4-ab/1","command":"dsv4 ab --profile prod --set exec.multi_stream_overlap=false",
  "a":{"label":"overlap=true","sessions":200,"failures":12,"ci_low":0.035,"ci_high":0.102,"tokens_per_s":1000.0},
  "b":{"label":"overlap=false","sessions":200,"failures":0,"ci_low":0.0,"ci_high":0.019,"tokens_per_s":959.0},
  "p_value":0.0003,"throughput_delta":-0.041}"#;

/// A repository with `profiles/prod.toml`, `notes.txt` and `other.txt` committed on `main`, and an
/// evidence file outside it.
pub struct Fixture {
    /// Keeps the directories alive.
    pub _dir: tempfile::TempDir,
    /// The working tree.
    pub root: PathBuf,
    /// The A/B bundle (outside the repository).
    pub bundle: PathBuf,
}

impl Fixture {
    /// Set everything up.
    pub fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("repo");
        let repo = Repository::init(&root).unwrap();
        let mut cfg = repo.config().unwrap();
        cfg.set_str("user.name", "Tess Ter").unwrap();
        cfg.set_str("user.email", "tess@example.com").unwrap();
        std::fs::create_dir_all(root.join("profiles")).unwrap();
        std::fs::write(root.join("profiles/prod.toml"), PROFILE).unwrap();
        std::fs::write(root.join("notes.txt"), "notes\n").unwrap();
        std::fs::write(root.join("other.txt"), "other\n").unwrap();
        let mut index = repo.index().unwrap();
        for p in ["profiles/prod.toml", "notes.txt", "other.txt"] {
            index.add_path(Path::new(p)).unwrap();
        }
        index.write().unwrap();
        let tree = repo.find_tree(index.write_tree().unwrap()).unwrap();
        let sig = Signature::now("Tess Ter", "tess@example.com").unwrap();
        repo.commit(Some("HEAD"), &sig, &sig, "initial", &tree, &[])
            .unwrap();
        let bundle = dir.path().join("ab.json");
        std::fs::write(&bundle, BUNDLE).unwrap();
        Fixture {
            _dir: dir,
            root,
            bundle,
        }
    }

    /// The repository.
    pub fn repo(&self) -> Repository {
        Repository::open(&self.root).unwrap()
    }

    /// A validated request to turn overlap off with the bundle as evidence.
    pub fn request(&self) -> dsv4_ledger::RecordRequest {
        dsv4_ledger::RecordRequest {
            profile: Some("prod".into()),
            set: Some("exec.multi_stream_overlap=false".into()),
            from: Some("true".into()),
            evidence: vec![self.bundle.display().to_string()],
            incident: "overlap-corruption".into(),
            status: dsv4_ledger::Status::Validated,
            title: "Turn off multi-stream overlap".into(),
            hypothesis: "Side-stream buffers alias main-stream buffers under graphs".into(),
            supersedes: Vec::new(),
            allow_detached: false,
            date: Some("2026-11-29T19:30:00Z".into()),
        }
    }

    /// Every file under the working tree except .git, with contents, sorted.
    pub fn snapshot(&self) -> Vec<(String, Vec<u8>)> {
        let mut out = Vec::new();
        walk(&self.root, &self.root, &mut out);
        out.sort();
        out
    }

    /// HEAD's commit id.
    pub fn head(&self) -> git2::Oid {
        self.repo().head().unwrap().peel_to_commit().unwrap().id()
    }
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, Vec<u8>)>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.file_name().is_some_and(|n| n == ".git") {
            continue;
        }
        if path.is_dir() {
            walk(root, &path, out);
        } else {
            let rel = path.strip_prefix(root).unwrap().display().to_string();
            out.push((rel, std::fs::read(&path).unwrap()));
        }
    }
}
