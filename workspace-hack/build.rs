// Present so that cargo applies this package's [build-dependencies] (the features of crates
// that build scripts and proc macros use) to the feature unification.
fn main() {}
