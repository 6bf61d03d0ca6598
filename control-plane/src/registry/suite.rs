//! Conformance suite every `Registry` implementation passes (`registry_suite!`).
