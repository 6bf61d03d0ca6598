//! `berth health`: asks an endpoint's gRPC health service (open without a token) whether it
//! serves. Exit 0 when it does, 1 when it answers anything else or cannot be reached within
//! `--timeout`. It is the probe of deployments whose listeners speak only TLS (the kubelet's
//! own gRPC probe speaks plaintext): `berth --endpoint https://127.0.0.1:7070 --ca-cert
//! ca.pem health` runs inside the replica's container.

use std::time::Duration;

use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;

use crate::client::connect;
use crate::global::GlobalArgs;
use crate::io::Io;

#[derive(Debug, clap::Args)]
pub struct HealthArgs {
    /// Service to ask about; empty (the default) asks about the server as a whole.
    #[arg(long, default_value = "")]
    pub service: String,
    /// How long connecting and answering may take together.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
}

pub async fn run(args: HealthArgs, global: &GlobalArgs, io: &mut Io<'_>) -> anyhow::Result<i32> {
    let endpoint = global.endpoint.clone();
    let check = async {
        let mut client = connect(global).await?.health();
        let response = client
            .check(HealthCheckRequest { service: args.service.clone() })
            .await
            .map_err(|status| anyhow::anyhow!("health check of {endpoint}: {}", status.message()))?;
        anyhow::Ok(response.into_inner().status)
    };
    let status = tokio::time::timeout(args.timeout, check).await.map_err(|_| {
        anyhow::anyhow!("health check of {endpoint}: no answer within {}", humantime::format_duration(args.timeout))
    })??;
    let name = ServingStatus::try_from(status).map(|status| status.as_str_name()).unwrap_or("UNKNOWN");
    io.write_stdout(format!("{endpoint}: {name}\n").as_bytes()).await?;
    Ok(if status == ServingStatus::Serving as i32 { 0 } else { 1 })
}
