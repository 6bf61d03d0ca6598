//! The production registry on etcd (`etcd-client`).
