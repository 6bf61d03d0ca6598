//! The operator's word on resources: a default and a ceiling for every limit a caller may
//! set (workspace spec: memory, CPU, pids, file size, CPU time; exec: timeout, output), and
//! the node-wide budget of buffered exec output.
//!
//! A request's zero means "the operator default"; the default of a limit with a ceiling
//! but no default is the ceiling (zero would mean "unlimited", which is over it). A value
//! above its ceiling is refused with [`NodeError::AboveCeiling`] (INVALID_ARGUMENT +
//! `x-berth-error: limit-exceeded`, like every static limit: the request can never succeed
//! here, retrying does not help). A budget that is merely used up right now is
//! [`NodeError::OutputBudgetExhausted`] (RESOURCE_EXHAUSTED: retry later).

use std::sync::Arc;
use std::time::Duration;

use berth_proto::v1;
use berth_workspace::WorkspaceSpec;
use berth_workspace::backend::{
    DEFAULT_EXEC_TIMEOUT, DEFAULT_MAX_OUTPUT_BYTES, MAX_EXEC_TIMEOUT, MAX_OUTPUT_BYTES_LIMIT,
};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::NodeError;

/// A default and a ceiling; `0` in either is "none".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bound {
    pub default: u64,
    pub ceiling: u64,
}

impl Bound {
    pub const fn new(default: u64, ceiling: u64) -> Self {
        Self { default, ceiling }
    }

    /// What a request of `requested` gets (`0`: the default), or the refusal.
    fn resolve(self, limit: &'static str, flag: &'static str, requested: u64) -> Result<u64, NodeError> {
        let value = match requested {
            0 if self.default != 0 => self.default,
            0 => self.ceiling,
            value => value,
        };
        if self.ceiling != 0 && value > self.ceiling {
            return Err(NodeError::AboveCeiling { limit, flag, requested: value, ceiling: self.ceiling });
        }
        Ok(value)
    }

    fn check(self, flag: &'static str) -> Result<(), String> {
        if self.ceiling != 0 && self.default > self.ceiling {
            return Err(format!(
                "the default of --ceiling-{flag} ({}) is above its ceiling ({})",
                self.default, self.ceiling
            ));
        }
        Ok(())
    }
}

/// Defaults and ceilings of the workspace spec and of execs on this node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeLimits {
    pub memory_bytes: Bound,
    pub cpu_millis: Bound,
    pub pids: Bound,
    /// The spec's `file_size_bytes` (largest file a process may write: the disk limit a
    /// spec can set).
    pub file_size_bytes: Bound,
    pub cpu_time_secs: Bound,
    /// Milliseconds.
    pub exec_timeout_ms: Bound,
    /// Per stream (stdout, stderr) of one exec.
    pub exec_output_bytes: Bound,
}

impl Default for NodeLimits {
    /// No spec ceilings; execs as the wire contract's static limits (60 s default, 24 h
    /// ceiling; 1 MiB default, 64 MiB ceiling per stream).
    fn default() -> Self {
        Self {
            memory_bytes: Bound::default(),
            cpu_millis: Bound::default(),
            pids: Bound::default(),
            file_size_bytes: Bound::default(),
            cpu_time_secs: Bound::default(),
            exec_timeout_ms: Bound::new(DEFAULT_EXEC_TIMEOUT.as_millis() as u64, MAX_EXEC_TIMEOUT.as_millis() as u64),
            exec_output_bytes: Bound::new(DEFAULT_MAX_OUTPUT_BYTES as u64, MAX_OUTPUT_BYTES_LIMIT as u64),
        }
    }
}

impl NodeLimits {
    pub fn validate(&self) -> Result<(), String> {
        for (bound, flag) in [
            (self.memory_bytes, "memory-bytes"),
            (self.cpu_millis, "cpu-millis"),
            (self.pids, "pids"),
            (self.file_size_bytes, "file-size-bytes"),
            (self.cpu_time_secs, "cpu-time-secs"),
            (self.exec_timeout_ms, "exec-timeout"),
            (self.exec_output_bytes, "output-bytes"),
        ] {
            bound.check(flag)?;
        }
        // The replica checks requests against the static limits before they get here, and
        // its node-call deadline assumes no exec outlives MAX_EXEC_TIMEOUT.
        let timeout_max = MAX_EXEC_TIMEOUT.as_millis() as u64;
        if !(1..=timeout_max).contains(&self.exec_timeout_ms.ceiling) {
            return Err(format!("--ceiling-exec-timeout must be between 1ms and {}s", MAX_EXEC_TIMEOUT.as_secs()));
        }
        if !(1..=MAX_OUTPUT_BYTES_LIMIT as u64).contains(&self.exec_output_bytes.ceiling) {
            return Err(format!("--ceiling-output-bytes must be between 1 and {MAX_OUTPUT_BYTES_LIMIT}"));
        }
        Ok(())
    }

