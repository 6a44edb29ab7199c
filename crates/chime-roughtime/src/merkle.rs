//! The Merkle tree that lets one signature cover a batch of requests.
//!
//! `H(x)` is SHA-512 truncated to the tree's hash size (32 bytes; Google uses all 64), or for
//! draft 07 SHA-512/256, which differs from truncated SHA-512 in its initial value
//! ([`TreeHash`]). A leaf is `H(0x00 ‖ data)`, an inner node `H(0x01 ‖ left ‖ right)` (RFC
//! 10049 §5.3). A level of odd width pairs its last node with an all-zero hash (as
//! roughenough-server does), so every leaf's path has the same length, ⌈log₂ n⌉. Not with
//! itself: `H(0x01 ‖ h ‖ h)` is the same whichever side `h` is on, so that leaf's INDX bit at
//! that level could be flipped and the reply would still verify.
//!
//! Paths follow the rule of draft 16 and the RFC (drafts 10–15 printed it backwards; every
//! implementation follows the fixed rule): for each INDX bit, least significant first, bit 0
//! means the current hash is the left child, `h = H(0x01 ‖ h ‖ node)`, bit 1 means
//! `h = H(0x01 ‖ node ‖ h)`; INDX bits left over after the path must be 0.
//!
//! [`MerkleTree`] has a fixed capacity and allocates only when it is created, so a server worker
//! can rebuild it for every batch without touching the allocator. It hashes eight leaves, then
//! eight nodes of a level, at a time (`chime_sha512::Lanes`): a batch's hashing is most of its
//! cost, and eight SHA-512s in the lanes of one AVX-512 register cost about what two do one by
//! one.

use chime_sha512::{LANES, Lanes};

/// The hash a tree is built with: SHA-512 (cut to the tree's hash size) for every version but
/// draft 07, which uses SHA-512/256.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TreeHash {
    /// SHA-512, truncated to the tree's hash size.
    #[default]
    Sha512,
    /// SHA-512/256 (FIPS 180-4 §5.3.6.2): draft 07's.
    Sha512_256,
}

impl TreeHash {
    /// The member of the SHA-512 family the lanes compute for it.
    const fn variant(self) -> chime_sha512::Variant {
        match self {
            Self::Sha512 => chime_sha512::Variant::Sha512,
            Self::Sha512_256 => chime_sha512::Variant::Sha512_256,
        }
    }
}

/// Most hashes a PATH may hold (RFC 10049 §5.2.4).
pub const MAX_PATH_HASHES: usize = 32;

/// SHA-512 of the concatenation of `parts`, truncated to `H` bytes.
pub fn hash<const H: usize>(parts: &[&[u8]]) -> [u8; H] {
    hash_with(TreeHash::Sha512, parts)
}

/// `tree_hash` of the concatenation of `parts`, truncated to `H` bytes (SHA-512/256 has 32).
pub fn hash_with<const H: usize>(tree_hash: TreeHash, parts: &[&[u8]]) -> [u8; H] {
    match tree_hash {
        TreeHash::Sha512_256 => truncate(&chime_sha512::digest_512_256(parts)),
        TreeHash::Sha512 => truncate(&chime_sha512::digest(parts)),
    }
}

/// The first `H` bytes of a digest. H is 32 or 64 in this crate; an H larger than the digest
/// would leave zeros rather than panic.
fn truncate<const H: usize, const N: usize>(full: &[u8; N]) -> [u8; H] {
    let mut out = [0u8; H];
    let n = H.min(N);
    out[..n].copy_from_slice(&full[..n]);
    out
}

/// A leaf: `H(0x00 ‖ data)`, with SHA-512.
pub fn hash_leaf<const H: usize>(data: &[u8]) -> [u8; H] {
    hash_leaf_with(TreeHash::Sha512, data)
}

/// A leaf: `H(0x00 ‖ data)`, with `tree_hash`.
pub fn hash_leaf_with<const H: usize>(tree_hash: TreeHash, data: &[u8]) -> [u8; H] {
    hash_with(tree_hash, &[&[0x00], data])
}

/// An inner node: `H(0x01 ‖ left ‖ right)`, with `tree_hash`.
pub fn hash_node_with<const H: usize>(
    tree_hash: TreeHash,
    left: &[u8; H],
    right: &[u8; H],
) -> [u8; H] {
    hash_with(tree_hash, &[&[0x01], left, right])
}

