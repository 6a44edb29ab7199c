//! Roughtime over a byte stream (TCP, RFC 10049 §4): packets back to back, each the `ROUGHTIM`
//! header, a little-endian `u32` message length and the message, exactly as in a datagram. A
//! connection may carry many requests and replies. Google's original protocol has no header and so
//! no framing on a stream: it is UDP only.
//!
//! [`FrameReader`] finds the packets in the bytes as they arrive, in whatever pieces the network
//! cut them into, and refuses a stream that is not Roughtime or declares a packet larger than the
//! reader allows, before buffering it.

use crate::packet::{FRAME_HEADER_LEN, MAGIC};

/// Why a stream cannot be read as Roughtime packets; the connection should be closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The next packet does not start with `ROUGHTIM`.
    #[error("a packet does not start with ROUGHTIM")]
    NotRoughtime,
    /// The header declares more bytes than this reader accepts in one packet.
    #[error("a packet declares {declared} message bytes, more than {limit}")]
    TooLong {
        /// The message length the header declared.
        declared: u32,
        /// The most the reader accepts.
        limit: usize,
    },
}

/// Splits a byte stream into whole packets (header included, as a datagram would hold them).
/// Holds at most one packet's bytes, plus whatever of the next arrived with it.
#[derive(Debug)]
pub struct FrameReader {
    buf: Vec<u8>,
    /// Bytes of `buf` already handed out as packets.
    start: usize,
    max_message: usize,
}

impl FrameReader {
    /// A reader that refuses packets whose message is longer than `max_message` bytes.
    pub fn new(max_message: usize) -> Self {
        Self {
            buf: Vec::new(),
            start: 0,
            max_message,
        }
    }

    /// Adds bytes as they arrived.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.start > 0 && self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes received and not yet handed out as a packet.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.start
    }

    /// The next whole packet, if its last byte has arrived. Checks the header as soon as its
    /// bytes are in (the magic as soon as eight are), so that a stream that is not Roughtime or
    /// announces too much is refused before its body is buffered.
    pub fn next_packet(&mut self) -> Result<Option<&[u8]>, FrameError> {
        let rest = &self.buf[self.start..];
        let seen = rest.len().min(MAGIC.len());
        if rest[..seen] != MAGIC[..seen] {
            return Err(FrameError::NotRoughtime);
        }
        let Some(len) = rest.get(MAGIC.len()..FRAME_HEADER_LEN) else {
            return Ok(None);
        };
        let declared = u32::from_le_bytes([len[0], len[1], len[2], len[3]]);
        if declared as usize > self.max_message {
            return Err(FrameError::TooLong {
                declared,
                limit: self.max_message,
            });
        }
        let total = FRAME_HEADER_LEN + declared as usize;
        if rest.len() < total {
            return Ok(None);
        }
        let from = self.start;
        self.start += total;
        // Compact once the packets handed out are most of the buffer, so it never grows past
        // about two packets however long the connection lives.
        if self.start > self.max_message {
            self.buf.drain(..from);
            self.start -= from;
            return Ok(Some(&self.buf[..total]));
        }
        Ok(Some(&self.buf[from..from + total]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn packet(body: &[u8]) -> Vec<u8> {
        let mut p = MAGIC.to_vec();
        p.extend_from_slice(&(body.len() as u32).to_le_bytes());
        p.extend_from_slice(body);
        p
    }

    #[test]
    fn packets_split_anywhere_come_out_whole_and_in_order() {
        let stream: Vec<u8> = [packet(&[1; 100]), packet(&[2; 7]), packet(&[])].concat();
        for cut in 1..stream.len() {
            let mut r = FrameReader::new(1024);
            let mut out = Vec::new();
            for piece in stream.chunks(cut) {
                r.push(piece);
                while let Some(p) = r.next_packet().unwrap() {
                    out.push(p.to_vec());
                }
            }
            assert_eq!(out, vec![packet(&[1; 100]), packet(&[2; 7]), packet(&[])]);
            assert_eq!(r.buffered(), 0);
        }
    }

    #[test]
    fn a_stream_that_is_not_roughtime_is_refused_at_its_first_wrong_byte() {
        let mut r = FrameReader::new(1024);
        r.push(b"ROUG");
        assert_eq!(r.next_packet(), Ok(None));
        r.push(b"X");
        assert_eq!(r.next_packet(), Err(FrameError::NotRoughtime));
        let mut r = FrameReader::new(1024);
        r.push(b"GET / HTTP/1.1\r\n");
        assert_eq!(r.next_packet(), Err(FrameError::NotRoughtime));
    }

    #[test]
    fn an_oversize_packet_is_refused_from_its_header() {
        let mut r = FrameReader::new(1024);
        let mut p = MAGIC.to_vec();
        p.extend_from_slice(&1025u32.to_le_bytes());
        r.push(&p);
        assert_eq!(
            r.next_packet(),
            Err(FrameError::TooLong {
                declared: 1025,
                limit: 1024
            })
        );
        let mut r = FrameReader::new(1024);
        r.push(&packet(&[0; 1024]));
        assert_eq!(r.next_packet().unwrap().map(<[u8]>::len), Some(1036));
    }

    #[test]
    fn a_long_connection_does_not_grow_the_buffer() {
        let mut r = FrameReader::new(64);
        let p = packet(&[9; 64]);
        for _ in 0..1000 {
            r.push(&p[..30]);
            assert_eq!(r.next_packet(), Ok(None));
            r.push(&p[30..]);
            assert_eq!(r.next_packet().unwrap(), Some(&p[..]));
        }
        assert!(r.buf.capacity() <= 4 * p.len(), "{}", r.buf.capacity());
    }
}