    /// Fills a spec's zeros with the defaults and refuses values above a ceiling.
    pub fn apply_to_spec(&self, spec: &mut WorkspaceSpec) -> Result<(), NodeError> {
        spec.memory_bytes = self.memory_bytes.resolve("memory bytes", "--ceiling-memory-bytes", spec.memory_bytes)?;
        spec.cpu_millis =
            narrow(self.cpu_millis.resolve("cpu millis", "--ceiling-cpu-millis", spec.cpu_millis.into())?);
        spec.pids = narrow(self.pids.resolve("pids", "--ceiling-pids", spec.pids.into())?);
        spec.file_size_bytes =
            self.file_size_bytes.resolve("file size bytes", "--ceiling-file-size-bytes", spec.file_size_bytes)?;
        spec.cpu_time_secs = narrow(self.cpu_time_secs.resolve(
            "cpu time secs",
            "--ceiling-cpu-time-secs",
            spec.cpu_time_secs.into(),
        )?);
        Ok(())
    }

    /// Brings a spec that already exists (restored after a restart) under today's
    /// defaults and ceilings: zeros get the default, a value above a ceiling is lowered to
    /// it rather than refused, since the workspace is there. Returns the limits lowered.
    pub fn clamp_spec(&self, spec: &mut WorkspaceSpec) -> Vec<&'static str> {
        let mut lowered = Vec::new();
        let mut clamp = |bound: Bound, limit: &'static str, value: u64| {
            let value = match value {
                0 if bound.default != 0 => bound.default,
                0 => bound.ceiling,
                value => value,
            };
            if bound.ceiling != 0 && value > bound.ceiling {
                lowered.push(limit);
                return bound.ceiling;
            }
            value
        };
        spec.memory_bytes = clamp(self.memory_bytes, "memory bytes", spec.memory_bytes);
        spec.cpu_millis = narrow(clamp(self.cpu_millis, "cpu millis", spec.cpu_millis.into()));
        spec.pids = narrow(clamp(self.pids, "pids", spec.pids.into()));
        spec.file_size_bytes = clamp(self.file_size_bytes, "file size bytes", spec.file_size_bytes);
        spec.cpu_time_secs = narrow(clamp(self.cpu_time_secs, "cpu time secs", spec.cpu_time_secs.into()));
        lowered
    }

    /// Fills an exec request's zero timeout / output cap with the defaults and refuses
    /// values above a ceiling.
    pub fn apply_to_exec(&self, request: &mut v1::ExecRequest) -> Result<(), NodeError> {
        request.timeout_ms =
            self.exec_timeout_ms.resolve("exec timeout (ms)", "--ceiling-exec-timeout", request.timeout_ms)?;
        request.max_output_bytes =
            self.exec_output_bytes.resolve("max output bytes", "--ceiling-output-bytes", request.max_output_bytes)?;
        Ok(())
    }

    pub fn exec_timeout_ceiling(&self) -> Duration {
        Duration::from_millis(self.exec_timeout_ms.ceiling)
    }
}

/// u32 fields: a ceiling set from a u32 flag never exceeds u32, and a request's value came
/// from a u32; saturate rather than wrap should a default ever be configured larger.
fn narrow(value: u64) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX)
}

/// The node-wide budget of exec output held in memory. A unary exec buffers up to
/// `2 × max_output_bytes` (stdout and stderr) before it answers; it reserves that much
/// before it starts, and is refused at once when the budget cannot cover it — never
/// queued, so a flood of big-output execs cannot stall the node or exhaust its memory.
/// MCP tool calls draw from the same budget (their results are buffered the same way).
/// Accounted in KiB (a semaphore counts permits in `u32` per acquire).
#[derive(Clone)]
pub struct OutputBudget {
    kib: Arc<Semaphore>,
    total_bytes: u64,
}

