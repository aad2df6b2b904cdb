//! The prefix cache: a radix tree over whole pages of tokens whose nodes hold snapshots of a
//! sequence's complete state at that page boundary. DSV4 needs more than the compressed entries
//! to continue a prefix — the SWA window and the compressor rings at the boundary — so a node
//! keeps the whole [`SequenceState`] (sharing every page with its source by reference count;
//! whoever writes a shared page copies it first). A prefix is reused only where a snapshot
//! exists.

use dsv4_model::SequenceState;
use std::collections::BTreeMap;

struct Node {
    parent: usize,
    key: Vec<u32>,
    children: BTreeMap<Vec<u32>, usize>,
    snapshot: Option<SequenceState>,
    last_used: u64,
}

/// Snapshots of sequence states at page boundaries, found by their token prefix.
pub struct PrefixCache {
    page: usize,
    nodes: Vec<Option<Node>>,
    free_nodes: Vec<usize>,
    clock: u64,
    snapshots: usize,
}

const ROOT: usize = 0;

impl PrefixCache {
    /// An empty cache over pages of `page` tokens.
    pub fn new(page: usize) -> Self {
        Self {
            page,
            nodes: vec![Some(Node {
                parent: ROOT,
                key: Vec::new(),
                children: BTreeMap::new(),
                snapshot: None,
                last_used: 0,
            })],
            free_nodes: Vec::new(),
            clock: 0,
            snapshots: 0,
        }
    }

    /// Tokens per page.
    pub fn page_size(&self) -> usize {
        self.page
    }

    /// Snapshots held.
    pub fn snapshots(&self) -> usize {
        self.snapshots
    }

    fn node(&self, i: usize) -> &Node {
        self.nodes[i].as_ref().expect("live node index")
    }

    fn node_mut(&mut self, i: usize) -> &mut Node {
        self.nodes[i].as_mut().expect("live node index")
    }

    /// The deepest node with a snapshot along `tokens`, covering at most `limit` tokens.
    fn deepest(&self, tokens: &[u32], limit: usize) -> Option<(usize, usize)> {
        let mut at = ROOT;
        let mut best = None;
        let mut len = 0;
        while len + self.page <= limit.min(tokens.len()) {
            let Some(&child) = self.node(at).children.get(&tokens[len..len + self.page]) else {
                break;
            };
            at = child;
            len += self.page;
            if self.node(at).snapshot.is_some() {
                best = Some((len, at));
            }
        }
        best
    }

    /// Tokens of the longest cached prefix of `tokens` no longer than `limit`.
    pub fn match_len(&self, tokens: &[u32], limit: usize) -> usize {
        self.deepest(tokens, limit).map_or(0, |(len, _)| len)
    }

    /// The longest cached prefix of `tokens` no longer than `limit`: its length and a state
    /// that continues it (sharing the snapshot's pages).
    pub fn lookup(&mut self, tokens: &[u32], limit: usize) -> Option<(usize, SequenceState)> {
        let (len, at) = self.deepest(tokens, limit)?;
        self.clock += 1;
        let clock = self.clock;
        let node = self.node_mut(at);
        node.last_used = clock;
        node.snapshot.clone().map(|s| (len, s))
    }

    /// Keep a snapshot of `state`, which has processed exactly `tokens` (a whole number of
    /// pages); an existing snapshot of the same prefix is kept and only marked as used.
    pub fn insert(&mut self, tokens: &[u32], state: &SequenceState) {
        debug_assert_eq!(state.pos, tokens.len());
        if tokens.is_empty() || !tokens.len().is_multiple_of(self.page) {
            return;
        }
        let mut at = ROOT;
        for key in tokens.chunks(self.page) {
            at = match self.node(at).children.get(key) {
                Some(&c) => c,
                None => {
                    let node = Node {
                        parent: at,
                        key: key.to_vec(),
                        children: BTreeMap::new(),
                        snapshot: None,
                        last_used: 0,
                    };
                    let id = match self.free_nodes.pop() {
                        Some(id) => {
                            self.nodes[id] = Some(node);
                            id
                        }
                        None => {
                            self.nodes.push(Some(node));
                            self.nodes.len() - 1
                        }
                    };
                    self.node_mut(at).children.insert(key.to_vec(), id);
                    id
                }
            };
        }
        self.clock += 1;
        let clock = self.clock;
        let node = self.node_mut(at);
        node.last_used = clock;
        if node.snapshot.is_none() {
            node.snapshot = Some(state.clone());
            self.snapshots += 1;
        }
    }

    /// Drop the least recently used snapshot (its pages are freed unless still shared);
    /// false when there is none.
    pub fn evict_lru(&mut self) -> bool {
        let victim = self
            .nodes
            .iter()
            .enumerate()
            .filter_map(|(i, n)| {
                n.as_ref()
                    .filter(|n| n.snapshot.is_some())
                    .map(|n| (n.last_used, i))
            })
            .min();
        let Some((_, mut at)) = victim else {
            return false;
        };
        self.node_mut(at).snapshot = None;
        self.snapshots -= 1;
        // Prune nodes left without snapshot and children.
        while at != ROOT {
            let n = self.node(at);
            if n.snapshot.is_some() || !n.children.is_empty() {
                break;
            }
            let (parent, key) = (n.parent, n.key.clone());
            self.node_mut(parent).children.remove(&key);
            self.nodes[at] = None;
            self.free_nodes.push(at);
            at = parent;
        }
        true
    }

    /// Drop every snapshot.
    pub fn clear(&mut self) {
        while self.evict_lru() {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(pos: usize) -> SequenceState {
        SequenceState {
            pos,
            layers: Vec::new(),
        }
    }

    #[test]
    fn finds_the_longest_snapshotted_whole_page_prefix() {
        let mut c = PrefixCache::new(2);
        c.insert(&[1, 2], &state(2));
        c.insert(&[1, 2, 3, 4, 5, 6], &state(6));
        assert_eq!(c.snapshots(), 2);
        assert_eq!(c.match_len(&[1, 2, 3, 4, 5, 6, 7], 99), 6);
        assert_eq!(
            c.match_len(&[1, 2, 3, 4, 5, 6, 7], 5),
            2,
            "limit caps the match"
        );
        assert_eq!(
            c.match_len(&[1, 2, 3, 9], 99),
            2,
            "[1,2,3,4] has no snapshot"
        );
        assert_eq!(c.match_len(&[2, 2], 99), 0);
        let (len, st) = c.lookup(&[1, 2, 3, 4, 5, 6], 99).unwrap();
        assert_eq!((len, st.pos), (6, 6));
        c.insert(&[1, 2, 3], &state(3));
        assert_eq!(c.snapshots(), 2, "partial pages are not cached");
    }

    #[test]
    fn evicts_least_recently_used_and_prunes_empty_nodes() {
        let mut c = PrefixCache::new(1);
        c.insert(&[1], &state(1));
        c.insert(&[1, 2], &state(2));
        c.insert(&[3], &state(1));
        assert!(c.lookup(&[1], 1).is_some());
        assert!(c.evict_lru());
        assert_eq!(c.match_len(&[1, 2], 9), 1, "[1, 2] was least recently used");
        assert_eq!(c.match_len(&[3], 9), 1);
        c.clear();
        assert_eq!(c.snapshots(), 0);
        assert!(!c.evict_lru());
        assert_eq!(c.nodes.iter().flatten().count(), 1, "only the root is left");
    }
}