/// An inner node: `H(0x01 ‖ left ‖ right)`, with SHA-512.
pub fn hash_node<const H: usize>(left: &[u8; H], right: &[u8; H]) -> [u8; H] {
    hash_node_with(TreeHash::Sha512, left, right)
}

/// Why a PATH and INDX do not lead anywhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PathError {
    /// PATH is not a whole number of hashes.
    #[error("PATH of {len} bytes is not a multiple of the {hash_len}-byte hash")]
    Length {
        /// Bytes in PATH.
        len: usize,
        /// Bytes per hash.
        hash_len: usize,
    },
    /// PATH holds more than [`MAX_PATH_HASHES`] hashes.
    #[error("PATH holds {hashes} hashes, more than {MAX_PATH_HASHES}")]
    TooLong {
        /// Hashes in PATH.
        hashes: usize,
    },
    /// INDX has bits set beyond the path's length.
    #[error("INDX {index:#x} has bits set above the {hashes}-hash path")]
    IndexTooLarge {
        /// INDX.
        index: u32,
        /// Hashes in PATH.
        hashes: usize,
    },
}

/// Most leaves a [`MerkleTree`] is built for: far beyond any batch a server should sign (a
/// reply must stay smaller than its request), small enough that sizes cannot overflow.
pub const MAX_LEAVES: usize = 1 << 20;

/// Walks `path` up from `leaf` as INDX `index` directs and returns the root it arrives at, with
/// SHA-512.
pub fn root_from_path<const H: usize>(
    leaf: [u8; H],
    index: u32,
    path: &[u8],
) -> Result<[u8; H], PathError> {
    root_from_path_with(TreeHash::Sha512, leaf, index, path)
}

/// [`root_from_path`] for a tree built with `tree_hash`.
pub fn root_from_path_with<const H: usize>(
    tree_hash: TreeHash,
    leaf: [u8; H],
    index: u32,
    path: &[u8],
) -> Result<[u8; H], PathError> {
    if !path.len().is_multiple_of(H) {
        return Err(PathError::Length {
            len: path.len(),
            hash_len: H,
        });
    }
    let hashes = path.len() / H;
    if hashes > MAX_PATH_HASHES {
        return Err(PathError::TooLong { hashes });
    }
    let mut h = leaf;
    let mut bits = index;
    for node in path.chunks_exact(H) {
        let node: &[u8; H] = node.try_into().unwrap_or(&[0; H]);
        h = match bits & 1 {
            0 => hash_node_with(tree_hash, &h, node),
            _ => hash_node_with(tree_hash, node, &h),
        };
        bits >>= 1;
    }
    if bits != 0 {
        return Err(PathError::IndexTooLarge { index, hashes });
    }
    Ok(h)
}

/// A Merkle tree of at most `capacity` leaves with `H`-byte hashes, built afresh for every batch.
#[derive(Debug, Clone)]
pub struct MerkleTree<const H: usize> {
    /// All levels, leaves first, each level right after the one below. Sized once so that no
    /// batch ever grows it.
    nodes: Vec<[u8; H]>,
    /// Leaves or nodes waiting to be hashed together, and the slot in `nodes` each one's hash
    /// goes to.
    lanes: Lanes,
    tree_hash: TreeHash,
    pending: [usize; LANES],
    capacity: usize,
    leaves: usize,
    /// `(start, width)` of each level above the leaves, filled in by `build`.
    levels: [(usize, usize); MAX_PATH_HASHES],
    depth: usize,
    built: bool,
}

impl<const H: usize> MerkleTree<H> {
    /// A SHA-512 tree for up to `capacity` leaves, clamped to 1..=[`MAX_LEAVES`].
    pub fn with_capacity(capacity: usize) -> Self {
        Self::with_capacity_and_hash(capacity, TreeHash::Sha512)
    }

