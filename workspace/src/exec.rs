//! Derived exec: drives a [`Spawned`] process to completion (stdin, timeout, output caps).
use futures::stream::BoxStream;

use crate::backend::{ExecEvent, ExecOutput, ExecSpec, Spawned};
use crate::error::Result;

pub async fn run_to_completion(_spawned: Spawned, _spec: &ExecSpec) -> Result<ExecOutput> {
    unimplemented!("exec::run_to_completion")
}

pub fn stream_events(_spawned: Spawned, _spec: ExecSpec) -> BoxStream<'static, Result<ExecEvent>> {
    unimplemented!("exec::stream_events")
}
