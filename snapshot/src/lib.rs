//! Incremental, content-addressed workspace snapshots (docs/design.md, "Snapshots").
//!
//! A snapshot is a **manifest** (every path of the tree with its kind, mode, size, mtime
//! and BLAKE3 content hash; files as lists of chunks) plus the **chunks** it names: pieces
//! of file content cut at content-defined boundaries (FastCDC, 32 KiB – 512 KiB), stored
//! zstd-compressed under the BLAKE3 hash of their uncompressed bytes. A chunk already in the
//! store is never uploaded again, so a snapshot of a tree with one edited file uploads that
//! file's changed chunks and the manifest. Every restore verifies every chunk and every
//! file hash, writes into a fresh directory beside the target and renames it into place.
//!
//! - [`SnapshotStore`] is the seam (`dir`, `redis`, `s3`), [`open`] makes one from a URL.
//! - [`snapshot`], [`restore`], [`restore_latest`] are the engine;
//!   [`list`], [`prune`], [`delete_workspace`], [`collect_garbage`] the retention side.

mod chunk;
mod engine;
mod error;
mod manifest;
pub mod store;

pub use engine::gc::{GcReport, collect_garbage};
pub use engine::restore::{restore, restore_latest, staging_target};
pub use engine::retention::{delete_workspace, list, prune};
pub use engine::snapshot::{SnapshotOptions, snapshot};
pub use error::SnapshotError;
pub use manifest::SnapshotInfo;
pub use store::{BlobEntry, SnapshotStore, SnapshotStoreRef, open};