    /// A tree for up to `capacity` leaves (clamped to 1..=[`MAX_LEAVES`]) hashed with
    /// `tree_hash`.
    pub fn with_capacity_and_hash(capacity: usize, tree_hash: TreeHash) -> Self {
        let capacity = capacity.clamp(1, MAX_LEAVES);
        // Level widths are ⌈n/2^k⌉, which sum to less than 2n + depth.
        let slots = 2 * capacity + MAX_PATH_HASHES;
        Self {
            nodes: vec![[0; H]; slots],
            lanes: Lanes::new().with_variant(tree_hash.variant()),
            tree_hash,
            pending: [0; LANES],
            capacity,
            leaves: 0,
            levels: [(0, 0); MAX_PATH_HASHES],
            depth: 0,
            built: false,
        }
    }

    /// Most leaves the tree takes.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Leaves pushed since the last [`clear`](Self::clear).
    pub fn len(&self) -> usize {
        self.leaves
    }

    /// True if no leaf has been pushed.
    pub fn is_empty(&self) -> bool {
        self.leaves == 0
    }

    /// Forgets all leaves, keeping the memory.
    pub fn clear(&mut self) {
        // Drops anything staged by a push that was never built.
        self.lanes.clear();
        self.leaves = 0;
        self.depth = 0;
        self.built = false;
    }

    /// Adds the leaf `H(0x00 ‖ data)` and returns its index, or `None` if the tree is full. The
    /// hash is computed with seven others, or at [`build`](Self::build).
    pub fn push(&mut self, data: &[u8]) -> Option<u32> {
        let index = self.next_leaf()?;
        self.stage(index as usize, &[&[0x00], data]);
        Some(index)
    }

    /// Adds an already hashed leaf and returns its index, or `None` if the tree is full.
    pub fn push_hash(&mut self, leaf: [u8; H]) -> Option<u32> {
        let index = self.next_leaf()?;
        self.nodes[index as usize] = leaf;
        Some(index)
    }

    /// Takes the next leaf slot, or `None` if the tree is full.
    fn next_leaf(&mut self) -> Option<u32> {
        if self.leaves >= self.capacity {
            return None;
        }
        let index = u32::try_from(self.leaves).ok()?;
        self.leaves += 1;
        self.built = false;
        Some(index)
    }

    /// Computes the inner nodes and returns the root, or `None` for an empty tree.
    pub fn build(&mut self) -> Option<[u8; H]> {
        if self.leaves == 0 {
            return None;
        }
        self.flush();
        let (mut start, mut width) = (0, self.leaves);
        let mut depth = 0;
        while width > 1 {
            let next = start + width;
            let next_width = width.div_ceil(2);
            for j in 0..next_width {
                let left = self.nodes[start + 2 * j];
                // An odd level's last node is paired with the zero hash.
                let right = match 2 * j + 1 < width {
                    true => self.nodes[start + 2 * j + 1],
                    false => [0; H],
                };
                self.stage(next + j, &[&[0x01], &left, &right]);
            }
            // The next level is made of these.
            self.flush();
            self.levels[depth] = (start, width);
            depth += 1;
            start = next;
            width = next_width;
        }
        self.depth = depth;
        self.built = true;
        Some(self.nodes[start])
    }

    /// Stages the hash of `parts` for slot `slot`, hashing the lanes once all are taken; a
    /// message too long for a lane is hashed on its own at once.
    fn stage(&mut self, slot: usize, parts: &[&[u8]]) {
        match self.lanes.push(parts) {
            Some(lane) => {
                self.pending[lane] = slot;
                if self.lanes.is_full() {
                    self.flush();
                }
            }
            None => self.nodes[slot] = hash_with(self.tree_hash, parts),
        }
    }

    /// Hashes whatever is staged into its slots.
    fn flush(&mut self) {
        let Self {
            lanes,
            pending,
            nodes,
            ..
        } = self;
        lanes.finish(|lane, digest| nodes[pending[lane]] = truncate(digest));
    }

    /// The root of the last [`build`](Self::build).
    pub fn root(&self) -> Option<[u8; H]> {
        match (self.built, self.depth) {
            (false, _) => None,
            (true, 0) => Some(self.nodes[0]),
            (true, d) => {
                let (start, width) = self.levels[d - 1];
                Some(self.nodes[start + width])
            }
        }
    }

    /// Hashes in every leaf's path: ⌈log₂ leaves⌉.
    pub fn path_hashes(&self) -> usize {
        self.depth
    }

