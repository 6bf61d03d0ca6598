//! Cross-process integration test support: real etcd processes (and, later, replicas and
//! node agents) started and killed by PID.

pub mod etcd;
