//! A [`BlockTarget`] over a plain file (`--backend file:PATH`), writing straight through:
//! a kill -9 loses nothing acknowledged, so it exercises recovery without the engine.

use crate::BlockTarget;
use std::fs::File;
use std::os::unix::fs::FileExt;

pub struct RawFileTarget {
    file: File,
    capacity: u64,
    chunk: u64,
}

impl RawFileTarget {
    pub fn open(path: &str, chunk: u64) -> std::io::Result<RawFileTarget> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)?;
        let capacity = file.metadata()?.len() & !4095;
        Ok(RawFileTarget {
            file,
            capacity,
            chunk: chunk.max(4096),
        })
    }
}

fn errno(e: std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}

impl BlockTarget for RawFileTarget {
    fn capacity(&self) -> u64 {
        self.capacity
    }
    fn chunk_size(&self) -> u64 {
        self.chunk
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), i32> {
        self.file.read_exact_at(buf, offset).map_err(errno)
    }
    fn write(&self, offset: u64, buf: &[u8], fua: bool) -> Result<(), i32> {
        self.file.write_all_at(buf, offset).map_err(errno)?;
        if fua {
            self.file.sync_data().map_err(errno)?;
        }
        Ok(())
    }
    fn discard(&self, offset: u64, len: u64) -> Result<(), i32> {
        self.write_zeroes(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), i32> {
        let zero = vec![0u8; len.min(1 << 20) as usize];
        let mut pos = offset;
        while pos < offset + len {
            let n = (offset + len - pos).min(zero.len() as u64) as usize;
            self.file.write_all_at(&zero[..n], pos).map_err(errno)?;
            pos += n as u64;
        }
        Ok(())
    }
    fn flush(&self) -> Result<(), i32> {
        self.file.sync_data().map_err(errno)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_reach_the_file() {
        let f = tempfile::NamedTempFile::new().unwrap();
        f.as_file().set_len(1 << 20).unwrap();
        let t = RawFileTarget::open(f.path().to_str().unwrap(), 65536).unwrap();
        assert_eq!(t.capacity(), 1 << 20);
        t.write(4096, &[9u8; 4096], true).unwrap();
        let mut b = [0u8; 4096];
        f.as_file().read_exact_at(&mut b, 4096).unwrap();
        assert!(b.iter().all(|&x| x == 9));
        t.discard(4096, 4096).unwrap();
        t.read(4096, &mut b).unwrap();
        assert!(b.iter().all(|&x| x == 0));
    }
}
