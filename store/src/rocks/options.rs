//! RocksDB settings for a queue workload: many small appends, deletes soon after, ordered reads
//! of each priority's run, point lookups by key; tens of millions of messages in bounded memory
//! on a small machine (two cores).

use rocksdb::{
    BlockBasedOptions, Cache, ColumnFamilyDescriptor, DBCompressionType, MergeOperands, Options,
    SliceTransform,
};

use super::keys;
use super::{
    CF_COUNTS, CF_DEDUP, CF_DELAYED, CF_DELIVERIES, CF_HEADER_INDEX, CF_META, CF_OLD_MESSAGES,
    CF_QUEUES, CF_QUEUE_MESSAGES,
};
use crate::codec;
use crate::KvSpace;

const MIB: usize = 1024 * 1024;
/// About 1% false positives.
const BLOOM_BITS_PER_KEY: f64 = 10.0;

/// Options for the whole database.
pub(super) fn db_options() -> Options {
    let mut o = Options::default();
    o.create_if_missing(true);
    o.create_missing_column_families(true);
    // Two cores: one flush and one compaction at a time, leaving the rest to the broker.
    o.set_max_background_jobs(2);
    // Bounded file handles; table readers past this are closed and reopened on demand.
    o.set_max_open_files(1_000);
    // All memtables together stay under this, whatever each column family's own size.
    o.set_db_write_buffer_size(192 * MIB);
    // Column families written rarely (queues, meta) would otherwise keep old WAL files forever.
    o.set_max_total_wal_size(256 * MIB as u64);
    // Table files written by flushes and compactions are handed to the disk 1 MiB at a time as
    // they are written, so a log fsync (which on ext4 may have to write out other files' dirty
    // data with its journal commit) does not wait behind a whole table file.
    o.set_bytes_per_sync(MIB as u64);
    o
}

/// Every column family this version opens, with its options; `with_old_messages` adds the
/// pre-paging `messages` column family, opened only to migrate it.
pub(super) fn column_families(with_old_messages: bool) -> Vec<ColumnFamilyDescriptor> {
    // One block cache for every column family (index and filter blocks included), so memory for
    // reads stays bounded however many messages and files there are.
    let cache = Cache::new_lru_cache(64 * MIB);
    let mut cfs = vec![
        ColumnFamilyDescriptor::new(CF_QUEUES, base(&cache, Filter::None, 4)),
        ColumnFamilyDescriptor::new(CF_QUEUE_MESSAGES, queue_messages(&cache)),
        ColumnFamilyDescriptor::new(CF_DELIVERIES, deliveries(&cache)),
        ColumnFamilyDescriptor::new(CF_META, base(&cache, Filter::None, 4)),
        ColumnFamilyDescriptor::new(CF_DEDUP, dedup(&cache)),
        ColumnFamilyDescriptor::new(CF_COUNTS, counts(&cache)),
        ColumnFamilyDescriptor::new(CF_HEADER_INDEX, header_index(&cache)),
        ColumnFamilyDescriptor::new(CF_DELAYED, delayed(&cache)),
    ];
    // The Raft engine's key spaces: small (a log compacted every thousand entries, the
    // metadata), appended and read back in key order.
    for space in KvSpace::ALL {
        cfs.push(ColumnFamilyDescriptor::new(
            space.column_family(),
            base(&cache, Filter::None, 4),
        ));
    }
    if with_old_messages {
        cfs.push(ColumnFamilyDescriptor::new(
            CF_OLD_MESSAGES,
            base(&cache, Filter::None, 4),
        ));
    }
    cfs
}

/// Which bloom filter a column family's tables carry.
#[derive(Debug, Clone, Copy)]
enum Filter {
    None,
    /// On whole keys, and on prefixes too if the column family has a prefix extractor.
    Keys,
    /// On prefixes only: whole keys are never looked up.
    Prefixes,
}

