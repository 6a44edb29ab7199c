//! The client's side of the Roughtime ecosystem (RFC 10049 §8): reading a server list, choosing
//! servers from it, and driving a measurement sequence across them that carries on past servers
//! that do not answer.
//!
//! This sits above [`verify_reply`] and [`verify_chain`](crate::verify_chain):
//! [`ServerList::parse`] reads the list a vendor ships (§8.3), [`choose`] picks the servers at
//! random (§8.2), a [`Chain`] says which server to ask next and with which request, and takes back
//! each reply or the lack of one; its [`Chain::links`] go to [`verify_chain`](crate::verify_chain),
//! and [`accusations`] names the servers behind each contradiction found. Like the rest of the
//! crate it does no IO: the caller sends the requests,
//! waits for replies as long as it likes, and supplies the random numbers.

mod list;
mod measure;
mod verdict;

pub use list::{
    ListError, ListedServer, ListedVersion, ServerAddress, ServerList, ServerRef, Transport,
};
pub use measure::{Chain, Failure, FailureReason, MIN_SERVERS, Plan, Query, choose};
pub use verdict::{Accusation, accusations, suspects};

#[cfg(test)]
mod testing;
