//! Conversions between the registry's types and etcd-client's.

use bytes::Bytes;

use crate::registry::{
    Compare, CompareOp, CompareTarget, KeyValue, LeaseId, RegistryError, Result, Txn, TxnOp, TxnOpResponse, TxnResponse,
};

pub(super) fn txn(txn: &Txn) -> etcd_client::Txn {
    etcd_client::Txn::new()
        .when(txn.compares.iter().map(compare).collect::<Vec<_>>())
        .and_then(txn.success.iter().map(op).collect::<Vec<_>>())
        .or_else(txn.failure.iter().map(op).collect::<Vec<_>>())
}

fn compare(compare: &Compare) -> etcd_client::Compare {
    let op = match compare.op {
        CompareOp::Equal => etcd_client::CompareOp::Equal,
        CompareOp::NotEqual => etcd_client::CompareOp::NotEqual,
        CompareOp::Greater => etcd_client::CompareOp::Greater,
        CompareOp::Less => etcd_client::CompareOp::Less,
    };
    let key = compare.key.as_bytes();
    match &compare.target {
        CompareTarget::CreateRevision(revision) => etcd_client::Compare::create_revision(key, op, *revision),
        CompareTarget::ModRevision(revision) => etcd_client::Compare::mod_revision(key, op, *revision),
        CompareTarget::Version(version) => etcd_client::Compare::version(key, op, *version),
        CompareTarget::Value(value) => etcd_client::Compare::value(key, op, value.to_vec()),
    }
}

fn op(op: &TxnOp) -> etcd_client::TxnOp {
    match op {
        TxnOp::Put { key, value, lease } => {
            let options = (*lease != 0).then(|| etcd_client::PutOptions::new().with_lease(*lease));
            etcd_client::TxnOp::put(key.as_bytes(), value.to_vec(), options)
        }
        TxnOp::Delete { key } => etcd_client::TxnOp::delete(key.as_bytes(), None),
        TxnOp::Get { key } => etcd_client::TxnOp::get(key.as_bytes(), None),
    }
}

/// True when neither branch writes; such a transaction is safe to retry.
pub(super) fn is_read_only(txn: &Txn) -> bool {
    txn.success.iter().chain(&txn.failure).all(|op| matches!(op, TxnOp::Get { .. }))
}

/// The lease a failed transaction most likely complained about (etcd's error names none).
pub(super) fn first_lease(txn: &Txn) -> LeaseId {
    txn.success
        .iter()
        .chain(&txn.failure)
        .find_map(|op| match op {
            TxnOp::Put { lease, .. } if *lease != 0 => Some(*lease),
            _ => None,
        })
        .unwrap_or(0)
}

pub(super) fn txn_response(response: &etcd_client::TxnResponse) -> Result<TxnResponse> {
    let revision = header_revision(response.header())?;
    let responses = response
        .op_responses()
        .into_iter()
        .map(|op_response| match op_response {
            etcd_client::TxnOpResponse::Put(_) => Ok(TxnOpResponse::Put),
            etcd_client::TxnOpResponse::Delete(deleted) => Ok(TxnOpResponse::Delete(deleted.deleted())),
            etcd_client::TxnOpResponse::Get(get) => {
                get.kvs().first().map(key_value).transpose().map(TxnOpResponse::Get)
            }
            // We never send nested transactions.
            etcd_client::TxnOpResponse::Txn(_) => Err(RegistryError::Other("unexpected nested txn response".into())),
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(TxnResponse { succeeded: response.succeeded(), revision, responses })
}

pub(super) fn key_value(kv: &etcd_client::KeyValue) -> Result<KeyValue> {
    Ok(KeyValue {
        key: key_string(kv.key())?,
        value: Bytes::copy_from_slice(kv.value()),
        create_revision: kv.create_revision(),
        mod_revision: kv.mod_revision(),
        version: kv.version(),
        lease: kv.lease(),
    })
}

/// Our keys are strings; a foreign non-UTF-8 key in our prefix is a corrupt record.
pub(super) fn key_string(key: &[u8]) -> Result<String> {
    String::from_utf8(key.to_vec()).map_err(|error| RegistryError::Corrupt {
        key: String::from_utf8_lossy(key).into_owned(),
        reason: error.to_string(),
    })
}

pub(super) fn header_revision(header: Option<&etcd_client::ResponseHeader>) -> Result<i64> {
    header
        .map(etcd_client::ResponseHeader::revision)
        .ok_or_else(|| RegistryError::Other("etcd response without header".into()))
}

/// The end of the range of keys starting with `prefix`, as etcd computes it: the prefix with
/// its last byte below 0xff incremented, or `\0` ("to the end") when there is none.
pub(super) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    match prefix.iter().rposition(|byte| *byte < 0xff) {
        Some(index) => {
            let mut end = prefix[..=index].to_vec();
            end[index] += 1;
            end
        }
        None => vec![0],
    }
}

/// Where a page starts: right after `after` (exclusive) or at the prefix.
pub(super) fn page_start(prefix: &str, after: &str) -> Vec<u8> {
    if after.is_empty() || after < prefix {
        return prefix.as_bytes().to_vec();
    }
    let mut start = after.as_bytes().to_vec();
    start.push(0);
    start
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_matches_etcd() {
        assert_eq!(prefix_end(b"/berth/"), b"/berth0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b""), vec![0]);
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
    }

    #[test]
    fn page_starts_after_the_previous_key() {
        assert_eq!(page_start("/p/", ""), b"/p/".to_vec());
        assert_eq!(page_start("/p/", "/a"), b"/p/".to_vec());
        assert_eq!(page_start("/p/", "/p/b"), b"/p/b\0".to_vec());
    }
}
