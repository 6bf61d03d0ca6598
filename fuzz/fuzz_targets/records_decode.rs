//! `records::decode` on arbitrary bytes: never panics, refuses what it cannot read, and
//! whatever it accepts survives an encode / decode round trip unchanged.
#![no_main]

use berth_control_plane::records::{self, NodeRecord, SessionRecord, WorkspaceRecord};
use libfuzzer_sys::fuzz_target;

fn roundtrip<T>(data: &[u8])
where
    T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    if let Ok(record) = records::decode::<T>("/berth/fuzz", data) {
        let encoded = records::encode(&record);
        let again = records::decode::<T>("/berth/fuzz", &encoded).expect("an encoded record decodes");
        assert_eq!(again, record, "round trip changed the record");
    }
}

fuzz_target!(|data: &[u8]| {
    roundtrip::<WorkspaceRecord>(data);
    roundtrip::<SessionRecord>(data);
    roundtrip::<NodeRecord>(data);
});
