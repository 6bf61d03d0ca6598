//! The attack corpus: one case per way a hostile tenant (or a careless operator) could
//! break isolation, each run against real node agents and sandboxes. Every case plants a
//! host-side marker path the attack would create or read if it worked, runs the attack,
//! and asserts the refusal (a typed error) or the containment (the marker never appears,
//! the secret never shows in the output).
//!
//! One module per area; each module's doc names the attacks and entry points it covers.

mod bwrap;
mod mcp;
mod network;
mod policy;
mod tenants;
