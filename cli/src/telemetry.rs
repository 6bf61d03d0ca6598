//! Process-wide observability of the server commands: `--metrics-listen` (a Prometheus
//! recorder for the `metrics` facade, served as text on `GET /metrics`) and
//! `--otlp-endpoint` (a `tracing` layer exporting spans over OTLP/gRPC).
//!
//! Both are installed once per process; `berth up` therefore reports its replica and its
//! node agent on one endpoint and in one OTLP resource.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use berth_proto::tls::TlsFiles;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Bucket bounds (seconds) of every latency histogram: etcd calls take well under a
/// millisecond, provisions of a Docker workspace seconds.
const LATENCY_BUCKETS: &[f64] =
    &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

/// How long finished spans wait before they are sent. Short: an operator looking for a
/// trace should find it at once, and a process killed hard loses at most this much.
const SPAN_EXPORT_DELAY: Duration = Duration::from_millis(500);

/// Observability flags of `berth up`, `berth control-plane` and `berth node-agent`.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct TelemetryFlags {
    /// Serve Prometheus metrics as text on http://ADDR/metrics; ADDR must be loopback
    /// (e.g. 127.0.0.1:9100). For another address use --metrics-listen-network.
    #[arg(long, env = "BERTH_METRICS_LISTEN", conflicts_with = "metrics_listen_network")]
    pub metrics_listen: Option<String>,
    /// Serve the metrics on this non-loopback address (the private or pod network a
    /// Prometheus scrapes from, e.g. 10.0.1.1:9100) over HTTPS with the process's own
    /// --tls-cert / --tls-key (plaintext only with --insecure-plaintext). `/metrics` is
    /// unauthenticated: name an address only the scraper reaches.
    #[arg(long, env = "BERTH_METRICS_LISTEN_NETWORK")]
    pub metrics_listen_network: Option<String>,
    /// Export trace spans over OTLP/gRPC to this collector (e.g. http://127.0.0.1:4317).
    #[arg(long, env = "BERTH_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
}

/// Installs the global `tracing` subscriber: logs to stderr, plus OTLP export when
/// `otlp` is given. Must run inside the Tokio runtime (the OTLP client is a tonic channel).
/// Returns the tracer provider to flush at exit.
pub fn init_tracing(
    default_level: &str,
    otlp: Option<(&str, &'static str)>,
    ansi: bool,
) -> anyhow::Result<Option<SdkTracerProvider>> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level));
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(ansi);
    let Some((endpoint, service_name)) = otlp else {
        // try_init: a subscriber that cannot be installed is no reason to fail the command.
        let _ = tracing_subscriber::registry().with(filter).with(fmt).try_init();
        return Ok(None);
    };
    opentelemetry::global::set_text_map_propagator(opentelemetry_sdk::propagation::TraceContextPropagator::new());
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .with_timeout(Duration::from_secs(5))
        .build()
        .with_context(|| format!("otlp exporter for {endpoint}"))?;
    let processor = BatchSpanProcessor::builder(exporter)
        .with_batch_config(BatchConfigBuilder::default().with_scheduled_delay(SPAN_EXPORT_DELAY).build())
        .build();
    let resource = opentelemetry_sdk::Resource::builder().with_service_name(service_name).build();
    let provider = SdkTracerProvider::builder().with_span_processor(processor).with_resource(resource).build();
    let tracer = provider.tracer("berth");
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(fmt)
        .with(tracing_opentelemetry::layer().with_tracer(tracer))
        .try_init();
    Ok(Some(provider))
}

/// Sends the spans still buffered (called once the command finished).
pub fn flush_traces(provider: SdkTracerProvider) {
    if let Err(error) = provider.shutdown() {
        tracing::warn!(%error, "flushing trace spans failed");
    }
}

/// How the process's own listeners are secured, which the metrics listener follows beyond
/// loopback.
#[derive(Clone, Copy, Debug)]
pub enum MetricsTransport<'a> {
    /// The process serves TLS with these files: so do network metrics.
    Tls(&'a TlsFiles),
    /// `--insecure-plaintext`: network metrics are plaintext too.
    InsecurePlaintext,
    /// Neither: metrics may serve only on loopback.
    LoopbackOnly,
}

impl<'a> MetricsTransport<'a> {
    /// What a process with `tls` (its own listener's certificate) and `--insecure-plaintext`
    /// allows its metrics.
    pub fn of(tls: Option<&'a TlsFiles>, insecure_plaintext: bool) -> Self {
        match (tls, insecure_plaintext) {
            (Some(files), _) => Self::Tls(files),
            (None, true) => Self::InsecurePlaintext,
            (None, false) => Self::LoopbackOnly,
        }
    }
}

