//! Chunking, hashing and compression: the pure parts of the format.

use std::io::{self, Read};

/// FastCDC (2020) bounds. A changed byte re-uploads at most the chunk it is in and, when it
/// moves a boundary, the next one: at most 2 × `MAX_SIZE` = 1 MiB of content per edit.
pub(crate) const MIN_SIZE: usize = 32 << 10;
pub(crate) const AVG_SIZE: usize = 128 << 10;
pub(crate) const MAX_SIZE: usize = 512 << 10;
/// Largest chunk a restore accepts from a manifest (room for other chunker settings in a
/// later format, far below anything that could exhaust memory).
pub(crate) const MAX_CHUNK_ACCEPTED: u64 = 16 << 20;

/// BLAKE3 of `data`, as 64 lowercase hex characters.
pub(crate) fn hash(data: &[u8]) -> String {
    blake3::hash(data).to_hex().to_string()
}

pub(crate) fn compress(data: &[u8], level: i32) -> io::Result<Vec<u8>> {
    zstd::bulk::compress(data, level)
}

/// Decompresses one zstd frame, refusing output beyond `max` bytes (a hostile store or
/// manifest cannot make a restore allocate more than that).
pub(crate) fn decompress_bounded(data: &[u8], max: usize) -> Result<Vec<u8>, String> {
    let decoder = zstd::stream::read::Decoder::new(data).map_err(|error| format!("not zstd: {error}"))?;
    let mut out = Vec::new();
    decoder.take(max as u64 + 1).read_to_end(&mut out).map_err(|error| format!("zstd: {error}"))?;
    if out.len() > max {
        return Err(format!("decompresses to more than {max} bytes"));
    }
    Ok(out)
}

/// Cuts a stream into content-defined chunks.
pub(crate) fn chunks<R: Read>(reader: R) -> fastcdc::v2020::StreamCDC<R> {
    fastcdc::v2020::StreamCDC::new(reader, MIN_SIZE, AVG_SIZE, MAX_SIZE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compress_round_trip_and_bound() {
        let data = vec![7u8; 1 << 20];
        let packed = compress(&data, 3).unwrap();
        assert!(packed.len() < 4096);
        assert_eq!(decompress_bounded(&packed, 1 << 20).unwrap(), data);
        assert!(decompress_bounded(&packed, (1 << 20) - 1).is_err());
        assert!(decompress_bounded(b"not zstd at all", 100).is_err());
    }

    #[test]
    fn chunk_boundaries_are_bounded_and_local() {
        let mut data = vec![0u8; 4 << 20];
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for byte in data.iter_mut() {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            *byte = state as u8;
        }
        let cut = |data: &[u8]| -> Vec<(u64, String)> {
            chunks(data).map(|chunk| chunk.unwrap()).map(|chunk| (chunk.length as u64, hash(&chunk.data))).collect()
        };
        let before = cut(&data);
        assert!(before.iter().all(|(size, _)| *size <= MAX_SIZE as u64));
        data[2 << 20] ^= 0xff;
        let after = cut(&data);
        let changed: u64 = after.iter().filter(|chunk| !before.contains(chunk)).map(|(size, _)| size).sum();
        assert!(changed <= 2 * MAX_SIZE as u64, "one changed byte re-chunked {changed} bytes");
    }
}