/// Options every column family shares: the shared cache, a bloom filter, a memtable size.
fn base(cache: &Cache, filter: Filter, write_buffer_mib: usize) -> Options {
    let mut table = BlockBasedOptions::default();
    table.set_block_cache(cache);
    // Index and filter blocks live in (and are bounded by) the cache instead of outside it.
    table.set_cache_index_and_filter_blocks(true);
    // Level-0 files are read on every lookup: keep their index and filters from being evicted.
    table.set_pin_l0_filter_and_index_blocks_in_cache(true);
    match filter {
        Filter::None => {}
        Filter::Keys => table.set_bloom_filter(BLOOM_BITS_PER_KEY, false),
        Filter::Prefixes => {
            table.set_bloom_filter(BLOOM_BITS_PER_KEY, false);
            table.set_whole_key_filtering(false);
        }
    }
    let mut o = Options::default();
    o.set_block_based_table_factory(&table);
    o.set_write_buffer_size(write_buffer_mib * MIB);
    // Levels sized from the last one down: space overhead stays near 10% as the data grows or
    // shrinks, and deleted messages' tombstones reach the bottom (and vanish) sooner.
    o.set_level_compaction_dynamic_level_bytes(true);
    o
}

fn queue_messages(cache: &Cache) -> Options {
    // Sends are appended here and, on a queue whose consumers keep up, acknowledged (deleted)
    // before a flush, so their bodies never reach a table file: the memtable only has to hold the
    // backlog of a healthy queue (12 MiB is ~12 000 messages of 1 KiB). A bigger one mostly costs
    // memory: two of them (one being flushed) are resident at the peak. 12 against 16 MiB: the
    // standard benchmark's peak RSS 92-93 against 95-97 MiB, the same throughput (A/B, 3 runs
    // each). Bloom: `find_message` probes ten keys, nine miss.
    let mut o = base(cache, Filter::Keys, 12);
    // Bodies compress cheaply; LZ4 costs little CPU.
    o.set_compression_type(DBCompressionType::Lz4);
    o
}

fn deliveries(cache: &Cache) -> Options {
    // Bloom: every page read looks up each message's delivery count, and most have none.
    base(cache, Filter::Keys, 16)
}

fn dedup(cache: &Cache) -> Options {
    // Prefix bloom on the queue uid: recovery's scan of one queue's records skips files holding
    // none of them (most queues never use dedup ids).
    let mut o = base(cache, Filter::Prefixes, 8);
    o.set_prefix_extractor(SliceTransform::create_fixed_prefix(8));
    o
}

fn delayed(cache: &Cache) -> Options {
    // Prefix bloom on the queue uid: recovery's read of each queue's delayed messages skips files
    // holding none of them (most queues have none).
    let mut o = base(cache, Filter::Prefixes, 4);
    o.set_prefix_extractor(SliceTransform::create_fixed_prefix(8));
    o
}

fn counts(cache: &Cache) -> Options {
    let mut o = base(cache, Filter::None, 4);
    // Counts change in the same batch as the messages, by signed deltas, without reading them.
    o.set_merge_operator_associative("ferry.counts.add.v1", merge_counts);
    o
}

fn header_index(cache: &Cache) -> Options {
    // Prefix bloom on `uid ++ kind ++ len ++ value`: a lookup for a value no message carries (a
    // reply that has not arrived) skips every file, in the memtable too.
    let mut o = base(cache, Filter::Prefixes, 16);
    o.set_prefix_extractor(SliceTransform::create(
        "ferry.header_index.value.v1",
        keys::index_key_prefix,
        Some(keys::index_key_in_domain),
    ));
    o.set_memtable_prefix_bloom_ratio(0.05);
    o
}

/// Adds count deltas. `None` (a value that is not 16 bytes, which only a bug writes) makes
/// RocksDB report the key as corrupt instead of guessing a count.
fn merge_counts(_key: &[u8], existing: Option<&[u8]>, operands: &MergeOperands) -> Option<Vec<u8>> {
    codec::add_counts(existing.into_iter().chain(operands)).map(|v| v.to_vec())
}