impl TelemetryFlags {
    /// Serves the metrics on `--metrics-listen` (loopback only, plaintext) or
    /// `--metrics-listen-network` (HTTPS with the process's certificate, or plaintext with
    /// `--insecure-plaintext`) until `shutdown`; `None` when neither is given.
    pub async fn serve_metrics(
        &self,
        transport: MetricsTransport<'_>,
        shutdown: CancellationToken,
    ) -> anyhow::Result<Option<SocketAddr>> {
        match (&self.metrics_listen, &self.metrics_listen_network) {
            (Some(listen), _) => serve_metrics(listen, Exposure::Loopback, shutdown).await.map(Some),
            (None, Some(listen)) => {
                let exposure = match transport {
                    MetricsTransport::Tls(files) => Exposure::Tls(server_config(files)?),
                    MetricsTransport::InsecurePlaintext => {
                        tracing::warn!(
                            %listen,
                            "--insecure-plaintext: metrics are served over plaintext HTTP beyond loopback"
                        );
                        Exposure::Plaintext
                    }
                    MetricsTransport::LoopbackOnly => anyhow::bail!(
                        "--metrics-listen-network {listen} serves beyond loopback, so over TLS with this process's \
                         --tls-cert / --tls-key, which it has none of (or plaintext with --insecure-plaintext)"
                    ),
                };
                serve_metrics(listen, exposure, shutdown).await.map(Some)
            }
            (None, None) => Ok(None),
        }
    }
}

/// Where and how the metrics listener may serve.
pub enum Exposure {
    /// Loopback addresses only, plaintext.
    Loopback,
    /// Any address, plaintext.
    Plaintext,
    /// Any address, HTTPS.
    Tls(Arc<rustls::ServerConfig>),
}

/// A rustls server config (ring, HTTP/1.1) from PEM files.
fn server_config(files: &TlsFiles) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs = CertificateDer::pem_file_iter(&files.cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .with_context(|| format!("metrics tls: reading {}", files.cert.display()))?;
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .with_context(|| format!("metrics tls: reading {}", files.key.display()))?;
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .context("metrics tls: protocol versions")?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .context("metrics tls: certificate and key")?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Longest a client may take over its TLS handshake before the connection is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes in flight at once; more wait for their TCP accept.
const MAX_HANDSHAKES: usize = 64;

/// A listener handing axum connections whose TLS handshake is done. Handshakes run in
/// their own tasks, so a client that connects and stays silent delays nobody else.
struct TlsListener {
    address: SocketAddr,
    handshaken: tokio::sync::mpsc::Receiver<(tokio_rustls::server::TlsStream<tokio::net::TcpStream>, SocketAddr)>,
}

impl TlsListener {
    fn spawn(
        listener: tokio::net::TcpListener,
        config: Arc<rustls::ServerConfig>,
        shutdown: CancellationToken,
    ) -> std::io::Result<Self> {
        let address = listener.local_addr()?;
        let (sender, handshaken) = tokio::sync::mpsc::channel(MAX_HANDSHAKES);
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        let slots = Arc::new(tokio::sync::Semaphore::new(MAX_HANDSHAKES));
        tokio::spawn(async move {
            loop {
                let Ok(slot) = slots.clone().acquire_owned().await else { return };
                let (stream, peer) = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    accepted = listener.accept() => match accepted {
                        Ok(accepted) => accepted,
                        Err(error) => {
                            tracing::debug!(%error, "metrics: accept failed");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    },
                };
                let (acceptor, sender) = (acceptor.clone(), sender.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(stream)) => {
                            drop(slot);
                            let _ = sender.send((stream, peer)).await;
                        }
                        Ok(Err(error)) => tracing::debug!(%peer, %error, "metrics: TLS handshake failed"),
                        Err(_) => tracing::debug!(%peer, "metrics: TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(Self { address, handshaken })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.handshaken.recv().await {
            Some(connection) => connection,
            // The acceptor stopped (shutdown): nothing more comes.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.address)
    }
}

/// Installs the process's Prometheus recorder and serves it on `listen` until `shutdown`.
/// Returns the bound address (`listen` may name port 0). With [`Exposure::Loopback`] an
/// address that is not loopback is refused before anything is served.
pub async fn serve_metrics(
    listen: &str,
    exposure: Exposure,
    shutdown: CancellationToken,
) -> anyhow::Result<SocketAddr> {
    let listener =
        tokio::net::TcpListener::bind(listen).await.with_context(|| format!("metrics: listening on {listen}"))?;
    let address = listener.local_addr()?;
    anyhow::ensure!(
        !matches!(exposure, Exposure::Loopback) || address.ip().is_loopback(),
        "--metrics-listen {listen} is not a loopback address: /metrics is unauthenticated; name the network \
         address a Prometheus scrapes from with --metrics-listen-network instead"
    );
    let handle = PrometheusBuilder::new()
        .set_buckets(LATENCY_BUCKETS)
        .context("metric buckets")?
        .install_recorder()
        .context("installing the metrics recorder")?;
    // The recorder keeps histogram samples until upkeep folds them in; render() does too,
    // this only bounds memory between scrapes.
    let upkeep = handle.clone();
    let upkeep_shutdown = shutdown.clone();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = upkeep_shutdown.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_secs(5)) => upkeep.run_upkeep(),
            }
        }
    });
    let router = axum::Router::new().route(
        "/metrics",
        axum::routing::get(|axum::extract::State(handle): axum::extract::State<PrometheusHandle>| async move {
            ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], handle.render())
        }),
    );
    let router = router.with_state(handle);
    let scheme = match exposure {
        Exposure::Tls(config) => {
            spawn_serve(TlsListener::spawn(listener, config, shutdown.clone())?, router, shutdown);
            "https"
        }
        Exposure::Loopback | Exposure::Plaintext => {
            spawn_serve(listener, router, shutdown);
            "http"
        }
    };
    tracing::info!(%address, scheme, "metrics serving on /metrics");
    Ok(address)
}

