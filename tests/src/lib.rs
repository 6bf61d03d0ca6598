//! Cross-process integration test support: real etcd processes, Berth replicas and node
//! agents, started and killed by PID; and the compose cluster of `deploy/compose/`.

pub mod berth;
pub mod cloud;
pub mod cluster;
pub mod compose;
pub mod etcd;
pub mod leftovers;
pub mod nemesis;
pub mod observe;
pub mod process;
pub mod proxy;
pub mod registry_suite;
