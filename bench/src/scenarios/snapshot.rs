//! `snapshot`: workspace snapshots (berth-snapshot) of one tree — many small files and one
//! large — to each store (dir, a real `redis-server`, `moto_server` as S3): the first
//! snapshot, an incremental one after one file changed, and a restore. Floors in the same
//! run: `tar | zstd -3` of the tree to /dev/null (what a plain tar snapshot costs), and
//! raw puts of the same bytes to the same store (what the store itself costs).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use berth_snapshot::{SnapshotOptions, SnapshotStoreRef};
use berth_testkit::store_servers;
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use rand::RngCore;

use super::common;
use crate::env::{Ctx, progress};
use crate::report::{Floor, Quantity, ScenarioResult};
use crate::stats::Summary;

pub const NAME: &str = "snapshot";

const MIB: u64 = 1024 * 1024;
const SMALL_FILE: usize = 64 * 1024;

/// The tree: `small` files of 64 KiB (half random, half text) and one random large file.
struct TreeShape {
    small: usize,
    large_mib: usize,
}

impl TreeShape {
    fn for_run(quick: bool) -> Self {
        // Full: 2048 × 64 KiB + 128 MiB = 256 MiB. Quick (CI): 16 MiB.
        if quick { TreeShape { small: 128, large_mib: 8 } } else { TreeShape { small: 2048, large_mib: 128 } }
    }

