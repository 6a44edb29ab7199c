//! A request handed from a Roughtime TCP connection to a signer (Ed25519's, or the ML-DSA-44
//! suite's), and what becomes of it: the queue's contract between the two.

use std::net::IpAddr;

use tokio::sync::mpsc;

/// One request on its way to the signer, when it was read, and where its reply goes.
pub(crate) struct Job {
    pub(crate) packet: Vec<u8>,
    pub(crate) peer: IpAddr,
    pub(crate) read_at: std::time::Instant,
    pub(crate) reply: mpsc::Sender<Reply>,
}

/// What becomes of a request.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Reply {
    Signed(Vec<u8>),
    /// Not answered, as the drop counters say why: the connection is closed.
    Dropped,
    /// Not answered: it waited too long (see [`Ageing`]).
    Shed,
}

/// Tells every connection of a batch that is not signed that its request gets no reply. A
/// connection that went away meanwhile has closed its channel: the send fails, nothing more.
pub(crate) fn refuse_all(jobs: &[Job]) {
    for job in jobs {
        let _ = job.reply.try_send(Reply::Dropped);
    }
}

/// Jobs made by hand, for the signers' tests.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;
    use crate::observe::stats::{WorkerStats, Workers};
    use crate::roughtime::state::RoughtimeDrop;

    /// Where a job's answer arrives.
    pub(in crate::roughtime) type Answer = mpsc::Receiver<Reply>;

    /// `packets` as jobs from `peer`, and where each one's answer arrives.
    pub(in crate::roughtime) fn jobs(packets: &[Vec<u8>], peer: &str) -> (Vec<Job>, Vec<Answer>) {
        packets
            .iter()
            .map(|packet| {
                let (reply, answer) = mpsc::channel(1);
                let peer = peer.parse().unwrap();
                let job = Job {
                    packet: packet.clone(),
                    peer,
                    read_at: std::time::Instant::now(),
                    reply,
                };
                (job, answer)
            })
            .unzip()
    }

    pub(in crate::roughtime) fn stats() -> WorkerStats<RoughtimeDrop> {
        let workers = Workers::<RoughtimeDrop>::new("roughtime");
        WorkerStats::new("test", None, (&workers, "test", 0))
    }

    pub(in crate::roughtime) fn answers(mut answers: Vec<Answer>) -> Vec<Option<Vec<u8>>> {
        answers
            .iter_mut()
            .map(|a| match a.try_recv() {
                Ok(Reply::Signed(reply)) => Some(reply),
                Ok(Reply::Dropped) => None,
                other => panic!("every job is answered, with a reply or without: {other:?}"),
            })
            .collect()
    }
}
