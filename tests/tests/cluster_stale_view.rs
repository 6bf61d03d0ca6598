//! A replica whose etcd member is cut off from the majority does not route from its frozen
//! view (issue 13, finding 6). The replica's only endpoint is one member of a 3-member
//! etcd; the other two are paused (SIGSTOP), so that member has no leader. With
//! require-leader its watches end and its reads fail; the view goes unconfirmed, and once
//! that exceeds the bound (5 s by default) routing answers a retryable UNAVAILABLE that
//! names the stale view.

use std::time::{Duration, Instant};

use berth_proto::meta::is_retryable;
use berth_testkit::wait_for;
use berth_tests::berth::retry_transient;
use berth_tests::cluster::{Cluster, ClusterConfig};
use berth_tests::etcd::EtcdCluster;
use nix::sys::signal::Signal;
use tonic::Code;

/// From the cut: the member notices it has no leader (~1 election timeout), ends its
/// require-leader streams after 3 more, then the view bound (5 s) passes.
const REFUSAL_DEADLINE: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_on_a_member_cut_off_from_the_majority_refuses_to_route() {
    let etcd = EtcdCluster::start(3);
    let leader = etcd.wait_for_leader(Duration::from_secs(10));
    let lone = (leader + 1) % etcd.members().len();
    let paused = [leader, (leader + 2) % etcd.members().len()];
    let config = ClusterConfig::new(vec![etcd.members()[lone].endpoint()], 1, 1);
    let cluster = Cluster::start(config).await.expect("cluster");
    let replica = &cluster.replicas[0];
    let session = replica.server.create_session("kim", "agent").await.expect("create");
    let workspace_id = session.workspace_id;
    let ran = replica.server.exec(&workspace_id, &["true"]).await.expect("exec before the cut");
    assert_eq!(ran.exit_code, 0);

    for member in paused {
        etcd.members()[member].signal(Signal::SIGSTOP);
    }
    let cut_at = Instant::now();
    let answers = std::sync::Mutex::new(Vec::new());
    let refused = wait_for(REFUSAL_DEADLINE, || async {
        let answer = tokio::time::timeout(Duration::from_secs(3), replica.server.exec(&workspace_id, &["true"])).await;
        let seen = match &answer {
            Ok(Ok(result)) => format!("exit {}", result.exit_code),
            Ok(Err(status)) => format!("{:?}: {}", status.code(), status.message()),
            Err(_) => "no answer within 3s".to_owned(),
        };
        answers.lock().expect("answers").push(format!("{:?} after the cut: {seen}", cut_at.elapsed()));
        match answer {
            Ok(Err(status)) if status.code() == Code::Unavailable && status.message().contains("stale") => {
                Some((status, cut_at.elapsed()))
            }
            _ => None,
        }
    })
    .await;
    let refused_after = refused.as_ref().map(|(_, after)| *after);
    println!("refused {refused_after:?} after the cut");
    for member in paused {
        etcd.members()[member].signal(Signal::SIGCONT);
    }
    let (status, _) = refused.unwrap_or_else(|| {
        let answers = answers.lock().expect("answers").join("\n");
        panic!(
            "no UNAVAILABLE naming the stale view within {REFUSAL_DEADLINE:?} of the cut; answers:\n{answers}\n{}",
            cluster.logs(40)
        )
    });
    assert!(is_retryable(&status), "the refusal is marked retryable: {status:?}");

    // The majority back: the view is confirmed again and the workspace answers.
    let (back, attempts) =
        retry_transient(Duration::from_secs(30), || replica.server.exec(&workspace_id, &["true"])).await;
    let back =
        back.unwrap_or_else(|status| panic!("exec after the majority returned: {status:?}\n{}", cluster.logs(40)));
    assert_eq!(back.exit_code, 0, "{back:?}");
    println!("serving again after {attempts} attempts");
}