    fn bytes(&self) -> u64 {
        (self.small * SMALL_FILE) as u64 + self.large_mib as u64 * MIB
    }
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<Vec<ScenarioResult>> {
    let shape = TreeShape::for_run(ctx.settings.quick);
    let work = tempfile::Builder::new().prefix("berth-bench-snapshot-").tempdir().context("work directory")?;
    let tree = work.path().join("workspace");
    let tree_for_make = tree.clone();
    let small = shape.small;
    let large_mib = shape.large_mib;
    tokio::task::spawn_blocking(move || make_tree(&tree_for_make, small, large_mib)).await??;
    progress!("{NAME}: tree of {} MiB ({} small files + {} MiB)", shape.bytes() / MIB, shape.small, shape.large_mib);

    let mut results = Vec::new();
    let tar_floor = tar_zstd(&tree).await;
    for store_kind in ["dir", "redis", "s3"] {
        let case = format!("{store_kind}: first snapshot");
        let server = match StoreServer::start(store_kind, work.path()).await {
            Ok(server) => server,
            Err(error) => {
                results.push(common::error_row(NAME, &case, &ctx.machine, &error));
                continue;
            }
        };
        let store = match berth_snapshot::open(&server.url) {
            Ok(store) => store,
            Err(error) => {
                results.push(common::error_row(NAME, &case, &ctx.machine, &anyhow::anyhow!(error)));
                continue;
            }
        };
        results.extend(measure_store(ctx, store_kind, &store, &tree, work.path(), &shape, &tar_floor).await);
        drop(server);
    }
    Ok(results)
}

async fn measure_store(
    ctx: &Ctx,
    store_kind: &str,
    store: &SnapshotStoreRef,
    tree: &Path,
    work: &Path,
    shape: &TreeShape,
    tar_floor: &anyhow::Result<Duration>,
) -> Vec<ScenarioResult> {
    let bytes = shape.bytes();
    let workspace_id = format!("bench-{store_kind}");
    let mut rows = Vec::new();
    progress!("{NAME}: {store_kind}: raw puts of the same bytes");
    let raw = raw_puts(store, tree).await;

    progress!("{NAME}: {store_kind}: first snapshot");
    let started = Instant::now();
    let first = berth_snapshot::snapshot(&**store, &workspace_id, 1, tree, SnapshotOptions::default()).await;
    let first_elapsed = started.elapsed();
    let case = format!("{store_kind}: first snapshot");
    let first = match first {
        Ok(info) => info,
        Err(error) => {
            rows.push(common::error_row(NAME, &case, &ctx.machine, &anyhow::anyhow!(error)));
            return rows;
        }
    };
    let mut row = measured_row(ctx, &case, store_kind, bytes, first_elapsed);
    row.count("uploaded_bytes", first.uploaded_bytes);
    row.count("deduplicated_bytes", first.deduplicated_bytes);
    row.count("manifest_bytes", first.manifest_bytes);
    if let Ok(floor) = tar_floor {
        row.set_floor(floor_of("tar | zstd -3 to /dev/null", bytes, *floor));
    }
    rows.push(row);

    // One file changed: 1 KiB in the middle of the large file.
    let large = tree.join("large.bin");
    let edited = tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        let mut data = std::fs::read(&large)?;
        let middle = data.len() / 2;
        rand::rng().fill_bytes(&mut data[middle..middle + 1024]);
        std::fs::write(&large, &data)?;
        Ok(())
    })
    .await;
    let case = format!("{store_kind}: incremental snapshot, one file changed");
    if let Err(error) = edited.map_err(anyhow::Error::from).and_then(|result| result) {
        rows.push(common::error_row(NAME, &case, &ctx.machine, &error));
        return rows;
    }
    progress!("{NAME}: {store_kind}: incremental snapshot");
    let options = SnapshotOptions { parent: Some(first.id.clone()), ..SnapshotOptions::default() };
    let started = Instant::now();
    let second = berth_snapshot::snapshot(&**store, &workspace_id, 1, tree, options).await;
    let second_elapsed = started.elapsed();
    let second = match second {
        Ok(info) => info,
        Err(error) => {
            rows.push(common::error_row(NAME, &case, &ctx.machine, &anyhow::anyhow!(error)));
            return rows;
        }
    };
    let mut row = measured_row(ctx, &case, store_kind, bytes, second_elapsed);
    row.count("uploaded_bytes", second.uploaded_bytes);
    row.count("deduplicated_bytes", second.deduplicated_bytes);
    row.count("manifest_bytes", second.manifest_bytes);
    if second.uploaded_bytes >= MIB {
        row.fail(format!("one changed file uploaded {} bytes (≥ 1 MiB)", second.uploaded_bytes));
    }
    if let Ok(floor) = tar_floor {
        row.set_floor(floor_of("tar | zstd -3 to /dev/null", bytes, *floor));
    }
    rows.push(row);

    progress!("{NAME}: {store_kind}: restore");
    let into = work.join(format!("restored-{store_kind}"));
    let started = Instant::now();
    let restored = berth_snapshot::restore(&**store, &workspace_id, &second.id, &into).await;
    let restore_elapsed = started.elapsed();
    let case = format!("{store_kind}: restore");
    match restored {
        Ok(_) => {
            let mut row = measured_row(ctx, &case, store_kind, bytes, restore_elapsed);
            match &raw {
                Ok((_, get)) => row.set_floor(floor_of("raw gets of the same bytes", bytes, *get)),
                Err(error) => row.fail(format!("raw get floor: {error:#}")),
            }
            rows.push(row);
        }
        Err(error) => rows.push(common::error_row(NAME, &case, &ctx.machine, &anyhow::anyhow!(error))),
    }
    // The first snapshot's row compares with raw puts too (as a metric: its floor is tar).
    if let (Ok((put, _)), Some(first_row)) = (&raw, rows.first_mut()) {
        first_row.metric("raw_put_mib_per_s", bytes as f64 / MIB as f64 / put.as_secs_f64());
        first_row.metric("raw_put_s", put.as_secs_f64());
    }
    let _ = std::fs::remove_dir_all(&into);
    rows
}

fn measured_row(ctx: &Ctx, case: &str, store_kind: &str, bytes: u64, elapsed: Duration) -> ScenarioResult {
    let mut row = ScenarioResult::new(NAME, case, &ctx.machine).param("store", store_kind).param("bytes", bytes);
    row.latency_ms = Summary::of(&[elapsed]);
    row.throughput = Some(Quantity::new(bytes as f64 / MIB as f64 / elapsed.as_secs_f64(), "MiB/s"));
    row.wall_s = elapsed.as_secs_f64();
    row
}

fn floor_of(name: &str, bytes: u64, elapsed: Duration) -> Floor {
    Floor {
        name: name.to_owned(),
        latency_ms: Summary::of(&[elapsed]),
        throughput: Some(Quantity::new(bytes as f64 / MIB as f64 / elapsed.as_secs_f64(), "MiB/s")),
    }
}

