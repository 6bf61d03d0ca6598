//! The randomized fault test of the no-silent-data-loss promises (`berth_tests::nemesis`):
//! a few minutes of a seeded nemesis against real etcd members, replicas and node agents.
//! `BERTH_NEMESIS_SEED=N` replays a schedule, `BERTH_NEMESIS_SECS=S` runs longer. `.ci/run`
//! runs it in a step of its own and prints its summary line.

use berth_tests::nemesis::{self, NemesisConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acknowledged_writes_survive_the_nemesis() {
    let config = NemesisConfig::from_env(90);
    println!("nemesis: seed {} for {:?}", config.seed, config.duration);
    let summary = nemesis::run(config).await.expect("the nemesis run itself failed");
    println!("{}", summary.line());
    for violation in &summary.violations {
        println!("violation in {}: {}", violation.workspace, violation.what);
    }
    assert!(summary.violations.is_empty(), "{}", summary.line());
}
