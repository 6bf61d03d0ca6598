//! Turning wire values into the short strings the CLI prints: timestamps, ages, enum
//! names, file modes. Pure functions, shared by table and JSON output.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use berth_proto::v1::{FileKind, IsolationPolicy, NodeState, WorkspaceState};

/// Last second humantime can print (9999-12-31T23:59:59Z); past it, and before the epoch,
/// its formatter panics, and timestamps come from the network.
const MAX_FORMATTABLE_SECONDS: i64 = 253_402_300_799;

/// A protobuf timestamp as a `SystemTime`, or `None` when it is out of range.
pub fn to_system_time(timestamp: &prost_types::Timestamp) -> Option<SystemTime> {
    if !(0..=MAX_FORMATTABLE_SECONDS).contains(&timestamp.seconds) {
        return None;
    }
    let nanos = u32::try_from(timestamp.nanos).ok().filter(|nanos| *nanos < 1_000_000_000)?;
    let seconds = u64::try_from(timestamp.seconds).ok()?;
    UNIX_EPOCH.checked_add(Duration::new(seconds, nanos))
}

/// RFC 3339 in UTC; whole seconds print without a fraction, others with nine digits
/// (`2025-01-02T03:04:05Z`, `2025-01-02T03:04:05.500000000Z`).
/// A timestamp humantime cannot represent is printed as raw seconds rather than dropped.
pub fn rfc3339(timestamp: &prost_types::Timestamp) -> String {
    match to_system_time(timestamp) {
        Some(time) => humantime::format_rfc3339(time).to_string(),
        None => format!("invalid timestamp ({}s {}ns)", timestamp.seconds, timestamp.nanos),
    }
}

/// [`rfc3339`] of an optional message field; unset stays unset (JSON `null`).
pub fn rfc3339_opt(timestamp: Option<&prost_types::Timestamp>) -> Option<String> {
    timestamp.map(rfc3339)
}

/// RFC 3339 at second precision, for table cells where nanoseconds are noise.
pub fn rfc3339_seconds_cell(timestamp: Option<&prost_types::Timestamp>) -> String {
    match timestamp {
        None => "-".to_string(),
        Some(timestamp) => match to_system_time(timestamp) {
            Some(time) => humantime::format_rfc3339_seconds(time).to_string(),
            None => rfc3339(timestamp),
        },
    }
}

/// How long ago `timestamp` was, relative to `now`, in the largest whole unit
/// (`2s ago`, `5m ago`, `3h ago`, `2d ago`). A timestamp ahead of `now` (clock skew
/// between hosts) reads as `0s ago`; an unset one as `never`.
pub fn age(timestamp: Option<&prost_types::Timestamp>, now: SystemTime) -> String {
    let Some(timestamp) = timestamp else {
        return "never".to_string();
    };
    let Some(then) = to_system_time(timestamp) else {
        return rfc3339(timestamp);
    };
    let seconds = now.duration_since(then).unwrap_or_default().as_secs();
    match seconds {
        0..60 => format!("{seconds}s ago"),
        60..3_600 => format!("{}m ago", seconds / 60),
        3_600..86_400 => format!("{}h ago", seconds / 3_600),
        _ => format!("{}d ago", seconds / 86_400),
    }
}

/// Permission bits as four octal digits (`0644`); file-type bits are dropped because the
/// kind has its own column.
pub fn mode_octal(mode: u32) -> String {
    format!("{:04o}", mode & 0o7777)
}

/// `PREFIX_SOME_NAME` -> `some-name`: the short lowercase form of a proto enum name.
fn short_name(full_name: &str, prefix: &str) -> String {
    full_name.strip_prefix(prefix).unwrap_or(full_name).to_ascii_lowercase().replace('_', "-")
}

/// Names an enum value the server sent that this CLI does not know yet (newer server).
fn unknown(value: i32) -> String {
    format!("unknown({value})")
}

pub fn policy_name(value: i32) -> String {
    IsolationPolicy::try_from(value)
        .map_or_else(|_| unknown(value), |policy| short_name(policy.as_str_name(), "ISOLATION_POLICY_"))
}