fn make_tree(root: &Path, small: usize, large_mib: usize) -> anyhow::Result<()> {
    let mut random = rand::rng();
    for index in 0..small {
        let path = root.join(format!("src/module-{:02}/file-{index:04}.dat", index % 32));
        std::fs::create_dir_all(path.parent().context("parent")?)?;
        let mut data = vec![0u8; SMALL_FILE];
        if index % 2 == 0 {
            random.fill_bytes(&mut data);
        } else {
            let text = b"fn main() { println!(\"berth\"); }\n";
            for (offset, byte) in data.iter_mut().enumerate() {
                *byte = text[(offset + index) % text.len()];
            }
        }
        std::fs::write(&path, &data)?;
    }
    let mut large = vec![0u8; large_mib * MIB as usize];
    random.fill_bytes(&mut large);
    std::fs::write(root.join("large.bin"), &large)?;
    // Older than the incremental walk's racy window, as a workspace at rest is.
    let an_hour_ago = std::time::SystemTime::now() - Duration::from_secs(3600);
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for item in std::fs::read_dir(&dir)? {
            let path = item?.path();
            if path.is_dir() {
                pending.push(path);
            } else {
                std::fs::OpenOptions::new().write(true).open(&path)?.set_modified(an_hour_ago)?;
            }
        }
    }
    Ok(())
}

/// `tar -cf - . | zstd -3 -T1 > /dev/null`, timed.
async fn tar_zstd(tree: &Path) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let status = tokio::process::Command::new("sh")
        .arg("-c")
        .arg("tar -C \"$1\" -cf - . | zstd -3 -T1 -q -c > /dev/null")
        .arg("sh")
        .arg(tree)
        .status()
        .await
        .context("run tar | zstd")?;
    ensure!(status.success(), "tar | zstd failed ({status}; are tar and zstd installed?)");
    Ok(started.elapsed())
}

/// Every file's bytes put to the store as 4 MiB pieces (8 in flight, the engine's
/// concurrency) under made-up addresses, then got back: the store's own cost. The pieces
/// are deleted afterwards.
async fn raw_puts(store: &SnapshotStoreRef, tree: &Path) -> anyhow::Result<(Duration, Duration)> {
    let tree = tree.to_path_buf();
    let pieces: Vec<Bytes> = tokio::task::spawn_blocking(move || -> anyhow::Result<Vec<Bytes>> {
        let mut pieces = Vec::new();
        let mut pending = vec![tree];
        while let Some(dir) = pending.pop() {
            for item in std::fs::read_dir(&dir)? {
                let path = item?.path();
                if path.is_dir() {
                    pending.push(path);
                } else {
                    let data = Bytes::from(std::fs::read(&path)?);
                    for start in (0..data.len()).step_by(4 * MIB as usize) {
                        pieces.push(data.slice(start..(start + 4 * MIB as usize).min(data.len())));
                    }
                }
            }
        }
        Ok(pieces)
    })
    .await??;
    let keys: Vec<String> =
        (0..pieces.len()).map(|index| format!("{:064x}", 0xbe4c_0000_0000u64 + index as u64)).collect();
    let started = Instant::now();
    futures::stream::iter(keys.iter().zip(pieces).map(|(key, piece)| store.put_blob(key, piece)))
        .buffer_unordered(8)
        .try_collect::<Vec<()>>()
        .await?;
    let put = started.elapsed();
    let started = Instant::now();
    futures::stream::iter(keys.iter().map(|key| store.get_blob(key)))
        .buffer_unordered(8)
        .try_collect::<Vec<Bytes>>()
        .await?;
    let get = started.elapsed();
    for key in &keys {
        store.delete_blob(key).await?;
    }
    Ok((put, get))
}

/// The server behind a store for one measurement (berth-testkit's, killed by PID on drop).
struct StoreServer {
    url: String,
    _server: Option<store_servers::ServerProcess>,
}

impl StoreServer {
    async fn start(kind: &str, work: &Path) -> anyhow::Result<StoreServer> {
        let (url, server) = match kind {
            "dir" => (format!("file://{}", work.join("dir-store").display()), None),
            "redis" => {
                let server = common::testkit_call("starting redis-server", store_servers::redis).await?;
                (server.redis_url("bench"), Some(server))
            }
            "s3" => {
                let server = common::testkit_call("starting moto_server", || store_servers::moto("bench")).await?;
                (server.s3_url("bench", "snapshots"), Some(server))
            }
            other => bail!("unknown store {other}"),
        };
        Ok(StoreServer { url, _server: server })
    }
}
