//! Records stored in the registry. Each is JSON with a `version` field (the record schema),
//! so the format can grow: new fields always carry `#[serde(default)]`.
//!
//! Durable: everything here. Rebuilt at start: each replica's in-memory view of workspaces
//! and nodes (from a list + watch). Fencing: the bind lock's `create_revision` guards every
//! write of a workspace record made under that lock (docs/design.md §4.2).

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use berth_workspace::{WorkspaceId, WorkspaceSpec};
use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::policy::IsolationPolicy;
use crate::registry::RegistryError;

/// Current schema version written by this build.
pub const RECORD_VERSION: u32 = 1;

/// Stored lifecycle state. `Lost` is never stored: it is derived by the view when the
/// record says `Ready` but its node has no live key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StoredState {
    /// Provisioned on `node_id` at `generation`.
    Ready,
    /// Runtime released by the idle sweeper or CloseWorkspace; data kept on `node_id`.
    Idle,
    /// The last provisioning attempt failed (`failure` says why); the next access retries.
    Failed,
}

/// `/berth/workspaces/<id>`. Written only under the workspace's bind lock, fenced by the
/// lock's create revision.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkspaceRecord {
    pub version: u32,
    pub id: WorkspaceId,
    /// User that created it (empty for `global` workspaces).
    pub owner: String,
    pub agent: String,
    pub policy: IsolationPolicy,
    /// Backend asked for ("" = the node's default until placed, then the one used).
    pub backend: String,
    pub spec: WorkspaceSpec,
    pub state: StoredState,
    /// Node holding the workspace's runtime and data.
    #[serde(default)]
    pub node_id: Option<String>,
    /// Grows with every placement; a node serving another generation refuses the call.
    pub generation: u64,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    #[serde(default)]
    pub failure: Option<String>,
    /// Replica that made the last state change (for operators and tests).
    #[serde(default)]
    pub changed_by: String,
    /// Principals the owner shared this workspace with.
    #[serde(default)]
    pub shared_with: Vec<String>,
    /// How the files at `generation` came to be: set by the placement that made them fresh,
    /// empty again or restored; kept by placements that carry the files over.
    #[serde(default)]
    pub origin: Origin,
    /// The generation of that placement (0 in records older than it).
    #[serde(default)]
    pub origin_generation: u64,
    /// The latest snapshot of the workspace's files (docs/design.md §4.8). Written only in a
    /// transaction that compares the record's generation with the snapshot's: a snapshot
    /// taken by a node holding an older placement never becomes latest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<SnapshotPointer>,
}

/// The latest snapshot of a workspace: a field of [`WorkspaceRecord`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotPointer {
    pub id: String,
    /// The placement that took it (the record's generation when it was recorded).
    pub generation: u64,
    /// When it was taken, on the node's clock.
    pub taken_at_ms: i64,
    #[serde(default)]
    pub bytes: u64,
    #[serde(default)]
    pub files: u64,
}

/// How a workspace's current copy came to be; every Workspace answer carries it, so a
/// client can tell a workspace that kept its files from one that came back without them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Origin {
    /// Written before origins were recorded.
    #[default]
    Unknown,
    /// Made empty for an id that had no workspace.
    Fresh,
    /// Its files were kept; what a record written before origins gets at its next
    /// placement (placements that keep files otherwise keep the origin they had).
    Resumed,
    /// Its files came back from a snapshot.
    Restored { snapshot_id: String, taken_at_ms: i64 },
    /// Its files were lost (`reason`) and it was made again, empty.
    RecreatedEmpty { reason: String },
}

/// `/berth/tombstones/<id>`: a workspace deleted while a copy of it may still exist on a
/// node that was away. Every copy at `generation` or older, on any node, is superseded (moved
/// to the quarantine when its node reports it); the tombstone goes once `node_id` reports no
/// copy. Written in the same fenced transaction that deletes the record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TombstoneRecord {
    pub version: u32,
    pub workspace_id: WorkspaceId,
    pub generation: u64,
    #[serde(default)]
    pub node_id: Option<String>,
    pub deleted_at_ms: i64,
}

/// `/berth/sessions/<id>`: the durable session -> workspace binding.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionRecord {
    pub version: u32,
    pub session_id: String,
    pub user: String,
    pub agent: String,
    pub workspace_id: WorkspaceId,
    pub created_at_ms: i64,
}

/// Load a node reported in its last heartbeat.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct NodeLoadRecord {
    pub workspaces: u32,
    pub running: u32,
    pub execs_in_flight: u32,
    pub load_avg_1m: f64,
    pub mem_available_bytes: u64,
}