/// Serves `router` on `listener` in a task until `shutdown`.
fn spawn_serve<L>(listener: L, router: axum::Router, shutdown: CancellationToken)
where
    L: axum::serve::Listener,
    L::Addr: std::fmt::Debug,
{
    tokio::spawn(async move {
        let served = axum::serve(listener, router).with_graceful_shutdown(shutdown.cancelled_owned()).await;
        if let Err(error) = served {
            tracing::warn!(%error, "metrics endpoint stopped");
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn metrics_stay_on_loopback_unless_a_network_address_is_named() {
        // Refused before the recorder is installed: nothing is served.
        let error =
            serve_metrics("0.0.0.0:0", Exposure::Loopback, CancellationToken::new()).await.unwrap_err().to_string();
        assert!(error.contains("not a loopback address") && error.contains("--metrics-listen-network"), "{error}");
        let flags = TelemetryFlags { metrics_listen: Some("0.0.0.0:0".into()), ..Default::default() };
        assert!(flags.serve_metrics(MetricsTransport::InsecurePlaintext, CancellationToken::new()).await.is_err());
        let none = TelemetryFlags::default();
        assert_eq!(none.serve_metrics(MetricsTransport::LoopbackOnly, CancellationToken::new()).await.unwrap(), None);
        // Beyond loopback without a certificate or the plaintext switch: refused, naming both.
        let network = TelemetryFlags { metrics_listen_network: Some("0.0.0.0:0".into()), ..Default::default() };
        let error = network.serve_metrics(MetricsTransport::LoopbackOnly, CancellationToken::new()).await.unwrap_err();
        let error = error.to_string();
        assert!(error.contains("--tls-cert") && error.contains("--insecure-plaintext"), "{error}");
    }

    /// Beyond loopback with the process's certificate: HTTPS that a client trusting the CA
    /// reads, and nothing for a plaintext client.
    #[tokio::test]
    async fn network_metrics_serve_https_with_the_process_certificate_and_refuse_plaintext() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let pki = tempfile::tempdir().unwrap();
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/certs/make-dev-certs.sh");
        let made = std::process::Command::new("bash").arg(script).arg(pki.path()).output().unwrap();
        assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
        let files = TlsFiles { cert: pki.path().join("replica.pem"), key: pki.path().join("replica.key") };
        let flags = TelemetryFlags { metrics_listen_network: Some("127.0.0.1:0".into()), ..Default::default() };
        let shutdown = CancellationToken::new();
        let address = flags.serve_metrics(MetricsTransport::Tls(&files), shutdown.clone()).await.unwrap().unwrap();
        metrics::counter!("berth_telemetry_test_total").increment(1);

        // A silent client holding a connection open does not stall the next one.
        let _silent = tokio::net::TcpStream::connect(address).await.unwrap();

        use rustls::pki_types::pem::PemObject;
        let mut roots = rustls::RootCertStore::empty();
        roots.add(rustls::pki_types::CertificateDer::from_pem_file(pki.path().join("ca.pem")).unwrap()).unwrap();
        let client = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
        let tcp = tokio::net::TcpStream::connect(address).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let mut tls =
            tokio::time::timeout(Duration::from_secs(5), connector.connect(name, tcp)).await.unwrap().unwrap();
        tls.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").await.unwrap();
        let mut response = String::new();
        tokio::time::timeout(Duration::from_secs(5), tls.read_to_string(&mut response)).await.unwrap().unwrap();
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        assert!(response.contains("berth_telemetry_test_total 1"), "{response}");

        let mut plain = tokio::net::TcpStream::connect(address).await.unwrap();
        plain.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").await.unwrap();
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), plain.read_to_end(&mut answer)).await.unwrap();
        let answer = String::from_utf8_lossy(&answer);
        assert!(!answer.contains("HTTP/1.1") && !answer.contains("berth_"), "plaintext answered: {answer}");
        shutdown.cancel();
    }
}
