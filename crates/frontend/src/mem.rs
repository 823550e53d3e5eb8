//! An in-memory [`BlockTarget`] (`--backend mem:SIZE`): proves the ublk plumbing without an
//! engine, and serves frontend tests. Chunks are allocated on first write; unwritten chunks
//! read as zeros.

use crate::BlockTarget;
use parking_lot::Mutex;

pub struct MemTarget {
    capacity: u64,
    chunk: u64,
    chunks: Vec<Mutex<Option<Box<[u8]>>>>,
}

impl MemTarget {
    /// `capacity` is rounded down to a multiple of 4096; `chunk` must be a non-zero
    /// multiple of 4096.
    pub fn new(capacity: u64, chunk: u64) -> MemTarget {
        let capacity = capacity & !4095;
        let chunk = chunk.max(4096);
        let n = capacity.div_ceil(chunk) as usize;
        MemTarget {
            capacity,
            chunk,
            chunks: (0..n).map(|_| Mutex::new(None)).collect(),
        }
    }

    fn locate(&self, offset: u64, len: u64) -> Result<(usize, usize), i32> {
        let end = offset.checked_add(len).ok_or(libc::EINVAL)?;
        if end > self.capacity || (len > 0 && offset / self.chunk != (end - 1) / self.chunk) {
            return Err(libc::EINVAL);
        }
        Ok((
            (offset / self.chunk) as usize,
            (offset % self.chunk) as usize,
        ))
    }

    fn fill(&self, offset: u64, len: u64, data: Option<&[u8]>) -> Result<(), i32> {
        let (i, o) = self.locate(offset, len)?;
        let mut c = self.chunks[i].lock();
        match data {
            Some(d) => {
                let chunk = c.get_or_insert_with(|| vec![0u8; self.chunk as usize].into());
                chunk[o..o + d.len()].copy_from_slice(d);
            }
            None => {
                if let Some(chunk) = c.as_mut() {
                    chunk[o..o + len as usize].fill(0);
                }
            }
        }
        Ok(())
    }
}

impl BlockTarget for MemTarget {
    fn capacity(&self) -> u64 {
        self.capacity
    }
    fn chunk_size(&self) -> u64 {
        self.chunk
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), i32> {
        let (i, o) = self.locate(offset, buf.len() as u64)?;
        match self.chunks[i].lock().as_ref() {
            Some(chunk) => buf.copy_from_slice(&chunk[o..o + buf.len()]),
            None => buf.fill(0),
        }
        Ok(())
    }
    fn write(&self, offset: u64, buf: &[u8], _fua: bool) -> Result<(), i32> {
        self.fill(offset, buf.len() as u64, Some(buf))
    }
    fn discard(&self, offset: u64, len: u64) -> Result<(), i32> {
        self.fill(offset, len, None)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), i32> {
        self.fill(offset, len, None)
    }
    fn flush(&self) -> Result<(), i32> {
        Ok(())
    }
    fn never_blocks(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_zeroes_and_bounds() {
        let t = MemTarget::new(1 << 20, 64 << 10);
        let mut b = vec![1u8; 4096];
        t.read(8192, &mut b).unwrap();
        assert!(b.iter().all(|&x| x == 0));
        t.write(8192, &[7u8; 8192], false).unwrap();
        t.read(12288, &mut b).unwrap();
        assert!(b.iter().all(|&x| x == 7));
        t.write_zeroes(12288, 4096).unwrap();
        t.read(12288, &mut b).unwrap();
        assert!(b.iter().all(|&x| x == 0));
        t.read(8192, &mut b).unwrap();
        assert!(b.iter().all(|&x| x == 7));
        // crossing a chunk end or the capacity is refused
        assert_eq!(
            t.write((64 << 10) - 4096, &[0u8; 8192], false),
            Err(libc::EINVAL)
        );
        assert_eq!(t.read(1 << 20, &mut b), Err(libc::EINVAL));
    }
}
