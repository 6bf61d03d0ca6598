//! The registry conformance suite against the in-process registry.

use berth_control_plane::registry::embedded::EmbeddedRegistry;

berth_tests::registry_suite!(embedded, async { EmbeddedRegistry::new() });
