//! `berth-e2b-emulator [API_KEY]`: runs the E2B emulator on loopback until interrupted and
//! prints the two URLs (`E2B_API_URL=…`, `E2B_SANDBOX_URL=…`) for an SDK or a gateway.

use anyhow::Result;
use berth_e2b_emulator::{Emulator, EmulatorConfig};

#[tokio::main]
async fn main() -> Result<()> {
    let api_key = std::env::args().nth(1).unwrap_or_else(|| "e2b_emulator".to_owned());
    let emulator = Emulator::start(EmulatorConfig::for_test(&api_key)).await?;
    println!("E2B_API_URL={}", emulator.api_url);
    println!("E2B_SANDBOX_URL={}", emulator.sandbox_url);
    println!("E2B_API_KEY={api_key}");
    tokio::signal::ctrl_c().await?;
    drop(emulator);
    Ok(())
}
