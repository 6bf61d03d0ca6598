//! The workload's calls: one replica at a time, each call under a client deadline (a
//! SIGSTOPped replica never answers), and the ground truth of a workspace's lineage read
//! straight from etcd, past every replica.

use std::sync::Arc;
use std::time::Duration;

use berth_control_plane::keys::Keys;
use berth_control_plane::records::{self, Origin, WorkspaceRecord};
use berth_control_plane::registry::Registry;
use berth_control_plane::registry::etcd::EtcdRegistry;
use berth_proto::v1;
use berth_proto::v1::workspace_service_client::WorkspaceServiceClient;
use berth_workspace::WorkspaceId;
use futures::StreamExt;
use tonic::transport::Channel;
use tonic::{Code, Status};

/// How long a client waits for one answer.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(6);

/// The lineage of a workspace's files as etcd records it: the `origin_generation` of its
/// record (`None` when it has no record). Two reads that agree bracket a stretch in which no
/// placement lost or replaced the files.
pub type Lineage = Option<u64>;

/// What etcd says about a workspace, read linearizably.
#[derive(Clone, Debug)]
pub struct Truth {
    pub lineage: Lineage,
    pub origin: Option<Origin>,
}

/// The replicas (by endpoint, each with one lazily reconnecting channel: a replica restarted
/// in place is reached again) and etcd.
#[derive(Clone)]
pub struct Clients {
    replicas: Vec<Channel>,
    registry: Arc<EtcdRegistry>,
    keys: Keys,
}

impl Clients {
    pub fn new(replica_endpoints: &[String], registry: Arc<EtcdRegistry>, keys: Keys) -> Self {
        let replicas = replica_endpoints.iter().map(|endpoint| crate::berth::channel(endpoint)).collect();
        Self { replicas, registry, keys }
    }

    pub fn replica_count(&self) -> usize {
        self.replicas.len()
    }

    fn workspaces(&self, replica: usize) -> WorkspaceServiceClient<Channel> {
        WorkspaceServiceClient::new(self.replicas[replica % self.replicas.len()].clone())
    }

    /// etcd's record of `workspace_id`, retried while etcd answers errors (a member was
    /// killed; the client moves to another) for up to 20 s.
    pub async fn truth(&self, workspace_id: &str) -> anyhow::Result<Truth> {
        let key = self.keys.workspace(&WorkspaceId::new(workspace_id)?);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            match self.registry.get(&key).await {
                Ok(Some(kv)) => {
                    let record: WorkspaceRecord = records::decode(&key, &kv.value)?;
                    return Ok(Truth { lineage: Some(record.origin_generation), origin: Some(record.origin) });
                }
                Ok(None) => return Ok(Truth { lineage: None, origin: None }),
                Err(error) if tokio::time::Instant::now() >= deadline => {
                    anyhow::bail!("etcd did not answer for 20 s: {error}")
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    pub async fn create_session(&self, replica: usize, user: &str) -> Result<String, Status> {
        let request = v1::CreateSessionRequest { user_id: user.into(), agent_id: "agent".into(), ..Default::default() };
        let mut client = self.workspaces(replica);
        let session = within(client.create_session(request)).await?;
        Ok(session.workspace_id)
    }

    pub async fn write(&self, replica: usize, workspace_id: &str, path: &str, data: &[u8]) -> Result<(), Status> {
        let header = v1::WriteFileHeader { workspace_id: workspace_id.into(), path: path.into(), mode: 0 };
        let messages = berth_proto::convert::write_file_messages(header, data, data.len().max(1));
        let mut client = self.workspaces(replica);
        within(client.write_file(futures::stream::iter(messages))).await.map(|_| ())
    }

    pub async fn read(&self, replica: usize, workspace_id: &str, path: &str) -> Result<Vec<u8>, Status> {
        let request = v1::ReadFileRequest { workspace_id: workspace_id.into(), path: path.into(), chunk_size: 0 };
        let mut client = self.workspaces(replica);
        let read = async move {
            let mut chunks = client.read_file(request).await?.into_inner();
            let mut data = Vec::new();
            while let Some(chunk) = chunks.next().await {
                data.extend_from_slice(&chunk?.data);
            }
            Ok(data)
        };
        match tokio::time::timeout(CALL_TIMEOUT, read).await {
            Ok(outcome) => outcome,
            Err(_) => Err(Status::deadline_exceeded("no answer within the client deadline")),
        }
    }

    pub async fn destroy(&self, replica: usize, workspace_id: &str) -> Result<(), Status> {
        let request = v1::CloseWorkspaceRequest { workspace_id: workspace_id.into(), destroy: true };
        let mut client = self.workspaces(replica);
        within(client.close_workspace(request)).await.map(|_| ())
    }

    pub async fn get_workspace(&self, replica: usize, workspace_id: &str) -> Result<v1::Workspace, Status> {
        let request = v1::GetWorkspaceRequest { workspace_id: workspace_id.into() };
        let mut client = self.workspaces(replica);
        within(client.get_workspace(request)).await
    }
}

async fn within<T>(call: impl std::future::Future<Output = Result<tonic::Response<T>, Status>>) -> Result<T, Status> {
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(outcome) => outcome.map(tonic::Response::into_inner),
        Err(_) => Err(Status::deadline_exceeded("no answer within the client deadline")),
    }
}

/// A read that says the file is not there (as opposed to "could not ask", or "no such
/// workspace" from a replica whose view has not seen it yet).
pub fn is_missing_file(status: &Status) -> bool {
    status.code() == Code::NotFound && status.message().starts_with("path ")
}
