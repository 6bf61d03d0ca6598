//! `berth-kubernetes-emulator`: runs the emulator on loopback until interrupted and prints
//! where its kubeconfig is (`KUBECONFIG=…`), for kubectl, a Python client or a gateway.

use anyhow::Result;
use berth_kubernetes_emulator::{Emulator, EmulatorConfig};

#[tokio::main]
async fn main() -> Result<()> {
    let emulator = Emulator::start(EmulatorConfig::for_test()).await?;
    println!("KUBECONFIG={}", emulator.kubeconfig.display());
    println!("server={}", emulator.url);
    tokio::signal::ctrl_c().await?;
    emulator.stop().await;
    Ok(())
}
