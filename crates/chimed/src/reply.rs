//! The one way a worker queues a reply: into a buffer cut to the request's length, so that no
//! reply can be larger than the request that caused it (no amplification, by construction).

use chime_udp::{RecvMeta, TxBatch};

/// Queues the reply `write` makes for `request`, back to its sender from the address it was sent
/// to. `write` gets at most `request.len()` bytes and returns the reply's length, or why there is
/// none. `Ok` if the reply was queued; `Err(Some(why))` with `write`'s reason for the caller to
/// count, `Err(None)` if the batch was full (which a batch as large as the receive batch never
/// is).
pub(crate) fn queue<E>(
    tx: &mut TxBatch,
    meta: &RecvMeta,
    request: &[u8],
    write: impl FnOnce(&mut [u8]) -> Result<usize, E>,
) -> Result<(), Option<E>> {
    let mut dropped = None;
    let queued = tx.reply_to(meta, |buf| {
        let cap = request.len().min(buf.len());
        write(&mut buf[..cap])
            .map_err(|why| dropped = Some(why))
            .ok()
    });
    match dropped {
        Some(why) => Err(Some(why)),
        None if queued => Ok(()),
        None => Err(None),
    }
}
