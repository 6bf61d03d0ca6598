//! The backend drivers a node offers, by name.

use std::collections::HashMap;
use std::sync::Arc;

use berth_workspace::{BackendDriverRef, WorkspaceError};

use crate::config::NodeAgentConfig;

/// Builds the drivers named in the config; an unknown name is a configuration error.
pub fn build(config: &NodeAgentConfig) -> Result<HashMap<String, BackendDriverRef>, WorkspaceError> {
    let mut drivers: HashMap<String, BackendDriverRef> = HashMap::new();
    for name in &config.backends {
        let driver: BackendDriverRef = match name.as_str() {
            "local" => Arc::new(berth_workspace::local::LocalDriver::new()),
            other => {
                return Err(WorkspaceError::UnknownBackend { name: other.to_owned(), offered: "local".into() });
            }
        };
        drivers.insert(name.clone(), driver);
    }
    Ok(drivers)
}
