//! NTP: the batch handler the socket and XDP workers run, around chime-ntp's responder.

pub(crate) mod worker;
