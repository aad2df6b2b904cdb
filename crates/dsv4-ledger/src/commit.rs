//! One commit from HEAD's tree plus exactly the ledger's files, built in memory with git2 (the
//! user's index and working tree are not consulted), and the trailers of ledger commits.

use crate::error::LedgerError;
use git2::{FileMode, ObjectType, Oid, Repository};

/// The state of HEAD a ledger commit builds on.
pub enum Base<'r> {
    /// HEAD points at a branch with this tip.
    Branch(git2::Commit<'r>),
    /// HEAD is detached at this commit.
    Detached(git2::Commit<'r>),
    /// HEAD's branch has no commit yet.
    Unborn,
}

impl<'r> Base<'r> {
    /// Inspect HEAD.
    pub fn of(repo: &'r Repository) -> Result<Base<'r>, LedgerError> {
        if repo.head_detached()? {
            return Ok(Base::Detached(repo.head()?.peel_to_commit()?));
        }
        match repo.head() {
            Ok(head) => Ok(Base::Branch(head.peel_to_commit()?)),
            Err(e) if e.code() == git2::ErrorCode::UnbornBranch => Ok(Base::Unborn),
            Err(e) if e.code() == git2::ErrorCode::NotFound => Ok(Base::Unborn),
            Err(e) => Err(e.into()),
        }
    }

    /// The commit, if any.
    pub fn commit(&self) -> Option<&git2::Commit<'r>> {
        match self {
            Base::Branch(c) | Base::Detached(c) => Some(c),
            Base::Unborn => None,
        }
    }

    /// The bytes of `path` in the base commit's tree, if it is a file there.
    pub fn file(&self, repo: &Repository, path: &str) -> Result<Option<Vec<u8>>, LedgerError> {
        let Some(commit) = self.commit() else {
            return Ok(None);
        };
        let tree = commit.tree()?;
        let entry = match tree.get_path(std::path::Path::new(path)) {
            Ok(e) => e,
            Err(e) if e.code() == git2::ErrorCode::NotFound => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        if entry.kind() != Some(ObjectType::Blob) {
            return Ok(None);
        }
        Ok(Some(repo.find_blob(entry.id())?.content().to_vec()))
    }
}

/// Create one commit on HEAD whose tree is the base tree with `files` (repository-relative path,
/// contents) added or replaced; HEAD (its branch, or HEAD itself when detached) moves to it.
pub fn commit_files(
    repo: &Repository,
    base: &Base<'_>,
    files: &[(String, Vec<u8>)],
    message: &str,
) -> Result<Oid, LedgerError> {
    let base_tree = match base.commit() {
        Some(c) => c.tree()?,
        None => repo.find_tree(repo.treebuilder(None)?.write()?)?,
    };
    let mut update = git2::build::TreeUpdateBuilder::new();
    for (path, bytes) in files {
        let blob = repo.blob(bytes)?;
        update.upsert(path.as_str(), blob, FileMode::Blob);
    }
    let tree = repo.find_tree(update.create_updated(repo, &base_tree)?)?;
    let sig = repo.signature()?;
    let parents: Vec<&git2::Commit<'_>> = base.commit().into_iter().collect();
    Ok(repo.commit(Some("HEAD"), &sig, &sig, message, &tree, &parents)?)
}

/// The trailers of a commit message as (key, value) pairs, in order.
pub fn trailers(message: &str) -> Vec<(String, String)> {
    match git2::message_trailers_strs(message) {
        Ok(t) => t
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        Err(_) => Vec::new(),
    }
}
