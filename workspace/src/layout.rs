//! The fixed layout of every workspace root (DESIGN.md §3).
use crate::backend::Backend;
use crate::error::Result;

pub async fn ensure<B: Backend + ?Sized>(_backend: &B) -> Result<()> {
    unimplemented!()
}