/// `/berth/nodes/<id>`, attached to the node's lease: it exists exactly while the node is
/// live. Rewritten by the replica holding the node's heartbeat stream, at most every few
/// seconds (never once per request).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeRecord {
    pub version: u32,
    pub node_id: String,
    pub address: String,
    pub backends: Vec<String>,
    pub default_backend: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub capacity_workspaces: u32,
    pub lease_id: i64,
    pub node_generation: u64,
    /// Replica holding the heartbeat stream.
    pub replica_id: String,
    pub last_heartbeat_ms: i64,
    #[serde(default)]
    pub load: NodeLoadRecord,
    /// Last access per workspace on this node (unix ms), from heartbeats. Kept for older
    /// replicas; the sweeper of this version reads `workspace_use`.
    #[serde(default)]
    pub last_access_ms: BTreeMap<String, i64>,
    /// Use of each workspace on this node as of the last heartbeat; feeds the sweeper. Times
    /// are on the clock of the replica that received the heartbeat, the same clock as
    /// `last_heartbeat_ms`, so the sweeper never compares a node's clock with a replica's.
    #[serde(default)]
    pub workspace_use: BTreeMap<String, WorkspaceUse>,
    /// A copy of whether `/drains/<node_id>` exists, as of the last rewrite (for readers of
    /// etcd). Placement and the admin API read the drain key through the view instead.
    #[serde(default)]
    pub draining: bool,
    #[serde(default)]
    pub agent_version: String,
    /// The node has a snapshot store: it snapshots its workspaces and restores from them.
    #[serde(default)]
    pub snapshots: bool,
}

/// One workspace's use as its node last reported it (a field of [`NodeRecord`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct WorkspaceUse {
    /// The placement the node reported on; a report of an older generation says nothing
    /// about the current placement.
    pub generation: u64,
    /// Last use, on the receiving replica's clock: its time of receipt minus the age the
    /// node measured on its own clock.
    pub last_access_ms: i64,
    /// Execs running at the report: the workspace is in use whatever its last access says.
    pub execs_in_flight: u32,
    /// MCP servers with a live client at the report: in use too.
    pub mcp_clients_live: u32,
}

impl WorkspaceUse {
    /// The use a node reported, received at `received_at_ms` (this replica's clock). A node
    /// too old to report an age gives its own wall clock, the best there is.
    pub fn reported(
        generation: u64,
        idle_for_ms: Option<i64>,
        node_last_access_ms: i64,
        execs_in_flight: u32,
        received_at_ms: i64,
    ) -> Self {
        let last_access_ms = match idle_for_ms {
            Some(idle_for_ms) => received_at_ms - idle_for_ms.max(0),
            None => node_last_access_ms,
        };
        Self { generation, last_access_ms, execs_in_flight, mcp_clients_live: 0 }
    }

    /// Whether the node reported the workspace busy (execs or live MCP clients), so it is in
    /// use whatever its last access says.
    pub fn in_use(&self) -> bool {
        self.execs_in_flight > 0 || self.mcp_clients_live > 0
    }

    /// How long the workspace had been idle when the report was written (`reported_at_ms`
    /// is the record's `last_heartbeat_ms`, on the same clock).
    pub fn idle_at_report_ms(&self, reported_at_ms: i64) -> i64 {
        (reported_at_ms - self.last_access_ms).max(0)
    }
}

/// `/berth/drains/<node_id>`: the node gets no new placements and its workspaces were
/// released to be placed elsewhere. No lease: a drain outlives the node's lease, restarts
/// of the node and of every replica, until an operator undrains the node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainRecord {
    pub version: u32,
    pub node_id: String,
    /// Principal that drained the node.
    pub drained_by: String,
    pub drained_at_ms: i64,
    /// Workspaces released by the drain (their data stays on the node until it is removed).
    #[serde(default)]
    pub released: Vec<String>,
}

/// `/berth/replicas/<id>`, attached to the replica's lease.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaRecord {
    pub version: u32,
    pub replica_id: String,
    pub address: String,
    pub started_at_ms: i64,
}

pub fn encode<T: Serialize>(record: &T) -> Bytes {
    // Serialising these plain structs cannot fail (string keys, no custom serialisers).
    Bytes::from(serde_json::to_vec(record).unwrap_or_default())
}

