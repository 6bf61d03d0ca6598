//! Cross-process integration test support: real etcd processes, Berth replicas and node
//! agents, started and killed by PID.

pub mod berth;
pub mod cluster;
pub mod etcd;
pub mod observe;
pub mod process;
