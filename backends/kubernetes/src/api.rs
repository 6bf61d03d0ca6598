//! The API server: the client (a kubeconfig file or the in-cluster service account), the
//! calls the driver makes on Pods and PVCs, and the rules every call follows.
//!
//! Retried with jittered backoff until the retry deadline: 429, 5xx, timeouts and
//! connection failures (every call here is idempotent or answers 409 when repeated).
//! Mapped: 401 / 403 to `ProviderAuth` naming the credential — except a 403 "exceeded
//! quota" (a ResourceQuota), which is `ProviderQuota` like a 429 past the deadline; other
//! refusals to `Backend` with the server's reason and message.

use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use tokio::time::Instant;

use berth_workspace::error::{Result, WorkspaceError};

use crate::config::{BACKEND_NAME, KubernetesConfig};

const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// A create's outcome: made now, or there already (409).
pub(crate) enum Created<K> {
    New(K),
    Exists,
}

#[derive(Clone)]
pub(crate) struct Kube {
    pub pods: Api<Pod>,
    pub pvcs: Api<PersistentVolumeClaim>,
    /// Names the credential in errors (a path, or "the in-cluster service account").
    pub credential: String,
    request_timeout: Duration,
    retry_deadline: Duration,
}

fn unavailable(reason: String) -> WorkspaceError {
    WorkspaceError::BackendUnavailable { backend: BACKEND_NAME, reason }
}

/// A kube error as the workspace error the caller can act on.
pub(crate) fn map_error(error: kube::Error, what: &str, credential: &str) -> WorkspaceError {
    match error {
        kube::Error::Api(status) => {
            let message = format!("{what}: {} ({})", status.message, status.reason);
            match status.code {
                403 if status.message.contains("exceeded quota") => {
                    WorkspaceError::ProviderQuota { provider: BACKEND_NAME, message }
                }
                401 | 403 => {
                    WorkspaceError::ProviderAuth { provider: BACKEND_NAME, credential: credential.to_owned(), message }
                }
                429 => WorkspaceError::ProviderQuota { provider: BACKEND_NAME, message },
                code if code >= 500 => unavailable(format!("{message}, HTTP {code}")),
                code => WorkspaceError::Backend { backend: BACKEND_NAME, message: format!("{message}, HTTP {code}") },
            }
        }
        other => unavailable(format!("{what}: {other}")),
    }
}

fn transient(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(status) => status.code == 429 || status.code >= 500,
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        _ => false,
    }
}

