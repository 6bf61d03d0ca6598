//! `S3Store`: snapshots in any S3-compatible object store (`object_store`'s S3 client,
//! SigV4 signed with ring; see docs/dependencies.md).
//!
//! ```text
//! PREFIX/blobs/ab/abcdef…(64 hex)
//! PREFIX/manifests/WORKSPACE/SNAPSHOT
//! ```
//!
//! A single S3 PUT is atomic (readers see the old object or the new one) and idempotent, so
//! no temp names are needed; a blob's write time is its object's `LastModified`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::TryStreamExt;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path as ObjectPath;
use object_store::{ClientOptions, ObjectStore, ObjectStoreExt, PutPayload, RetryConfig};

use super::names::{validate_hash, validate_snapshot_id, validate_workspace_id};
use super::seam::{BlobEntry, SnapshotStore};
use crate::error::SnapshotError;

pub struct S3Store {
    client: Arc<AmazonS3>,
    /// Object key prefix without leading or trailing slash (may be empty).
    prefix: String,
    description: String,
}

impl std::fmt::Debug for S3Store {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("S3Store").field("store", &self.description).finish_non_exhaustive()
    }
}

impl S3Store {
    /// `s3://BUCKET[/PREFIX][?endpoint=URL&region=R&credentials_file=PATH&profile=P]`.
    ///
    /// Credentials: the `AWS_*` environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
    /// `AWS_SESSION_TOKEN`, `AWS_REGION`, `AWS_ENDPOINT_URL`…) first, then
    /// `credentials_file`, an AWS shared-credentials file (`[profile]` sections with
    /// `aws_access_key_id` / `aws_secret_access_key` / `aws_session_token`; profile `default`
    /// unless `profile=` says otherwise), whose values win over the environment.
    pub fn open(url: &str) -> Result<S3Store, SnapshotError> {
        let invalid = |reason: String| SnapshotError::InvalidUrl { url: super::names::redact(url), reason };
        let parsed = url::Url::parse(url).map_err(|error| invalid(error.to_string()))?;
        let bucket = parsed
            .host_str()
            .filter(|bucket| !bucket.is_empty())
            .ok_or_else(|| invalid("no bucket (s3://bucket/prefix)".to_owned()))?;
        if parsed.username() != "" || parsed.password().is_some() {
            return Err(invalid("credentials do not go in the url: use AWS_* or credentials_file".to_owned()));
        }
        let prefix = parsed.path().trim_matches('/').to_owned();
        if prefix.split('/').any(|part| part == ".." || part == ".") || prefix.contains("//") {
            return Err(invalid("prefix must not contain empty, . or .. segments".to_owned()));
        }
        let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket);
        let (mut endpoint, mut credentials_file, mut profile, mut region) = (None, None, "default".to_owned(), None);
        for (key, value) in parsed.query_pairs() {
            match key.as_ref() {
                "endpoint" => endpoint = Some(value.into_owned()),
                "region" => region = Some(value.into_owned()),
                "credentials_file" => credentials_file = Some(value.into_owned()),
                "profile" => profile = value.into_owned(),
                other => {
                    return Err(invalid(format!(
                        "unknown parameter {other:?} (endpoint, region, credentials_file, profile)"
                    )));
                }
            }
        }
        if let Some(region) = &region {
            builder = builder.with_region(region);
        }
        let mut client_options =
            ClientOptions::new().with_timeout(Duration::from_secs(60)).with_connect_timeout(Duration::from_secs(5));
        if let Some(endpoint) = &endpoint {
            let endpoint_url = url::Url::parse(endpoint).map_err(|error| invalid(format!("endpoint: {error}")))?;
            if !matches!(endpoint_url.scheme(), "http" | "https") {
                return Err(invalid("endpoint must be http:// or https://".to_owned()));
            }
            client_options = client_options.with_allow_http(endpoint_url.scheme() == "http");
            builder = builder.with_endpoint(endpoint.trim_end_matches('/')).with_virtual_hosted_style_request(false);
        }
        if let Some(path) = &credentials_file {
            let text = std::fs::read_to_string(path)
                .map_err(|source| SnapshotError::io("read credentials file", path, source))?;
            let values = profile_values(&text, &profile).ok_or_else(|| {
                SnapshotError::InvalidInput(format!("credentials file {path}: no [{profile}] section"))
            })?;
            for (key, value) in values {
                builder = match key.as_str() {
                    "aws_access_key_id" => builder.with_access_key_id(value),
                    "aws_secret_access_key" => builder.with_secret_access_key(value),
                    "aws_session_token" => builder.with_token(value),
                    _ => builder,
                };
            }
        }
        let retry = RetryConfig { max_retries: 3, retry_timeout: Duration::from_secs(60), ..RetryConfig::default() };
        // HTTPS needs a process-wide rustls provider; the tree's one is ring.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = builder
            .with_client_options(client_options)
            .with_retry(retry)
            .build()
            .map_err(|error| invalid(error.to_string()))?;
        let mut description = format!("s3://{bucket}/{prefix}");
        if let Some(endpoint) = &endpoint {
            description.push_str(&format!("?endpoint={endpoint}"));
        }
        Ok(S3Store { client: Arc::new(client), prefix, description })
    }

    fn key(&self, tail: &str) -> ObjectPath {
        if self.prefix.is_empty() {
            ObjectPath::from(tail)
        } else {
            ObjectPath::from(format!("{}/{tail}", self.prefix))
        }
    }

    fn blob_key(&self, hash: &str) -> ObjectPath {
        self.key(&format!("blobs/{}/{hash}", &hash[..2]))
    }

    fn manifest_key(&self, workspace_id: &str, snapshot_id: &str) -> ObjectPath {
        self.key(&format!("manifests/{workspace_id}/{snapshot_id}"))
    }

    fn failed(&self, operation: &'static str, error: object_store::Error) -> SnapshotError {
        SnapshotError::Store { store: self.description.clone(), operation, reason: error.to_string() }
    }

    async fn get(
        &self,
        key: &ObjectPath,
        kind: &'static str,
        name: String,
        operation: &'static str,
    ) -> Result<Bytes, SnapshotError> {
        let result = match self.client.get(key).await {
            Ok(result) => result,
            Err(object_store::Error::NotFound { .. }) => return Err(SnapshotError::not_found(kind, name)),
            Err(error) => return Err(self.failed(operation, error)),
        };
        result.bytes().await.map_err(|error| self.failed(operation, error))
    }

    /// Last path segments of the objects directly under `tail/`, or of its "directories".
    async fn list_names(&self, tail: &str, directories: bool) -> Result<Vec<String>, SnapshotError> {
        let listing =
            self.client.list_with_delimiter(Some(&self.key(tail))).await.map_err(|error| self.failed("list", error))?;
        let paths: Vec<ObjectPath> = if directories {
            listing.common_prefixes
        } else {
            listing.objects.into_iter().map(|meta| meta.location).collect()
        };
        Ok(paths.iter().filter_map(|path| path.filename().map(str::to_owned)).collect())
    }
}

