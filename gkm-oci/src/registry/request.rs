//! What every request to a registry host shares: the timeouts, the most
//! gkm reads of a document, and the error a failed request becomes.

use bytes::Bytes;
use futures::StreamExt;

use crate::error::Error;

/// The largest manifest or config gkm reads into memory.
pub const MAX_DOCUMENT_SIZE: usize = 4 << 20;

/// How long connecting to a registry may take.
pub const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);
/// How long a registry may stay silent in the middle of an answer.
pub const READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// The error for a failed registry request about `location`: a missing
/// manifest or blob is [`Error::NotFound`].
pub(crate) fn registry_error(
    location: impl std::fmt::Display,
    e: oci_client::errors::OciDistributionError,
) -> Error {
    use oci_client::errors::OciDistributionError as E;
    match &e {
        E::ImageManifestNotFoundError(_) => Error::NotFound {
            what: "manifest".into(),
            location: location.to_string(),
        },
        E::ServerError { code: 404, .. } => Error::NotFound {
            what: "manifest or blob".into(),
            location: location.to_string(),
        },
        _ => Error::registry(location, e),
    }
}

/// At most `limit` bytes of `stream`; reading stops there, so a source that
/// never ends costs no more memory than the limit.
pub(crate) async fn read_at_most<E>(
    stream: impl futures::Stream<Item = std::result::Result<Bytes, E>>,
    limit: usize,
) -> std::result::Result<Vec<u8>, E> {
    let mut stream = std::pin::pin!(stream);
    let mut out = Vec::new();
    while out.len() < limit {
        let Some(chunk) = stream.next().await else {
            break;
        };
        let chunk = chunk?;
        let room = limit - out.len();
        out.extend_from_slice(&chunk[..chunk.len().min(room)]);
    }
    Ok(out)
}
