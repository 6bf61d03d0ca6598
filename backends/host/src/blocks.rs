//! A regular file read one block per trip to the blocking pool, each block read by the
//! kernel straight into the buffer that goes out: no intermediate buffer and copy (which a
//! `tokio::fs::File` makes), and no trip that only finds the end of a file whose size the
//! open already told.

use std::io::{self, Read as _};

use berth_workspace::backend::ByteStream;
use berth_workspace::error::WorkspaceError;
use bytes::Bytes;
use futures::StreamExt;

/// Reads up to `limit` bytes from the file's position, fewer only at its end, into a buffer
/// of `capacity` (grown if the file holds more).
pub fn read_block(file: &mut std::fs::File, limit: usize, capacity: usize) -> io::Result<Vec<u8>> {
    let mut block = Vec::with_capacity(capacity.min(limit));
    file.by_ref().take(limit as u64).read_to_end(&mut block)?;
    Ok(block)
}

/// Whether a file may hold more after a block of `length` bytes of a `block`-byte read, with
/// `read` bytes read in all from a file the open found to be `expected` bytes long. A short
/// block is the end; a full one that reaches the size seen at the open is taken as the end
/// too (a file that grew since is read as it was then, as any read racing a writer may be).
pub fn more_after(length: usize, block: usize, read: u64, expected: u64) -> bool {
    length == block && read != expected
}

/// The blocks of `file` from its position, `read` bytes into a file of `expected` bytes (as
/// the open found it), each `block` bytes long but the last; `display` names the file in
/// errors.
pub fn after(file: std::fs::File, block: usize, read: u64, expected: u64, display: String) -> ByteStream {
    futures::stream::unfold(Some((file, read)), move |state| {
        let display = display.clone();
        async move {
            let (mut file, read) = state?;
            let capacity = usize::try_from(expected.saturating_sub(read)).unwrap_or(block);
            let trip = tokio::task::spawn_blocking(move || {
                let data = read_block(&mut file, block, capacity);
                (file, data)
            })
            .await;
            let (file, data) = match trip {
                Ok((file, Ok(data))) => (file, data),
                Ok((_, Err(error))) => return Some((Err(WorkspaceError::from_io("read", &display, error)), None)),
                Err(join) => {
                    return Some((Err(WorkspaceError::from_io("read", &display, io::Error::other(join))), None));
                }
            };
            if data.is_empty() {
                return None;
            }
            let read = read + data.len() as u64;
            let next = more_after(data.len(), block, read, expected).then_some((file, read));
            Some((Ok(Bytes::from(data)), next))
        }
    })
    .boxed()
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use super::*;

    #[test]
    fn a_block_that_reaches_the_opened_size_or_falls_short_is_the_end() {
        assert!(more_after(4, 4, 4, 9), "a full block short of the size");
        assert!(!more_after(4, 4, 8, 8), "a full block at the size: no trip to find the end");
        assert!(!more_after(3, 4, 7, 9), "a short block: the file ended early");
        assert!(more_after(4, 4, 12, 8), "past the size seen at the open: the file grew, read on");
    }

    #[tokio::test]
    async fn blocks_after_the_first_are_the_rest_of_the_file() {
        let mut file = tempfile::tempfile().unwrap();
        let data: Vec<u8> = (0..10u8).collect();
        file.write_all(&data).unwrap();
        for (expected, label) in [(10, "size as opened"), (4, "grew since the open"), (0, "size unknown")] {
            let mut file = file.try_clone().unwrap();
            std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(0)).unwrap();
            let first = read_block(&mut file, 4, 4).unwrap();
            let rest: Vec<Bytes> = after(file, 4, 4, expected, "f".into()).map(Result::unwrap).collect().await;
            let lengths: Vec<usize> = rest.iter().map(Bytes::len).collect();
            assert_eq!(lengths, [4, 2], "{label}: full blocks, then the short last one");
            assert_eq!([first, rest.concat()].concat(), data, "{label}");
        }
        // A file that is a whole number of blocks ends without an empty trip.
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&[7; 8]).unwrap();
        std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(4)).unwrap();
        let rest: Vec<Bytes> = after(file, 4, 4, 8, "f".into()).map(Result::unwrap).collect().await;
        assert_eq!(rest, [Bytes::from_static(&[7; 4])]);
    }
}