/// `key = value` lines of one `[profile]` section of an AWS shared-credentials file.
fn profile_values(text: &str, profile: &str) -> Option<Vec<(String, String)>> {
    let mut in_profile = false;
    let mut found = false;
    let mut values = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(section) = line.strip_prefix('[').and_then(|rest| rest.strip_suffix(']')) {
            let section = section.trim();
            in_profile = section == profile || section == format!("profile {profile}");
            found |= in_profile;
            continue;
        }
        if in_profile && let Some((key, value)) = line.split_once('=') {
            values.push((key.trim().to_ascii_lowercase(), value.trim().to_owned()));
        }
    }
    found.then_some(values)
}

#[async_trait]
impl SnapshotStore for S3Store {
    fn describe(&self) -> String {
        self.description.clone()
    }

    fn name(&self) -> &'static str {
        "s3"
    }

    async fn put_blob(&self, hash: &str, data: Bytes) -> Result<(), SnapshotError> {
        validate_hash(hash)?;
        self.client
            .put(&self.blob_key(hash), PutPayload::from(data))
            .await
            .map(|_| ())
            .map_err(|error| self.failed("put blob", error))
    }

    async fn get_blob(&self, hash: &str) -> Result<Bytes, SnapshotError> {
        validate_hash(hash)?;
        self.get(&self.blob_key(hash), "blob", hash.to_owned(), "get blob").await
    }

    async fn has_blob(&self, hash: &str) -> Result<bool, SnapshotError> {
        validate_hash(hash)?;
        match self.client.head(&self.blob_key(hash)).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(error) => Err(self.failed("has blob", error)),
        }
    }

    async fn delete_blob(&self, hash: &str) -> Result<(), SnapshotError> {
        validate_hash(hash)?;
        match self.client.delete(&self.blob_key(hash)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(error) => Err(self.failed("delete blob", error)),
        }
    }

    async fn list_blob_entries(&self) -> Result<Vec<BlobEntry>, SnapshotError> {
        let metas: Vec<object_store::ObjectMeta> = self
            .client
            .list(Some(&self.key("blobs")))
            .try_collect()
            .await
            .map_err(|error| self.failed("list blobs", error))?;
        Ok(metas
            .into_iter()
            .filter_map(|meta| {
                let hash = meta.location.filename()?.to_owned();
                validate_hash(&hash).ok()?;
                Some(BlobEntry { hash, written_unix_ms: meta.last_modified.timestamp_millis().max(0) as u64 })
            })
            .collect())
    }

    async fn put_manifest(&self, workspace_id: &str, snapshot_id: &str, data: Bytes) -> Result<(), SnapshotError> {
        validate_workspace_id(workspace_id)?;
        validate_snapshot_id(snapshot_id)?;
        self.client
            .put(&self.manifest_key(workspace_id, snapshot_id), PutPayload::from(data))
            .await
            .map(|_| ())
            .map_err(|error| self.failed("put manifest", error))
    }

    async fn get_manifest(&self, workspace_id: &str, snapshot_id: &str) -> Result<Bytes, SnapshotError> {
        validate_workspace_id(workspace_id)?;
        validate_snapshot_id(snapshot_id)?;
        self.get(
            &self.manifest_key(workspace_id, snapshot_id),
            "manifest",
            format!("{workspace_id}/{snapshot_id}"),
            "get manifest",
        )
        .await
    }

    async fn list_manifests(&self, workspace_id: &str) -> Result<Vec<String>, SnapshotError> {
        validate_workspace_id(workspace_id)?;
        let names = self.list_names(&format!("manifests/{workspace_id}"), false).await?;
        Ok(names.into_iter().filter(|name| validate_snapshot_id(name).is_ok()).collect())
    }

    async fn delete_manifest(&self, workspace_id: &str, snapshot_id: &str) -> Result<(), SnapshotError> {
        validate_workspace_id(workspace_id)?;
        validate_snapshot_id(snapshot_id)?;
        match self.client.delete(&self.manifest_key(workspace_id, snapshot_id)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(error) => Err(self.failed("delete manifest", error)),
        }
    }

    async fn list_workspaces(&self) -> Result<Vec<String>, SnapshotError> {
        // S3 has no empty "directories": a workspace is listed while it has a manifest.
        let names = self.list_names("manifests", true).await?;
        Ok(names.into_iter().filter(|name| validate_workspace_id(name).is_ok()).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_file_profiles() {
        let text = "[default]\naws_access_key_id = A\naws_secret_access_key=B\n\n[profile ci]\naws_access_key_id = C\n";
        assert_eq!(
            profile_values(text, "default").unwrap(),
            vec![
                ("aws_access_key_id".to_owned(), "A".to_owned()),
                ("aws_secret_access_key".to_owned(), "B".to_owned())
            ]
        );
        assert_eq!(profile_values(text, "ci").unwrap(), vec![("aws_access_key_id".to_owned(), "C".to_owned())]);
        assert!(profile_values(text, "missing").is_none());
    }

    #[test]
    fn url_parsing() {
        let store = S3Store::open("s3://bucket/some/prefix?endpoint=http://127.0.0.1:9/&region=us-east-1").unwrap();
        assert_eq!(store.describe(), "s3://bucket/some/prefix?endpoint=http://127.0.0.1:9/");
        assert!(S3Store::open("s3://user:secret@bucket/p").is_err());
        assert!(S3Store::open("s3:///p").is_err());
        assert!(S3Store::open("s3://bucket/a//p").is_err());
        // The URL parser resolves dot segments: nothing can climb out of the bucket.
        assert_eq!(S3Store::open("s3://bucket/../p").unwrap().describe(), "s3://bucket/p");
        assert!(S3Store::open("s3://bucket/p?unknown=1").is_err());
    }
}