    /// Bytes of every leaf's PATH.
    pub fn path_len(&self) -> usize {
        self.depth * H
    }

    /// Writes the PATH of leaf `index` into `out` (which must hold [`path_len`](Self::path_len)
    /// bytes) and returns the bytes written; `None` if the tree is not built, the index is not a
    /// leaf or `out` is too short.
    pub fn write_path(&self, index: u32, out: &mut [u8]) -> Option<usize> {
        let mut i = usize::try_from(index).ok()?;
        if !self.built || i >= self.leaves || out.len() < self.path_len() {
            return None;
        }
        for (level, chunk) in self.levels[..self.depth]
            .iter()
            .zip(out.chunks_exact_mut(H))
        {
            let (start, width) = *level;
            match (i ^ 1) < width {
                true => chunk.copy_from_slice(&self.nodes[start + (i ^ 1)]),
                // The last node of an odd level, whose sibling is the zero hash.
                false => chunk.fill(0),
            }
            i /= 2;
        }
        Some(self.path_len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf_data(i: usize) -> [u8; 4] {
        (i as u32).to_le_bytes()
    }

    /// A tree of `n` leaves (`leaf_data(0..n)`) with room for `capacity`, built, and its root.
    fn built(n: usize, capacity: usize) -> (MerkleTree<32>, [u8; 32]) {
        let mut t = MerkleTree::<32>::with_capacity(capacity);
        for i in 0..n {
            t.push(&leaf_data(i)).unwrap();
        }
        let root = t.build().unwrap();
        (t, root)
    }

    #[test]
    fn single_leaf_is_the_root() {
        let mut t = MerkleTree::<32>::with_capacity(4);
        assert_eq!(t.build(), None);
        t.push(b"only").unwrap();
        let root = t.build().unwrap();
        assert_eq!(root, hash_leaf::<32>(b"only"));
        assert_eq!(t.path_len(), 0);
        let mut out = [0u8; 0];
        assert_eq!(t.write_path(0, &mut out), Some(0));
        assert_eq!(root_from_path(hash_leaf(b"only"), 0, &[]), Ok(root));
        assert_eq!(
            root_from_path(hash_leaf::<32>(b"only"), 1, &[]),
            Err(PathError::IndexTooLarge {
                index: 1,
                hashes: 0
            })
        );
    }

    #[test]
    fn an_odd_level_pads_with_the_zero_hash_so_indx_cannot_be_flipped() {
        let (t, root) = built(3, 4);
        let (a, b, c) = (
            hash_leaf::<32>(&leaf_data(0)),
            hash_leaf::<32>(&leaf_data(1)),
            hash_leaf::<32>(&leaf_data(2)),
        );
        assert_eq!(
            root,
            hash_node(&hash_node(&a, &b), &hash_node(&c, &[0; 32]))
        );
        let mut path = [0u8; 64];
        assert_eq!(t.write_path(2, &mut path), Some(64));
        assert_eq!(path[..32], [0; 32]);
        assert_eq!(root_from_path(c, 2, &path), Ok(root));
        // INDX 3 walks the same path with c on the right: another root.
        assert_ne!(root_from_path(c, 3, &path), Ok(root));
    }

    #[test]
    fn two_leaves_by_hand() {
        let mut t = MerkleTree::<32>::with_capacity(2);
        t.push(b"a").unwrap();
        t.push(b"b").unwrap();
        assert_eq!(t.push(b"c"), None, "full");
        let root = t.build().unwrap();
        let (a, b) = (hash_leaf::<32>(b"a"), hash_leaf::<32>(b"b"));
        assert_eq!(root, hash_node(&a, &b));
        let mut path = [0u8; 32];
        t.write_path(0, &mut path).unwrap();
        assert_eq!(path, b);
        t.write_path(1, &mut path).unwrap();
        assert_eq!(path, a);
    }

    #[test]
    fn every_size_and_index_leads_to_the_root() {
        let mut t32 = MerkleTree::<32>::with_capacity(300);
        let mut t64 = MerkleTree::<64>::with_capacity(300);
        for n in 1..=300 {
            t32.clear();
            t64.clear();
            for i in 0..n {
                t32.push(&leaf_data(i)).unwrap();
                t64.push(&leaf_data(i)).unwrap();
            }
            let (r32, r64) = (t32.build().unwrap(), t64.build().unwrap());
            assert_eq!(t32.root(), Some(r32));
            assert_eq!(t32.path_hashes(), (n as f64).log2().ceil() as usize);
            let mut path = [0u8; 64 * 9];
            for i in 0..n {
                let len = t32.write_path(i as u32, &mut path).unwrap();
                let got = root_from_path(hash_leaf(&leaf_data(i)), i as u32, &path[..len]);
                assert_eq!(got, Ok(r32), "n={n} i={i}");
                let len = t64.write_path(i as u32, &mut path).unwrap();
                let got = root_from_path(hash_leaf(&leaf_data(i)), i as u32, &path[..len]);
                assert_eq!(got, Ok(r64), "n={n} i={i}");
            }
            assert_eq!(t32.write_path(n as u32, &mut path), None);
        }
    }

    /// Draft 07's SHA-512/256 tree: built in lanes, it matches the hash worked by hand, differs
    /// from the SHA-512 tree, and every path leads to its root only with SHA-512/256.
    #[test]
    fn sha512_256_tree() {
        let sha = TreeHash::Sha512_256;
        let mut t = MerkleTree::<32>::with_capacity_and_hash(20, sha);
        for i in 0..3 {
            t.push(&leaf_data(i)).unwrap();
        }
        let leaf = |i| hash_leaf_with::<32>(sha, &leaf_data(i));
        let want = hash_node_with(
            sha,
            &hash_node_with(sha, &leaf(0), &leaf(1)),
            &hash_node_with(sha, &leaf(2), &[0; 32]),
        );
        assert_eq!(t.build(), Some(want));
        assert_ne!(Some(want), built(3, 4).0.root());
        assert_eq!(
            leaf(0),
            chime_sha512::digest_512_256(&[&[0], &leaf_data(0)])
        );
        for n in [1, 8, 9, 20] {
            t.clear();
            for i in 0..n {
                t.push(&leaf_data(i)).unwrap();
            }
            let root = t.build().unwrap();
            let mut path = [0u8; 32 * 5];
            for i in 0..n {
                let len = t.write_path(i as u32, &mut path).unwrap();
                let walk = |h| root_from_path_with(h, leaf(i), i as u32, &path[..len]);
                assert_eq!(walk(sha), Ok(root), "n={n} i={i}");
                if n > 1 {
                    assert_ne!(walk(TreeHash::Sha512), Ok(root), "n={n} i={i}");
                }
            }
        }
    }

    /// Leaves staged for hashing but never built are gone after `clear`, whichever slot they
    /// were staged for.
    #[test]
    fn clear_drops_leaves_staged_but_not_built() {
        let mut t = MerkleTree::<32>::with_capacity(16);
        for i in 0..11 {
            t.push(&leaf_data(100 + i)).unwrap();
        }
        t.clear();
        t.push(&leaf_data(0)).unwrap();
        t.push(&leaf_data(1)).unwrap();
        let want = hash_node(&hash_leaf(&leaf_data(0)), &hash_leaf(&leaf_data(1)));
        assert_eq!(t.build(), Some(want));
    }

    #[test]
    fn wrong_index_or_path_fails() {
        let (t, root) = built(5, 8);
        let mut path = [0u8; 96];
        t.write_path(2, &mut path).unwrap();
        let leaf = hash_leaf(&leaf_data(2));
        assert_eq!(root_from_path(leaf, 2, &path), Ok(root));
        assert_ne!(root_from_path(leaf, 3, &path), Ok(root));
        assert_eq!(
            root_from_path(leaf, 2 | 8, &path),
            Err(PathError::IndexTooLarge {
                index: 10,
                hashes: 3
            })
        );
        assert_eq!(
            root_from_path(leaf, 2, &path[..40]),
            Err(PathError::Length {
                len: 40,
                hash_len: 32
            })
        );
        assert_eq!(
            root_from_path(leaf, 0, &[0u8; 33 * 32]),
            Err(PathError::TooLong { hashes: 33 })
        );
        // 32 hashes is allowed and uses every INDX bit.
        assert!(root_from_path(leaf, u32::MAX, &[0u8; 32 * 32]).is_ok());
    }
}