/// Reserved output budget, returned when dropped.
pub struct OutputReservation {
    _permit: OwnedSemaphorePermit,
}

impl OutputBudget {
    pub fn new(total_bytes: u64) -> Self {
        let kib = usize::try_from(total_bytes / 1024).unwrap_or(Semaphore::MAX_PERMITS).min(Semaphore::MAX_PERMITS);
        Self { kib: Arc::new(Semaphore::new(kib)), total_bytes }
    }

    /// Reserves the buffer of one unary exec whose streams are capped at
    /// `max_output_bytes` each.
    pub fn reserve(&self, max_output_bytes: u64) -> Result<OutputReservation, NodeError> {
        self.reserve_bytes(max_output_bytes.saturating_mul(2))
    }

    /// Reserves `wanted` bytes (an MCP tool result: the most one can hold).
    pub fn reserve_bytes(&self, wanted: u64) -> Result<OutputReservation, NodeError> {
        let exhausted =
            || NodeError::OutputBudgetExhausted { wanted, available: self.available(), budget: self.total_bytes };
        let kib = u32::try_from(wanted.div_ceil(1024)).map_err(|_| exhausted())?;
        match Arc::clone(&self.kib).try_acquire_many_owned(kib) {
            Ok(permit) => Ok(OutputReservation { _permit: permit }),
            Err(_) => Err(exhausted()),
        }
    }

    /// Bytes not reserved right now.
    pub fn available(&self) -> u64 {
        self.kib.available_permits() as u64 * 1024
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restored_spec_is_brought_under_lowered_ceilings() {
        let limits =
            NodeLimits { memory_bytes: Bound::new(0, 128 << 20), pids: Bound::new(64, 256), ..NodeLimits::default() };
        let mut stored = WorkspaceSpec { memory_bytes: 0, pids: 1000, cpu_millis: 500, ..WorkspaceSpec::default() };
        let lowered = limits.clamp_spec(&mut stored);
        assert_eq!(lowered, ["pids"]);
        assert_eq!(stored.memory_bytes, 128 << 20, "a stored 0 (unlimited then) gets today's ceiling");
        assert_eq!(stored.pids, 256);
        assert_eq!(stored.cpu_millis, 500, "no ceiling, unchanged");
    }

    #[test]
    fn zero_means_the_default_and_ceilings_refuse_naming_limit_value_and_flag() {
        let limits = NodeLimits {
            memory_bytes: Bound::new(256 << 20, 1 << 30),
            pids: Bound::new(0, 512),
            ..NodeLimits::default()
        };
        let mut spec = WorkspaceSpec::default();
        limits.apply_to_spec(&mut spec).unwrap();
        assert_eq!((spec.memory_bytes, spec.pids, spec.cpu_millis), (256 << 20, 512, 0));
        let mut greedy = WorkspaceSpec { memory_bytes: 2 << 30, ..WorkspaceSpec::default() };
        let error = limits.apply_to_spec(&mut greedy).unwrap_err().to_string();
        assert!(
            error.contains("memory bytes")
                && error.contains(&(2u64 << 30).to_string())
                && error.contains(&(1u64 << 30).to_string())
                && error.contains("--ceiling-memory-bytes"),
            "{error}"
        );
        let mut exec = v1::ExecRequest { max_output_bytes: 65 << 20, ..Default::default() };
        assert!(limits.apply_to_exec(&mut exec).unwrap_err().to_string().contains("--ceiling-output-bytes"));
        let mut exec = v1::ExecRequest::default();
        limits.apply_to_exec(&mut exec).unwrap();
        assert_eq!((exec.timeout_ms, exec.max_output_bytes), (60_000, 1 << 20));
        let inverted = NodeLimits { pids: Bound::new(10, 5), ..NodeLimits::default() };
        assert!(inverted.validate().unwrap_err().contains("pids"));
    }

    #[test]
    fn the_output_budget_refuses_at_once_and_returns_on_drop() {
        let budget = OutputBudget::new(4 << 20);
        let first = budget.reserve(1 << 20).unwrap();
        let second = budget.reserve(1 << 20).unwrap();
        let refused = budget.reserve(1).err().map(|error| error.to_string()).unwrap_or_default();
        assert!(refused.contains("output budget"), "{refused}");
        drop(first);
        assert!(budget.reserve(1 << 20).is_ok());
        drop(second);
        assert_eq!(budget.available(), 4 << 20);
    }
}
