//! What one I/O on a queue thread's ring may carry ([`IoLimit`]): the block layer's limits
//! of the target's device, read from sysfs.

/// How much one ring read or write may carry for the block layer to take it as it is: one
/// bio, not split. One it would split, or need a second bio for, comes back `-EAGAIN` when
/// `RWF_NOWAIT` (see [`crate::queue::RingIo`]) and goes to the pool, so a write group asks
/// the target to place no more than this at once ([`IoLimit::fits`]), and a hop-free read
/// cuts a longer device segment into reads of this size ([`IoLimit::piece`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoLimit {
    /// Pages the buffers span (each may be a segment of its own): at most `BIO_MAX_VECS`
    /// and the queue's `max_segments`.
    pub pages: u64,
    /// Bytes: the queue's `max_sectors_kb`.
    pub bytes: u64,
}

/// `BIO_MAX_VECS`: the most pages one bio holds.
const BIO_PAGES: u64 = 256;
const PAGE: u64 = 4096;

impl Default for IoLimit {
    /// One bio's worth: for a file, or a device whose queue limits cannot be read.
    fn default() -> Self {
        IoLimit {
            pages: BIO_PAGES,
            bytes: BIO_PAGES * PAGE,
        }
    }
}

impl IoLimit {
    /// The limit of writes to `fd`: for a block device, its queue's `max_segments` and
    /// `max_sectors_kb` (sysfs; a partition's are its disk's) within one bio; otherwise
    /// one bio's worth.
    pub fn of_fd(fd: std::os::fd::RawFd) -> Self {
        let one_bio = IoLimit::default();
        let Ok(st) = nix::sys::stat::fstat(fd) else {
            return one_bio;
        };
        if st.st_mode & libc::S_IFMT != libc::S_IFBLK {
            return one_bio;
        }
        let (major, minor) = (libc::major(st.st_rdev), libc::minor(st.st_rdev));
        let dir = format!("/sys/dev/block/{major}:{minor}");
        let read = |name: &str| -> Option<u64> {
            ["queue", "../queue"].iter().find_map(|q| {
                std::fs::read_to_string(format!("{dir}/{q}/{name}"))
                    .ok()?
                    .trim()
                    .parse()
                    .ok()
            })
        };
        IoLimit {
            pages: read("max_segments").map_or(BIO_PAGES, |n| n.clamp(1, BIO_PAGES)),
            bytes: read("max_sectors_kb").map_or(one_bio.bytes, |kb| (kb * 1024).max(PAGE)),
        }
    }

    /// The most bytes one read into page-aligned memory may carry: a multiple of 4096.
    pub fn piece(&self) -> u64 {
        (self.bytes.min(self.pages * PAGE) / PAGE).max(1) * PAGE
    }

    /// How many of `writes` (`(buffer address, length)`, in order), from the first, one
    /// vectored write may carry: 0 when the first alone is too big (a write the device
    /// would turn away: it goes to the pool without trying the ring).
    pub(crate) fn fits(&self, writes: impl Iterator<Item = (usize, u64)>) -> usize {
        let (mut pages, mut bytes, mut n) = (0, 0, 0);
        for (addr, len) in writes {
            pages += (addr as u64 % PAGE + len).div_ceil(PAGE);
            bytes += len;
            if pages > self.pages || bytes > self.bytes {
                break;
            }
            n += 1;
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::IoLimit;

    #[test]
    fn a_piece_is_whole_pages_within_both_limits() {
        let l = |pages, bytes| IoLimit { pages, bytes };
        assert_eq!(l(256, 1 << 20).piece(), 1 << 20);
        assert_eq!(l(128, 1 << 20).piece(), 512 << 10);
        assert_eq!(
            l(256, 127 << 10).piece(),
            124 << 10,
            "rounded down to a page"
        );
        assert_eq!(l(1, 1024).piece(), 4096, "one page at least");
    }

    /// Pages are counted as the buffers span them: an unaligned buffer spans one more.
    #[test]
    fn a_write_limit_counts_the_pages_buffers_span() {
        let l = IoLimit {
            pages: 4,
            bytes: 1 << 20,
        };
        assert_eq!(
            l.fits([(0, 4096), (8192, 4096), (16384, 8192)].into_iter()),
            3
        );
        assert_eq!(l.fits([(512, 4096), (8192 + 512, 4096)].into_iter()), 2);
        assert_eq!(
            l.fits([(512, 4096), (8192 + 512, 4096), (0, 4096)].into_iter()),
            2
        );
        assert_eq!(
            l.fits([(0, 1 << 20), (0, 4096)].into_iter()),
            0,
            "too big alone"
        );
        // A file (not a block device): one bio's worth.
        let f = tempfile::tempfile().unwrap();
        use std::os::fd::AsRawFd;
        assert_eq!(IoLimit::of_fd(f.as_raw_fd()), IoLimit::default());
    }
}
