//! In-process registry with etcd semantics, for `berth up` and tests.
