//! Derived file operations through `exec` of POSIX tools inside the sandbox.
use crate::backend::{Backend, FileInfo};
use crate::error::Result;
use crate::path::RelPath;

pub async fn stat<B: Backend + ?Sized>(_backend: &B, _path: &RelPath) -> Result<FileInfo> {
    unimplemented!()
}
pub async fn list_dir<B: Backend + ?Sized>(_backend: &B, _path: &RelPath) -> Result<Vec<FileInfo>> {
    unimplemented!()
}
pub async fn remove<B: Backend + ?Sized>(_backend: &B, _path: &RelPath, _recursive: bool) -> Result<bool> {
    unimplemented!()
}
pub async fn mkdir<B: Backend + ?Sized>(_backend: &B, _path: &RelPath, _parents: bool) -> Result<()> {
    unimplemented!()
}
