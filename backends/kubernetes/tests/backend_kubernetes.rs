//! The backend and contract conformance suites on the Kubernetes backend, against the
//! API-server emulator (tests/kubernetes-emulator): each test its own emulator and Pod.

mod common;

berth_testkit::backend_suite!(kubernetes, common::suite_fixture());
berth_testkit::contract_suite!(kubernetes_contract, common::suite_fixture());
