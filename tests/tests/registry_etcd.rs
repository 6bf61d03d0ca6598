//! The registry conformance suite against a real etcd (one process shared by this binary).

berth_tests::registry_suite!(etcd, async { berth_tests::etcd::shared_registry().await });
