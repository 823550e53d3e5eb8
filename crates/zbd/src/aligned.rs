//! [`AlignedBuf`]: an owned byte buffer whose start is 4096-aligned, as `O_DIRECT` needs.
//!
//! Built on a `Vec` of 4 KiB blocks that are aligned to their size, so the allocation is
//! the standard library's and the only unsafe code is viewing those blocks as bytes.

use std::ops::{Deref, DerefMut};

const ALIGN: usize = 4096;

/// The unit an [`AlignedBuf`] is allocated in: 4096 bytes, aligned to 4096. `repr(C)` with
/// size == alignment: no padding, every byte is one of the array's initialised `u8`s.
#[derive(Clone, Copy)]
#[repr(C, align(4096))]
struct Block([u8; ALIGN]);

const _: () = assert!(std::mem::size_of::<Block>() == ALIGN);
const _: () = assert!(std::mem::align_of::<Block>() == ALIGN);

const ZERO: Block = Block([0; ALIGN]);

/// An owned, zero-initialised byte buffer whose start is aligned to 4096 bytes
/// ([`AlignedBuf::ALIGN`]), for `O_DIRECT` I/O without a bounce copy. It derefs to `[u8]`
/// (its length is any number of bytes; the allocation is whole 4 KiB blocks); unlike a
/// `Vec<u8>` it only grows through [`AlignedBuf::resize`].
///
/// Even an empty buffer's pointer is aligned (and nothing is allocated for it).
#[derive(Clone, Default)]
pub struct AlignedBuf {
    /// Invariant: `blocks.len() == len.div_ceil(ALIGN)`.
    blocks: Vec<Block>,
    len: usize,
}

impl AlignedBuf {
    /// The alignment of the buffer's start, in bytes.
    pub const ALIGN: usize = ALIGN;

    /// An empty buffer; allocates nothing.
    pub const fn new() -> AlignedBuf {
        AlignedBuf {
            blocks: Vec::new(),
            len: 0,
        }
    }

    /// `len` zero bytes.
    pub fn new_zeroed(len: usize) -> AlignedBuf {
        AlignedBuf {
            blocks: vec![ZERO; len.div_ceil(ALIGN)],
            len,
        }
    }

    /// Bytes the buffer holds without reallocating (a multiple of 4096).
    pub fn capacity(&self) -> usize {
        self.blocks.capacity() * ALIGN
    }

    /// Makes the buffer `new_len` bytes long, like `Vec::resize(new_len, 0)`: the first
    /// `min(len, new_len)` bytes are kept, bytes added are zero. Growing past the capacity
    /// reallocates (the start stays aligned); shrinking keeps the allocation.
    pub fn resize(&mut self, new_len: usize) {
        let old = self.len;
        if new_len <= old {
            self.blocks.truncate(new_len.div_ceil(ALIGN));
            self.len = new_len;
            return;
        }
        // Blocks added are zero; what the old last block holds past `old` may not be.
        let old_end = self.blocks.len() * ALIGN;
        self.blocks.resize(new_len.div_ceil(ALIGN), ZERO);
        self.len = new_len;
        self[old..new_len.min(old_end)].fill(0);
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // SAFETY: `blocks` holds `len.div_ceil(4096)` initialised blocks, i.e. at least `len`
        // contiguous initialised bytes (a `Block` is a `[u8; 4096]` without padding), valid
        // for reads for as long as `self` is borrowed; `u8` needs no alignment; and
        // `len <= isize::MAX` because that many bytes were allocated. An empty `Vec`'s
        // pointer is non-null (dangling, aligned), which a zero-length slice allows.
        unsafe { std::slice::from_raw_parts(self.blocks.as_ptr().cast::<u8>(), self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`; the `&mut self` borrow makes the bytes exclusively ours for
        // the slice's lifetime, and any byte pattern is a valid `Block`.
        unsafe { std::slice::from_raw_parts_mut(self.blocks.as_mut_ptr().cast::<u8>(), self.len) }
    }
}

impl AsRef<[u8]> for AlignedBuf {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl AsMut<[u8]> for AlignedBuf {
    fn as_mut(&mut self) -> &mut [u8] {
        self
    }
}

/// Equal when the bytes are (capacity does not count).
impl PartialEq for AlignedBuf {
    fn eq(&self, other: &AlignedBuf) -> bool {
        **self == **other
    }
}

impl Eq for AlignedBuf {}

/// The length only: the bytes of an I/O buffer are rarely worth printing.
impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn aligned(b: &AlignedBuf) -> bool {
        (b.as_ptr() as usize).is_multiple_of(AlignedBuf::ALIGN)
    }

    #[test]
    fn new_zeroed_is_aligned_and_zero() {
        for len in [0, 1, 512, 4095, 4096, 4097, 3 << 20] {
            let b = AlignedBuf::new_zeroed(len);
            assert_eq!(b.len(), len);
            assert!(aligned(&b), "len {len}");
            assert!(b.capacity() >= len && b.capacity().is_multiple_of(4096));
            assert!(b.iter().all(|&x| x == 0));
        }
        let e = AlignedBuf::new();
        assert!(e.is_empty() && aligned(&e));
        assert_eq!(e.capacity(), 0);
        assert_eq!(AlignedBuf::default(), e);
    }

    #[test]
    fn resize_keeps_the_front_and_zeroes_what_it_adds() {
        let mut b = AlignedBuf::new_zeroed(100);
        b.fill(7);
        b.resize(6000);
        assert!(aligned(&b));
        assert!(b[..100].iter().all(|&x| x == 7));
        assert!(b[100..].iter().all(|&x| x == 0));
        // Shrinking then growing again inside the same block: the old bytes are gone.
        b.fill(9);
        b.resize(10);
        assert_eq!(&b[..], &[9; 10]);
        b.resize(5000);
        assert!(b[..10].iter().all(|&x| x == 9));
        assert!(b[10..].iter().all(|&x| x == 0), "bytes past the old length");
        b.resize(0);
        assert!(b.is_empty() && aligned(&b));
        b.resize(1 << 20);
        assert!(aligned(&b) && b.iter().all(|&x| x == 0));
    }

    #[test]
    fn clone_and_eq_compare_bytes() {
        let mut a = AlignedBuf::new_zeroed(8192);
        a[4096] = 1;
        let c = a.clone();
        assert!(aligned(&c));
        assert_eq!(a, c);
        assert_eq!(c[4096], 1);
        let mut d = AlignedBuf::new_zeroed(9000);
        d.resize(8192);
        assert_ne!(a, d);
        d[4096] = 1;
        assert_eq!(a, d);
        assert_eq!(format!("{a:?}"), "AlignedBuf { len: 8192, .. }");
    }
}
