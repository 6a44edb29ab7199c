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

/// Drives a batch handler in process, as a worker thread would, without a socket: the in-memory
/// pair the services' tests use.
#[cfg(test)]
pub(crate) mod testing {
    use std::net::SocketAddr;

    use chime_udp::{BatchHandler, RecvMeta, RxBatch, TxBatch};

    /// Hands `handler` one batch of `datagrams` from `src`, stamps the replies as a worker does
    /// before sending them, and returns them; each must go back to its sender.
    pub(crate) fn exchange<D: AsRef<[u8]>>(
        handler: &mut impl BatchHandler,
        src: &str,
        datagrams: &[D],
    ) -> Vec<Vec<u8>> {
        let src: SocketAddr = src.parse().unwrap();
        let mut rx = RxBatch::new(8, 2048);
        for d in datagrams {
            assert!(rx.push(RecvMeta::new(src, d.as_ref().len()), d.as_ref()));
        }
        let mut tx = TxBatch::new(8, 2048);
        handler.handle(&rx, &mut tx);
        if !tx.is_empty() {
            handler.before_send(&mut tx);
        }
        tx.iter()
            .map(|(to, reply)| {
                assert_eq!(to, src, "a reply goes back to its sender");
                reply.to_vec()
            })
            .collect()
    }
}
