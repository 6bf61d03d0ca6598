//! The backend and contract conformance suites on the E2B backend, against the E2B
//! emulator (tests/e2b-emulator): each test its own emulator and sandbox.

mod common;

berth_testkit::backend_suite!(e2b, common::workspace());
berth_testkit::contract_suite!(e2b_contract, common::workspace());