pub fn workspace_state_name(value: i32) -> String {
    WorkspaceState::try_from(value)
        .map_or_else(|_| unknown(value), |state| short_name(state.as_str_name(), "WORKSPACE_STATE_"))
}

pub fn workspace_origin_name(value: i32) -> String {
    berth_proto::v1::WorkspaceOrigin::try_from(value)
        .map_or_else(|_| unknown(value), |origin| short_name(origin.as_str_name(), "WORKSPACE_ORIGIN_"))
}

pub fn file_kind_name(value: i32) -> String {
    FileKind::try_from(value).map_or_else(|_| unknown(value), |kind| short_name(kind.as_str_name(), "FILE_KIND_"))
}

pub fn node_state_name(value: i32) -> String {
    NodeState::try_from(value).map_or_else(|_| unknown(value), |state| short_name(state.as_str_name(), "NODE_STATE_"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timestamp(seconds: i64, nanos: i32) -> prost_types::Timestamp {
        prost_types::Timestamp { seconds, nanos }
    }

    #[test]
    fn timestamps_are_rfc3339_utc() {
        assert_eq!(rfc3339(&timestamp(0, 0)), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(&timestamp(1_700_000_000, 500_000_000)), "2023-11-14T22:13:20.500000000Z");
        assert_eq!(rfc3339_seconds_cell(Some(&timestamp(1_700_000_000, 500_000_000))), "2023-11-14T22:13:20Z");
        assert_eq!(rfc3339_seconds_cell(None), "-");
        assert_eq!(rfc3339_opt(None), None);
    }

    #[test]
    fn out_of_range_timestamps_do_not_panic() {
        for bad in [
            timestamp(-1, 0),
            timestamp(MAX_FORMATTABLE_SECONDS + 1, 0),
            timestamp(0, -1),
            timestamp(0, 1_000_000_000),
            timestamp(i64::MAX, 0),
        ] {
            assert!(rfc3339(&bad).starts_with("invalid timestamp"), "{bad:?}");
            assert!(age(Some(&bad), SystemTime::now()).starts_with("invalid"));
        }
        assert_eq!(rfc3339(&timestamp(MAX_FORMATTABLE_SECONDS, 999_999_999)), "9999-12-31T23:59:59.999999999Z");
    }

    #[test]
    fn ages_use_the_largest_whole_unit() {
        let now = UNIX_EPOCH + Duration::from_secs(1_000_000);
        let ago = |seconds: i64| age(Some(&timestamp(1_000_000 - seconds, 0)), now);
        assert_eq!(ago(0), "0s ago");
        assert_eq!(ago(2), "2s ago");
        assert_eq!(ago(59), "59s ago");
        assert_eq!(ago(60), "1m ago");
        assert_eq!(ago(3_599), "59m ago");
        assert_eq!(ago(7_200), "2h ago");
        assert_eq!(ago(2 * 86_400 + 5), "2d ago");
        assert_eq!(ago(-30), "0s ago");
        assert_eq!(age(None, now), "never");
    }

    #[test]
    fn enums_print_short_lowercase_names() {
        assert_eq!(policy_name(IsolationPolicy::PerAgent as i32), "per-agent");
        assert_eq!(policy_name(IsolationPolicy::PerSession as i32), "per-session");
        assert_eq!(workspace_state_name(WorkspaceState::Ready as i32), "ready");
        assert_eq!(workspace_state_name(WorkspaceState::Unspecified as i32), "unspecified");
        assert_eq!(file_kind_name(FileKind::File as i32), "file");
        assert_eq!(file_kind_name(FileKind::Directory as i32), "directory");
        assert_eq!(node_state_name(NodeState::Draining as i32), "draining");
        assert_eq!(node_state_name(42), "unknown(42)");
    }

    #[test]
    fn modes_are_four_octal_digits_without_type_bits() {
        assert_eq!(mode_octal(0o644), "0644");
        assert_eq!(mode_octal(0o100755), "0755");
        assert_eq!(mode_octal(0o41777), "1777");
    }
}
