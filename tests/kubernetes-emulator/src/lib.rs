//! An emulator of the part of the Kubernetes API server Berth's `kubernetes` backend uses,
//! for Berth's tests: no kube-apiserver can run on the test machines. It serves discovery,
//! namespaced Pods and PersistentVolumeClaims (CRUD, label selectors, `resourceVersion`
//! with optimistic concurrency, status), and `pods/exec` over websockets (`v5.channel.k8s.io`
//! and `v4.channel.k8s.io`), over plain HTTP on loopback behind a bearer token, and writes a
//! kubeconfig for it. A Pod's containers are bubblewrap sandboxes (`container.rs`) over the
//! host's system directories, with the Pod's volumes bound in: a claim is a directory that
//! outlives its Pods, an `emptyDir` one that dies with its Pod.
//!
//! Real clients prove it speaks the protocol: `tests/client_validation.rs` drives it with
//! `kubectl` and the official Python client. What is not emulated (watches, scheduling,
//! images, resource enforcement, …) is listed in the README beside this crate.

pub mod container;
pub mod exec;
pub mod selector;
pub mod server;
pub mod state;

pub use server::{Emulator, EmulatorConfig};
pub use state::{PODS, PVCS};
