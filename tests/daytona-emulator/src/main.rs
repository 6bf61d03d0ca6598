//! `berth-daytona-emulator [API_KEY]`: runs the Daytona emulator on loopback until
//! interrupted and prints the API URL (`DAYTONA_API_URL=…`) for an SDK or a gateway.

use anyhow::Result;
use berth_daytona_emulator::{Emulator, EmulatorConfig};

#[tokio::main]
async fn main() -> Result<()> {
    let api_key = std::env::args().nth(1).unwrap_or_else(|| "daytona_emulator".to_owned());
    let emulator = Emulator::start(EmulatorConfig::for_test(&api_key)).await?;
    println!("DAYTONA_API_URL={}", emulator.api_url);
    println!("DAYTONA_API_KEY={api_key}");
    tokio::signal::ctrl_c().await?;
    drop(emulator);
    Ok(())
}
