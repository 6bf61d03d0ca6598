//! Observability with real processes: a replica and a node agent started with
//! `--metrics-listen` and `--otlp-endpoint`. After CreateSession + Exec, both `/metrics`
//! endpoints carry the documented series with sensible values, and the in-process OTLP
//! collector holds spans of both processes for the one Exec, in one trace (and the
//! Provision of the CreateSession in the CreateSession's trace).

use std::time::Duration;

use berth_testkit::wait_for;
use berth_tests::cluster::{Cluster, ClusterConfig};
use berth_tests::observe::{CollectedSpan, OtlpCollector, Scrape, scrape};
use berth_tests::process::free_port;

const DEADLINE: Duration = Duration::from_secs(20);

/// Scrapes `port` until `ready` holds for the scrape, or the deadline passes (then the last
/// scrape, for the assertion message).
async fn scrape_until(port: u16, ready: impl Fn(&Scrape) -> bool) -> Scrape {
    let found = wait_for(DEADLINE, || async {
        let scraped = scrape(port).await.ok()?;
        ready(&scraped).then_some(scraped)
    })
    .await;
    match found {
        Some(scraped) => scraped,
        None => scrape(port).await.unwrap_or_default(),
    }
}

fn at_least(scraped: &Scrape, name: &str, labels: &[(&str, &str)], minimum: f64) -> bool {
    scraped.value(name, labels).is_some_and(|value| value >= minimum)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_and_one_trace_per_exec_across_replica_and_node_agent() {
    let collector = OtlpCollector::start().await.expect("otlp collector");
    let replica_metrics = free_port().expect("port");
    let node_metrics = free_port().expect("port");
    let mut config = ClusterConfig::on_shared_etcd(1, 1);
    config.replica_flags = vec![
        "--metrics-listen".into(),
        format!("127.0.0.1:{replica_metrics}"),
        "--otlp-endpoint".into(),
        collector.endpoint(),
    ];
    config.node_flags = vec![
        "--metrics-listen".into(),
        format!("127.0.0.1:{node_metrics}"),
        "--otlp-endpoint".into(),
        collector.endpoint(),
    ];
    let cluster = Cluster::start(config).await.expect("cluster");
    let replica = &cluster.replicas[0].server;

    let session = replica.create_session("alice", "observer").await.expect("create session");
    let result = replica.exec(&session.workspace_id, &["echo", "traced"]).await.expect("exec");
    assert_eq!(result.exit_code, 0);

    // The replica: binds, provision latency by backend, etcd calls by op, view gauges,
    // heartbeat gaps.
    let replica_ready = |scraped: &Scrape| {
        at_least(scraped, "berth_control_plane_binds_started_total", &[], 1.0)
            && at_least(scraped, "berth_control_plane_binds_won_total", &[], 1.0)
            && at_least(
                scraped,
                "berth_control_plane_provision_duration_seconds_count",
                &[("backend", "local"), ("outcome", "ok")],
                1.0,
            )
            && scraped.value("berth_control_plane_live_nodes", &[]) == Some(1.0)
            && scraped.value("berth_control_plane_workspaces", &[("state", "ready"), ("backend", "local")]) == Some(1.0)
            && at_least(scraped, "berth_control_plane_etcd_call_duration_seconds_count", &[("op", "txn")], 1.0)
            && at_least(scraped, "berth_control_plane_heartbeat_gap_seconds_count", &[], 1.0)
    };
    let scraped = scrape_until(replica_metrics, replica_ready).await;
    assert!(replica_ready(&scraped), "replica metrics incomplete:\n{}\n{}", scraped.text, cluster.logs(20));
    // Nothing waited or took over in a single-replica cluster, and every etcd call worked.
    assert_eq!(scraped.value("berth_control_plane_binds_taken_over_total", &[]).unwrap_or(0.0), 0.0);
    assert_eq!(scraped.value("berth_control_plane_etcd_call_errors_total", &[]).unwrap_or(0.0), 0.0);
    let heartbeat_gap_sum = scraped.value("berth_control_plane_heartbeat_gap_seconds_sum", &[]).unwrap_or(-1.0);
    let heartbeat_gaps = scraped.value("berth_control_plane_heartbeat_gap_seconds_count", &[]).unwrap_or(0.0);
    assert!(
        heartbeat_gap_sum / heartbeat_gaps < 2.0,
        "mean heartbeat gap {heartbeat_gap_sum}/{heartbeat_gaps} s is far above the 500ms interval"
    );

    // The node agent: exec and provision latency by backend.
    let node_ready = |scraped: &Scrape| {
        at_least(
            scraped,
            "berth_node_agent_exec_duration_seconds_count",
            &[("backend", "local"), ("outcome", "ok")],
            1.0,
        ) && at_least(scraped, "berth_node_agent_provision_duration_seconds_count", &[("backend", "local")], 1.0)
            && scraped.value("berth_node_agent_workspaces", &[]) == Some(1.0)
            && scraped.value("berth_node_agent_fenced", &[]) == Some(0.0)
    };
    let scraped = scrape_until(node_metrics, node_ready).await;
    assert!(node_ready(&scraped), "node metrics incomplete:\n{}\n{}", scraped.text, cluster.logs(20));
    let exec_seconds = scraped.value("berth_node_agent_exec_duration_seconds_sum", &[("backend", "local")]);
    assert!(exec_seconds.is_some_and(|seconds| seconds > 0.0 && seconds < 10.0), "exec took {exec_seconds:?} s");

    // Traces: the node agent's span of the forwarded Exec and the replica's span of the
    // client's Exec share one trace id; the node's span is a child of a replica span.
    let workspace_id = session.workspace_id.clone();
    let find_trace = || {
        let spans = collector.spans();
        let node_span = spans.iter().find(|span| {
            span.service == "berth-node-agent"
                && span.attributes.get("rpc").is_some_and(|rpc| rpc.contains("WorkspaceService/Exec"))
                && span.attributes.get("ws_id") == Some(&workspace_id)
        })?;
        let replica_span = spans.iter().find(|span| {
            span.service == "berth-control-plane"
                && span.trace_id == node_span.trace_id
                && span.attributes.get("rpc").is_some_and(|rpc| rpc.contains("WorkspaceService/Exec"))
        })?;
        Some((replica_span.clone(), node_span.clone(), spans))
    };
    let found = wait_for(DEADLINE, || async { find_trace() }).await;
    let Some((replica_span, node_span, spans)) = found else {
        let summary: Vec<String> = collector.spans().iter().map(describe).collect();
        panic!("no Exec trace spanning replica and node agent; spans:\n{}\n{}", summary.join("\n"), cluster.logs(20));
    };
    assert_eq!(replica_span.attributes.get("replica_id").map(String::as_str), Some("replica-0"));
    assert_eq!(replica_span.attributes.get("ws_id"), Some(&workspace_id));
    assert_eq!(node_span.attributes.get("node_id").map(String::as_str), Some("node-0"));
    assert!(
        spans.iter().any(|span| span.service == "berth-control-plane" && span.span_id == node_span.parent_span_id),
        "the node's span has no replica span as parent: {}",
        describe(&node_span)
    );
    assert!(replica_span.parent_span_id.is_empty(), "the client sent no trace context: the replica span is the root");

    // The bind runs in a task of its own; its Provision still joins the CreateSession trace.
    let provision_joined = spans.iter().any(|node_span| {
        node_span.service == "berth-node-agent"
            && node_span.attributes.get("rpc").is_some_and(|rpc| rpc.contains("NodeAgentService/Provision"))
            && node_span.attributes.get("ws_id") == Some(&workspace_id)
            && spans.iter().any(|span| {
                span.trace_id == node_span.trace_id
                    && span.attributes.get("rpc").is_some_and(|rpc| rpc.contains("WorkspaceService/CreateSession"))
            })
    });
    assert!(provision_joined, "the node's Provision is not in the CreateSession trace");
    collector.stop();
}

fn describe(span: &CollectedSpan) -> String {
    format!(
        "{} {} trace={} span={} parent={} {:?}",
        span.service, span.name, span.trace_id, span.span_id, span.parent_span_id, span.attributes
    )
}

/// `berth up` runs replica and node agent in one process: one `/metrics` shows both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn berth_up_serves_replica_and_node_agent_series_on_one_endpoint() {
    let data_dir = tempfile::tempdir().expect("data dir");
    let metrics_port = free_port().expect("port");
    let listen = format!("127.0.0.1:{metrics_port}");
    let up = berth_tests::berth::start_up(data_dir.path(), &["--metrics-listen", &listen]).await.expect("berth up");
    let session = up.create_session("alice", "all-in-one").await.expect("create session");
    up.exec(&session.workspace_id, &["true"]).await.expect("exec");
    let ready = |scraped: &Scrape| {
        at_least(scraped, "berth_control_plane_binds_won_total", &[], 1.0)
            && scraped.value("berth_control_plane_workspaces", &[("state", "ready")]) == Some(1.0)
            && at_least(scraped, "berth_node_agent_exec_duration_seconds_count", &[("backend", "local")], 1.0)
    };
    let scraped = scrape_until(metrics_port, ready).await;
    assert!(ready(&scraped), "berth up metrics incomplete:\n{}\n{}", scraped.text, up.log());
    // The embedded registry is not etcd: no etcd series.
    assert_eq!(scraped.value("berth_control_plane_etcd_call_duration_seconds_count", &[]), None);
}