/// The version of a record that starts `{"version":<digits>` followed by `,` or `}` — how
/// [`encode`] writes every record (its first field) — or `None`.
fn leading_version(value: &[u8]) -> Option<u32> {
    let rest = value.strip_prefix(br#"{"version":"#)?;
    let digits = rest.iter().take_while(|byte| byte.is_ascii_digit()).count();
    if digits == 0 || !matches!(rest.get(digits), Some(b',' | b'}')) {
        return None;
    }
    std::str::from_utf8(&rest[..digits]).ok()?.parse().ok()
}

pub fn decode<T: DeserializeOwned>(key: &str, value: &[u8]) -> Result<T, RegistryError> {
    #[derive(Deserialize)]
    struct Versioned {
        version: u32,
    }
    // Records are written with `version` first, so it is read without parsing the record
    // twice (a replica decodes every record when it starts); anything else is parsed whole.
    let version = match leading_version(value) {
        Some(version) => version,
        None => {
            serde_json::from_slice::<Versioned>(value)
                .map_err(|error| RegistryError::Corrupt { key: key.to_owned(), reason: error.to_string() })?
                .version
        }
    };
    if version > RECORD_VERSION {
        return Err(RegistryError::Corrupt {
            key: key.to_owned(),
            reason: format!("record version {version} is newer than this build's {RECORD_VERSION}"),
        });
    }
    serde_json::from_slice(value)
        .map_err(|error| RegistryError::Corrupt { key: key.to_owned(), reason: error.to_string() })
}

pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|elapsed| elapsed.as_millis() as i64).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_roundtrip_and_refuse_garbage() {
        let record = SessionRecord {
            version: RECORD_VERSION,
            session_id: "s1".into(),
            user: "u".into(),
            agent: "a".into(),
            workspace_id: WorkspaceId::new("ws-1").unwrap(),
            created_at_ms: 5,
        };
        let bytes = encode(&record);
        assert_eq!(decode::<SessionRecord>("k", &bytes).unwrap(), record);
        assert!(matches!(decode::<SessionRecord>("k", b"{"), Err(RegistryError::Corrupt { .. })));
        assert!(matches!(decode::<SessionRecord>("k", br#"{"version":99}"#), Err(RegistryError::Corrupt { .. })));
        // An invalid workspace id inside a record is refused at decode time.
        let bad = br#"{"version":1,"session_id":"s","user":"u","agent":"a","workspace_id":"../x","created_at_ms":1}"#;
        assert!(decode::<SessionRecord>("k", bad).is_err());
    }

    /// The version is read from the front of a record as `encode` writes it, and from
    /// anywhere in it otherwise: a newer record is refused either way, naming its version.
    #[test]
    fn a_record_newer_than_this_build_is_refused_wherever_its_version_stands() {
        assert_eq!(leading_version(br#"{"version":1,"x":2}"#), Some(1));
        assert_eq!(leading_version(br#"{"version":17}"#), Some(17));
        for other in
            [&br#"{"version":1x}"#[..], br#"{"version":}"#, br#"{ "version":1}"#, br#"{"version":99999999999}"#, b""]
        {
            assert_eq!(leading_version(other), None, "{}", String::from_utf8_lossy(other));
        }
        let newer = RECORD_VERSION + 1;
        let front = format!(
            r#"{{"version":{newer},"session_id":"s","user":"u","agent":"a","workspace_id":"ws-1","created_at_ms":1}}"#
        );
        let back = format!(
            r#"{{"session_id":"s","user":"u","agent":"a","workspace_id":"ws-1","created_at_ms":1,"version":{newer}}}"#
        );
        for value in [front, back] {
            match decode::<SessionRecord>("k", value.as_bytes()) {
                Err(RegistryError::Corrupt { reason, .. }) => {
                    assert!(reason.contains(&format!("record version {newer} is newer")), "{reason}")
                }
                other => panic!("{value}: {other:?}"),
            }
        }
        let current = format!(
            r#"{{"session_id":"s","user":"u","agent":"a","workspace_id":"ws-1","created_at_ms":1,"version":{RECORD_VERSION}}}"#
        );
        assert_eq!(decode::<SessionRecord>("k", current.as_bytes()).unwrap().session_id, "s");
    }

    /// The node's clock never meets the replica's: a node an hour behind (or ahead) that
    /// used a workspace 200 ms ago reports it 200 ms idle, whatever its wall clock says.
    #[test]
    fn a_skewed_node_clock_does_not_change_how_long_a_workspace_was_idle() {
        let received_at_ms = 1_800_000_000_000;
        for skew_ms in [-3_600_000, 0, 3_600_000] {
            let node_wall_clock_access = received_at_ms + skew_ms - 200;
            let reported = WorkspaceUse::reported(3, Some(200), node_wall_clock_access, 0, received_at_ms);
            assert_eq!(reported.idle_at_report_ms(received_at_ms), 200, "skew {skew_ms} ms");
        }
        // A node too old to report an age falls back to its wall clock.
        let old_node = WorkspaceUse::reported(3, None, received_at_ms - 5_000, 0, received_at_ms);
        assert_eq!(old_node.idle_at_report_ms(received_at_ms), 5_000);
    }
}
