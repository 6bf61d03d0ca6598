//! `ContractService`: MCP servers, skills, context offload and tree transfer. Every RPC of
//! `berth_proto::contract_rpcs!` is validated in `forward.rs` (the node validates again),
//! then forwarded by [`Forwarder`] to the node holding the workspace, with one retry on a
//! stale route like the file calls. Client-streaming calls (AddSkill, UploadTree) cannot be
//! replayed, so they resolve the target first and pipe; a broken client stream reaches the
//! node as a reset.

use std::sync::Arc;
use std::time::Duration;

use berth_proto::v1::contract_service_server::ContractService;

use crate::authz::Access;
use crate::forward::{Forwarder, forwarding};
use crate::router::Router;

pub struct ContractApi {
    forward: Forwarder,
}

impl ContractApi {
    pub fn new(router: Arc<Router>, access: Access, node_call_timeout: Duration) -> Self {
        Self { forward: Forwarder::new(router, access, node_call_timeout) }
    }
}

berth_proto::contract_rpcs! {
    forwarding!(impl ContractService for ContractApi, to contract)
}
