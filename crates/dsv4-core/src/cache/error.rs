//! The error type of the cache byte layouts.

/// What was wrong with a cache layout or with the buffers handed to it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CacheLayoutError {
    /// The fp8 KV format quantizes the nope part in blocks of 64.
    #[error(
        "fp8 KV entries need the nope part (head_dim - qk_rope_head_dim = {nd}) to be a multiple of 64; use kv_cache_dtype = bf16 or fix the head sizes"
    )]
    NopeNotMultipleOf64 {
        /// The nope width that was given.
        nd: usize,
    },
    /// The rope part is wider than the head.
    #[error("qk_rope_head_dim ({rope_dim}) is larger than head_dim ({head_dim})")]
    RopeExceedsHead {
        /// The head size that was given.
        head_dim: usize,
        /// The rope width that was given.
        rope_dim: usize,
    },
    /// An entry without any values.
    #[error("a cache entry needs at least one value (head size 0 was given)")]
    EmptyEntry,
    /// The index head dim does not fit the format's blocks.
    #[error(
        "index-K {dtype} rows need index_head_dim to be a positive multiple of {multiple}, got {dim}"
    )]
    IndexDimNotMultiple {
        /// The format's name.
        dtype: &'static str,
        /// The dim that was given.
        dim: usize,
        /// The block the dim must be a multiple of.
        multiple: usize,
    },
    /// A page must hold at least one entry.
    #[error("a cache page must hold at least one entry (page_entries = 0 was given)")]
    ZeroPageEntries,
    /// The sizes overflow the address space.
    #[error(
        "a page of {page_entries} entries of this layout does not fit in memory (byte count overflows)"
    )]
    TooLarge {
        /// Entries per page that were asked for.
        page_entries: usize,
    },
    /// The value slice has the wrong length.
    #[error("expected {expected} values for one cache entry, got {got}")]
    WrongValueCount {
        /// Values per entry of this layout.
        expected: usize,
        /// Values that were given.
        got: usize,
    },
    /// Encoded entry bytes of the wrong length.
    #[error("expected {expected} bytes for one encoded cache entry, got {got}")]
    WrongEntrySize {
        /// Bytes per entry of this layout (data and scales).
        expected: usize,
        /// Bytes that were given.
        got: usize,
    },
    /// A row batch that is not a whole number of rows.
    #[error("expected whole cache rows of {width} values, got {got} values")]
    PartialRow {
        /// Values per row of this layout.
        width: usize,
        /// Values that were given.
        got: usize,
    },
    /// The page slice has the wrong length.
    #[error("expected a page of {expected} bytes for this layout, got {got} bytes")]
    WrongPageSize {
        /// Bytes per page of this layout.
        expected: usize,
        /// Bytes that were given.
        got: usize,
    },
    /// A row names a page the call was not given.
    #[error("row {row} names page {page}, but only {pages} pages were given")]
    PageOutOfRange {
        /// The row (index into the call's rows).
        row: usize,
        /// The page index it names.
        page: usize,
        /// Pages given.
        pages: usize,
    },
    /// The slot is not inside the page.
    #[error("slot {slot} is outside a page of {page_entries} entries")]
    SlotOutOfRange {
        /// The slot that was asked for.
        slot: usize,
        /// Entries per page.
        page_entries: usize,
    },
}
