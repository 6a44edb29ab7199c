//! Byte-level reading and writing: a borrowing reader and a cursor over a caller's buffer.
//!
//! Everything above this module (messages, packets, replies) reads through [`Reader`] so that
//! bounds are checked in one place and a short input is an error, never a panic; and writes
//! through [`Writer`] so that encoding into a caller-provided buffer never allocates.

/// A cursor over borrowed bytes, in the style of rustls' `codec::Reader`.
///
/// Every `take` either returns the bytes or `None` without moving; nothing here panics on short
/// input.
#[derive(Debug, Clone)]
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// Starts reading at the beginning of `buf`.
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    /// The next `len` bytes.
    pub(crate) fn take(&mut self, len: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(len)?;
        let bytes = self.buf.get(self.pos..end)?;
        self.pos = end;
        Some(bytes)
    }

    /// The next `N` bytes as an array reference.
    pub(crate) fn take_array<const N: usize>(&mut self) -> Option<&'a [u8; N]> {
        self.take(N)?.try_into().ok()
    }

    /// A little-endian `u32`.
    pub(crate) fn u32(&mut self) -> Option<u32> {
        self.take_array::<4>().map(|b| u32::from_le_bytes(*b))
    }

    /// A little-endian `u64`.
    #[cfg(test)]
    pub(crate) fn u64(&mut self) -> Option<u64> {
        self.take_array::<8>().map(|b| u64::from_le_bytes(*b))
    }

    /// Everything not read yet; the reader is then empty.
    pub(crate) fn rest(&mut self) -> &'a [u8] {
        let rest = self.buf.get(self.pos..).unwrap_or_default();
        self.pos = self.buf.len();
        rest
    }

    /// How many bytes are left.
    pub(crate) fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    /// True when everything has been read.
    pub(crate) fn is_empty(&self) -> bool {
        self.remaining() == 0
    }
}

/// Reads a little-endian `u32` at a byte offset the caller has already bounds-checked; `None`
/// otherwise, so even a wrong caller cannot panic.
pub(crate) fn u32_at(buf: &[u8], offset: usize) -> Option<u32> {
    let bytes = buf.get(offset..offset.checked_add(4)?)?;
    Some(u32::from_le_bytes(bytes.try_into().ok()?))
}

/// The caller's buffer was too small for what had to be written into it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("buffer too small: need {needed} bytes, have {available}")]
pub struct BufferTooSmall {
    /// Bytes the complete output needs.
    pub needed: usize,
    /// Bytes the buffer has.
    pub available: usize,
}

/// A write cursor over a caller-provided buffer.
#[derive(Debug)]
pub(crate) struct Writer<'a> {
    buf: &'a mut [u8],
    pos: usize,
}

impl<'a> Writer<'a> {
    /// Starts writing at the beginning of `buf`.
    pub(crate) fn new(buf: &'a mut [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    /// Appends `bytes`.
    pub(crate) fn put(&mut self, bytes: &[u8]) -> Result<(), BufferTooSmall> {
        self.slot(bytes.len())?.copy_from_slice(bytes);
        Ok(())
    }

    /// Appends a little-endian `u32`.
    pub(crate) fn put_u32(&mut self, value: u32) -> Result<(), BufferTooSmall> {
        self.put(&value.to_le_bytes())
    }

    /// Appends a little-endian `u64`.
    pub(crate) fn put_u64(&mut self, value: u64) -> Result<(), BufferTooSmall> {
        self.put(&value.to_le_bytes())
    }

    /// Appends `len` zero bytes.
    pub(crate) fn put_zeros(&mut self, len: usize) -> Result<(), BufferTooSmall> {
        self.slot(len)?.fill(0);
        Ok(())
    }

    /// Reserves the next `len` bytes and hands them out to be filled in place, e.g. by a hash
    /// function, so that nothing has to be assembled elsewhere and copied.
    pub(crate) fn slot(&mut self, len: usize) -> Result<&mut [u8], BufferTooSmall> {
        let too_small = BufferTooSmall {
            needed: self.pos.saturating_add(len),
            available: self.buf.len(),
        };
        let end = self.pos.checked_add(len).ok_or(too_small)?;
        let slot = self.buf.get_mut(self.pos..end).ok_or(too_small)?;
        self.pos = end;
        Ok(slot)
    }

    /// Bytes written so far.
    pub(crate) fn position(&self) -> usize {
        self.pos
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reader_takes_and_stops_at_the_end() {
        let mut r = Reader::new(&[1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 9]);
        assert_eq!(r.u32(), Some(1));
        assert_eq!(r.u64(), Some(2));
        assert_eq!(r.remaining(), 1);
        assert_eq!(r.u32(), None, "a short read fails");
        assert_eq!(r.remaining(), 1, "and does not move");
        assert_eq!(r.take_array::<1>(), Some(&[9]));
        assert!(r.is_empty());
        assert_eq!(r.rest(), &[] as &[u8]);
    }

    #[test]
    fn reader_never_overflows() {
        let mut r = Reader::new(&[0; 4]);
        assert_eq!(r.take(usize::MAX), None);
        assert_eq!(u32_at(&[0; 4], usize::MAX - 1), None);
    }

    #[test]
    fn writer_reports_what_it_needed() {
        let mut buf = [0xaa; 6];
        let mut w = Writer::new(&mut buf);
        w.put_u32(0x0403_0201).unwrap();
        assert_eq!(
            w.put_u32(5),
            Err(BufferTooSmall {
                needed: 8,
                available: 6
            })
        );
        w.put_zeros(2).unwrap();
        assert_eq!(w.position(), 6);
        assert_eq!(buf, [1, 2, 3, 4, 0, 0]);
    }
}
