//! The prefix cache: a radix tree over whole pages of tokens whose nodes hold snapshots of a
//! sequence's complete state at that page boundary. DSV4 needs more than the compressed entries
//! to continue a prefix — the SWA window and the compressor rings at the boundary — so a node
//! keeps the whole [`SequenceState`] (sharing every page with its source by reference count;
//! whoever writes a shared page copies it first). A prefix is reused only where a snapshot
//! exists. With a host tier, an evicted snapshot may move to host pages instead of being
//! dropped (see [`crate::hicache`]); a node then says where its snapshot lives.

use dsv4_model::SequenceState;
use std::collections::BTreeMap;

struct Node {
    parent: usize,
    key: Vec<u32>,
    children: BTreeMap<Vec<u32>, usize>,
    snapshot: Option<SequenceState>,
    /// The snapshot's pages are in the host tier.
    on_host: bool,
    last_used: u64,
}

/// A prefix hit: the cached length, a state sharing the snapshot's pages, the node and
/// whether the snapshot lives in the host tier.
pub struct Hit {
    /// Tokens of the cached prefix.
    pub len: usize,
    /// A state continuing the prefix (sharing the snapshot's pages).
    pub state: SequenceState,
    /// The node holding the snapshot.
    pub node: usize,
    /// The snapshot's pages are in the host tier (they must be loaded back before use).
    pub on_host: bool,
}

/// What spilling a snapshot to the host tier did.
pub enum Spill {
    /// The state now names host pages.
    Done,
    /// The host tier has no room for it now.
    NoRoom,
    /// The state's pages cannot be spilled (they are not in the engine's pools).
    Unsupported,
}

/// Snapshots of sequence states at page boundaries, found by their token prefix.
pub struct PrefixCache {
    page: usize,
    nodes: Vec<Option<Node>>,
    free_nodes: Vec<usize>,
    clock: u64,
    snapshots: usize,
    host_snapshots: usize,
    host_dropped: u64,
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
                on_host: false,
                last_used: 0,
            })],
            free_nodes: Vec::new(),
            clock: 0,
            snapshots: 0,
            host_snapshots: 0,
            host_dropped: 0,
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
        self.lookup_node(tokens, limit).map(|h| (h.len, h.state))
    }

    /// [`Self::lookup`], also naming the node and whether its snapshot is in the host tier.
    pub fn lookup_node(&mut self, tokens: &[u32], limit: usize) -> Option<Hit> {
        let (len, at) = self.deepest(tokens, limit)?;
        self.clock += 1;
        let clock = self.clock;
        let node = self.node_mut(at);
        node.last_used = clock;
        let on_host = node.on_host;
        node.snapshot.clone().map(|state| Hit {
            len,
            state,
            node: at,
            on_host,
        })
    }

    /// Snapshots held in the host tier.
    pub fn host_snapshots(&self) -> usize {
        self.host_snapshots
    }

    /// Host snapshots dropped so far to make room in the host tier.
    pub fn host_dropped(&self) -> u64 {
        self.host_dropped
    }

    /// Node `node`'s host snapshot was loaded back as `state`: keep that instead (nothing
    /// happens when the node no longer holds a host snapshot).
    pub fn promote(&mut self, node: usize, state: &SequenceState) {
        let Some(Some(n)) = self.nodes.get_mut(node) else {
            return;
        };
        if n.on_host && n.snapshot.is_some() {
            n.snapshot = Some(state.clone());
            n.on_host = false;
            self.host_snapshots -= 1;
        }
    }

    /// Move the least recently used device snapshot to the host tier with `spill`, dropping
    /// the least recently used host snapshots while the tier has no room (the snapshot itself
    /// is dropped when it cannot be spilled); false when there is no device snapshot.
    pub fn evict_lru_with(&mut self, spill: &mut dyn FnMut(&mut SequenceState) -> Spill) -> bool {
        let Some(at) = self.lru(false) else {
            return false;
        };
        // Spill a copy so that the node keeps its snapshot (and is not pruned) meanwhile.
        let Some(mut st) = self.node(at).snapshot.clone() else {
            return false;
        };
        loop {
            match spill(&mut st) {
                Spill::Done => {
                    let n = self.node_mut(at);
                    n.snapshot = Some(st);
                    n.on_host = true;
                    self.host_snapshots += 1;
                    return true;
                }
                Spill::NoRoom if self.drop_at(self.lru(true)) => self.host_dropped += 1,
                Spill::NoRoom | Spill::Unsupported => {
                    drop(st);
                    return self.drop_at(Some(at));
                }
            }
        }
    }

    /// The least recently used snapshot in the host tier (`host`) or on the device.
    fn lru(&self, host: bool) -> Option<usize> {
        self.nodes
            .iter()
            .enumerate()
            .filter_map(|(i, n)| {
                n.as_ref()
                    .filter(|n| n.snapshot.is_some() && n.on_host == host)
                    .map(|n| (n.last_used, i))
            })
            .min()
            .map(|(_, i)| i)
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
                        on_host: false,
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
        self.drop_at(victim.map(|(_, i)| i))
    }

    /// Drop node `at`'s snapshot and prune; false for None.
    fn drop_at(&mut self, at: Option<usize>) -> bool {
        let Some(mut at) = at else {
            return false;
        };
        let n = self.node_mut(at);
        let on_host = std::mem::replace(&mut n.on_host, false);
        n.snapshot = None;
        self.snapshots -= 1;
        if on_host {
            self.host_snapshots -= 1;
        }
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
    fn evicted_snapshots_move_to_the_host_tier_and_are_promoted_when_loaded_back() {
        let mut c = PrefixCache::new(1);
        c.insert(&[1], &state(1));
        c.insert(&[2], &state(1));
        let room = std::cell::Cell::new(1);
        let mut spill = |_: &mut SequenceState| {
            if room.get() == 0 {
                return Spill::NoRoom;
            }
            room.set(room.get() - 1);
            Spill::Done
        };
        assert!(c.evict_lru_with(&mut spill), "[1] moves to the host tier");
        assert_eq!((c.snapshots(), c.host_snapshots()), (2, 1));
        let hit = c.lookup_node(&[1], 1).unwrap();
        assert!(hit.on_host && hit.len == 1);
        assert!(!c.lookup_node(&[2], 1).unwrap().on_host);
        assert!(
            c.evict_lru_with(&mut spill),
            "[2] finds no host room: the host LRU ([1]) goes, then [2] itself"
        );
        assert_eq!(
            (c.snapshots(), c.host_snapshots(), c.host_dropped()),
            (0, 0, 1)
        );
        assert!(!c.evict_lru_with(&mut spill), "no device snapshot is left");
        c.insert(&[3], &state(1));
        room.set(1);
        assert!(c.evict_lru_with(&mut spill));
        let hit = c.lookup_node(&[3], 1).unwrap();
        assert!(hit.on_host);
        c.promote(hit.node, &state(1));
        assert_eq!((c.snapshots(), c.host_snapshots()), (1, 0));
        assert!(!c.lookup_node(&[3], 1).unwrap().on_host, "loaded back");
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