fn status_code(error: &kube::Error) -> Option<u16> {
    match error {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

impl Kube {
    /// Connects as the config says (nothing is sent until the first call).
    pub async fn connect(config: &KubernetesConfig) -> Result<Self> {
        // The tree's one crypto provider (docs/dependencies.md); an error means one is set.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let (kube_config, credential) = match &config.kubeconfig {
            Some(path) => {
                let credential = format!("kubeconfig {}", path.display());
                let kubeconfig = Kubeconfig::read_from(path)
                    .map_err(|error| unavailable(format!("cannot read the {credential}: {error}")))?;
                let options = KubeConfigOptions { context: config.context.clone(), ..KubeConfigOptions::default() };
                let kube_config = Config::from_custom_kubeconfig(kubeconfig, &options)
                    .await
                    .map_err(|error| unavailable(format!("the {credential} is not usable: {error}")))?;
                (kube_config, credential)
            }
            None => {
                let credential = "the in-cluster service account".to_owned();
                let kube_config = Config::incluster()
                    .map_err(|error| unavailable(format!("no in-cluster config ({error}); pass --kube-config-file")))?;
                (kube_config, credential)
            }
        };
        let client = Client::try_from(kube_config)
            .map_err(|error| unavailable(format!("cannot build the Kubernetes client: {error}")))?;
        Ok(Self {
            pods: Api::namespaced(client.clone(), &config.namespace),
            pvcs: Api::namespaced(client, &config.namespace),
            credential,
            request_timeout: config.request_timeout,
            retry_deadline: config.retry_deadline,
        })
    }

    /// Runs `call` (again on each attempt) under the retry rules; answers the status codes
    /// in `accept` as `Ok(None)`.
    async fn retry<T, F, Fut>(&self, what: &str, accept: &[u16], call: F) -> Result<Option<T>>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, kube::Error>>,
    {
        let deadline = Instant::now() + self.retry_deadline;
        let mut backoff = FIRST_BACKOFF;
        loop {
            let error = match tokio::time::timeout(self.request_timeout, call()).await {
                Ok(Ok(value)) => return Ok(Some(value)),
                Ok(Err(error)) if status_code(&error).is_some_and(|code| accept.contains(&code)) => return Ok(None),
                Ok(Err(error)) if transient(&error) && Instant::now() < deadline => error,
                Ok(Err(error)) => return Err(map_error(error, what, &self.credential)),
                Err(_) if Instant::now() < deadline => {
                    tracing::debug!(what, "kubernetes call timed out, retrying");
                    backoff = next_backoff(backoff).await;
                    continue;
                }
                Err(_) => {
                    return Err(WorkspaceError::Timeout {
                        operation: "a kubernetes API call",
                        millis: self.request_timeout.as_millis() as u64,
                    });
                }
            };
            tracing::debug!(what, %error, "kubernetes call failed, retrying");
            backoff = next_backoff(backoff).await;
        }
    }

    pub async fn get_pvc(&self, name: &str) -> Result<Option<PersistentVolumeClaim>> {
        self.retry("get a PVC", &[404], || self.pvcs.get(name)).await
    }

    pub async fn get_pod(&self, name: &str) -> Result<Option<Pod>> {
        self.retry("get a pod", &[404], || self.pods.get(name)).await
    }

    pub async fn list_pvcs(&self, selector: &str) -> Result<Vec<PersistentVolumeClaim>> {
        let params = ListParams::default().labels(selector);
        Ok(self.retry("list PVCs", &[], || self.pvcs.list(&params)).await?.map(|list| list.items).unwrap_or_default())
    }

    pub async fn list_pods(&self, selector: &str) -> Result<Vec<Pod>> {
        let params = ListParams::default().labels(selector);
        Ok(self.retry("list pods", &[], || self.pods.list(&params)).await?.map(|list| list.items).unwrap_or_default())
    }

    pub async fn create_pvc(&self, pvc: &PersistentVolumeClaim) -> Result<Created<PersistentVolumeClaim>> {
        let params = PostParams::default();
        Ok(match self.retry("create a PVC", &[409], || self.pvcs.create(&params, pvc)).await? {
            Some(created) => Created::New(created),
            None => Created::Exists,
        })
    }

    pub async fn create_pod(&self, pod: &Pod) -> Result<Created<Pod>> {
        let params = PostParams::default();
        Ok(match self.retry("create a pod", &[409], || self.pods.create(&params, pod)).await? {
            Some(created) => Created::New(created),
            None => Created::Exists,
        })
    }

    /// Replaces a PVC's metadata if its `resourceVersion` is still the one read (`None`:
    /// someone wrote it meanwhile, 409).
    pub async fn replace_pvc(&self, pvc: &PersistentVolumeClaim) -> Result<Option<PersistentVolumeClaim>> {
        let name = pvc.metadata.name.clone().unwrap_or_default();
        let params = PostParams::default();
        self.retry("update a PVC", &[409], || self.pvcs.replace(&name, &params, pvc)).await
    }

    /// Deletes a Pod now (grace period 0: its processes belong to no one any more).
    pub async fn delete_pod(&self, name: &str) -> Result<()> {
        let params = DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() };
        self.retry("delete a pod", &[404], || self.pods.delete(name, &params)).await.map(|_| ())
    }

    pub async fn delete_pvc(&self, name: &str) -> Result<()> {
        let params = DeleteParams::default();
        self.retry("delete a PVC", &[404], || self.pvcs.delete(name, &params)).await.map(|_| ())
    }
}

async fn next_backoff(backoff: Duration) -> Duration {
    let jitter = Duration::from_millis(rand::random::<u64>() % (backoff.as_millis() as u64 + 1));
    tokio::time::sleep(backoff + jitter).await;
    (backoff * 2).min(MAX_BACKOFF)
}
