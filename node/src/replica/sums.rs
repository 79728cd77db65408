//! Per-block checksums of a layer: the CRC32C of each 4 KiB block the
//! layer holds, 4 bytes per block, in the sidecar file `<layer>.sums`
//! (sparse: only the entries of written blocks take space). Mapped into
//! memory, so that a write records its blocks' checksums with stores, and
//! made durable at the flushes that end an interval of the dirty regions
//! (`Replica::flush`). Every read verifies the blocks
//! it takes from a layer against its table; a block whose data no longer
//! matches is corrupt, and is never served.
//!
//! A store into a page of the mapping that the file does not hold yet
//! makes the filesystem allocate it then, and on a full filesystem that
//! fault kills the whole process (SIGBUS). So every change first takes the
//! table's pages it touches (`reserve`, an `fallocate` of each page not
//! taken yet), and a full disk fails the write with ENOSPC instead.

use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::MmapMut;

use super::{BLOCK, ReplicaError};

/// The sidecar of layer file `layer` (e.g. `layer-000003.img`).
pub fn path_of(layer: &Path) -> PathBuf {
    layer.with_extension("sums")
}

/// The checksum of one block's bytes: its CRC32C (CRC-32/ISCSI, the
/// Castagnoli polynomial). The tables on disk hold these values, so the
/// function must never change, whichever way a CPU takes it (`Way`).
pub fn of(block: &[u8]) -> u32 {
    Way::of_this_cpu().of(block)
}

/// The checksums of `data`'s 4 KiB blocks (its length a multiple of
/// them), 4 bytes each, little endian, as the table holds them: what an
/// engine computes once per write and sends with it to every replica.
pub fn of_blocks(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() / BLOCK as usize * 4);
    each(data, |_, sum| out.extend_from_slice(&sum.to_le_bytes()));
    out
}

/// Calls `f(i, sum)` with the checksum (`of`) of each 4 KiB block of
/// `data` in order, the last one short if `data` ends inside a block.
/// Where the CPU's fastest way is the CRC instruction, several blocks are
/// taken at once, each its own stream (`lanes`).
pub fn each(data: &[u8], f: impl FnMut(usize, u32)) {
    Way::of_this_cpu().each(data, f);
}

/// How this CPU takes a CRC32C fastest. With 512-bit carry-less
/// multiplies, folding the block (`crc_fast`: 90 ns a block on an AMD
/// EPYC of the 4th generation, against 192 ns for the CRC instruction in
/// three streams). Without them, it depends on the CPU more than on its
/// features, so the two ways it has are timed at the first use
/// (`fastest_here`; the node plugin and each engine ask at their start,
/// and log the way): the CRC instruction (`crc32c` for one block, `lanes`
/// for several: 170 – 185 ns a block on an EPYC of the 2nd generation,
/// where `crc_fast` took 295 – 430 ns), or folding with 128-bit carry-less
/// multiplies (`Clmul`: 405 – 418 ns a block on an EPYC of the 1st
/// generation, whose CRC instruction takes three cycles each and so 625
/// ns a block even in four streams; 2026-12-06). Anything else takes
/// `crc_fast`'s own choice. Measured by the sums bench (`cargo bench -p
/// ballast-node --bench sums`), which prints the way taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Way {
    /// `crc_fast`, folding with 512-bit carry-less multiplies.
    Folded,
    /// The SSE4.2 instruction: `crc32c` for one block, `lanes` for more.
    Lanes,
    /// `crc_fast` folding with 128-bit carry-less multiplies, given the
    /// CRC's parameters as a CRC of its own (for CRC32C by name it mixes
    /// in the CRC instruction, as slow as `Lanes` where that is slow).
    Clmul,
    /// `crc_fast`'s own choice (another CPU).
    Portable,
}

impl Way {
    /// The way for this CPU: by its features, and where they leave two
    /// ways, the faster of them timed once (`fastest_here`); kept for the
    /// life of the process, as the standard library keeps the features.
    pub fn of_this_cpu() -> Way {
        static WAY: std::sync::OnceLock<Way> = std::sync::OnceLock::new();
        *WAY.get_or_init(Way::fastest_here)
    }

    fn fastest_here() -> Way {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("vpclmulqdq")
            {
                return Way::Folded;
            }
            if std::arch::is_x86_feature_detected!("sse4.2") {
                if std::arch::is_x86_feature_detected!("pclmulqdq") {
                    return Way::Lanes.or_faster(Way::Clmul);
                }
                return Way::Lanes;
            }
        }
        Way::Portable
    }

    /// `self`, or `other` when it takes the checksums of a 64 KiB write
    /// (16 blocks) in less than nine tenths of `self`'s time: the best of
    /// five runs each, in turns, after one of each to warm up. A few
    /// hundred microseconds, once.
    fn or_faster(self, other: Way) -> Way {
        let data: Vec<u8> = (0..64u32 << 10)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
            .collect();
        let time = |way: Way| {
            let start = std::time::Instant::now();
            let mut all = 0u32;
            for _ in 0..4 {
                way.each(std::hint::black_box(&data), |_, sum| all ^= sum);
            }
            std::hint::black_box(all);
            start.elapsed()
        };
        let (mut mine, mut theirs) = (time(self), time(other));
        for _ in 0..5 {
            mine = mine.min(time(self));
            theirs = theirs.min(time(other));
        }
        if theirs * 10 < mine * 9 { other } else { self }
    }

    /// The checksum of one block's bytes taken this way (see `of`).
    pub fn of(self, block: &[u8]) -> u32 {
        match self {
            // The CRC is 32 bits wide; the crate returns every width as a
            // u64.
            Way::Folded | Way::Portable => {
                crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, block) as u32
            }
            Way::Lanes => crc32c::crc32c(block),
            Way::Clmul => crc_fast::checksum_with_params(*clmul_params(), block) as u32,
        }
    }

    /// `each`, taken this way.
    pub fn each(self, data: &[u8], mut f: impl FnMut(usize, u32)) {
        let mut done = 0;
        #[cfg(target_arch = "x86_64")]
        let data = if self == Way::Lanes && std::arch::is_x86_feature_detected!("sse4.2") {
            let mut groups = data.chunks_exact(lanes::LANES * BLOCK as usize);
            for group in &mut groups {
                // SAFETY: the CPU has SSE4.2 (checked above).
                for sum in unsafe { lanes::of_group(group) } {
                    f(done, sum);
                    done += 1;
                }
            }
            groups.remainder()
        } else {
            data
        };
        for block in data.chunks(BLOCK as usize) {
            f(done, self.of(block));
            done += 1;
        }
    }
}

/// CRC32C's parameters (CRC-32/ISCSI: the reflected Castagnoli
/// polynomial, all ones in and out) as a CRC of `crc_fast`'s own, which it
/// takes by carry-less multiplies alone (`Way::Clmul`). Its folding
/// constants are made once.
fn clmul_params() -> &'static crc_fast::CrcParams {
    static PARAMS: std::sync::OnceLock<crc_fast::CrcParams> = std::sync::OnceLock::new();
    PARAMS.get_or_init(|| {
        crc_fast::CrcParams::new(
            "CRC-32/ISCSI by carry-less multiplies",
            32,
            0x1edc_6f41,
            0xffff_ffff,
            true,
            0xffff_ffff,
            0xe306_9283,
        )
    })
}

/// Several blocks' CRC32Cs at once with the CRC instruction. One
/// instruction takes 8 bytes with a latency of three cycles, and one can
/// start every cycle: a block alone waits on its own last result, so four
/// blocks go side by side, each its own stream, and no result needs the
/// others (no combining, as one buffer cut in three needs).
#[cfg(target_arch = "x86_64")]
mod lanes {
    use std::arch::x86_64::_mm_crc32_u64;

    use super::BLOCK;

    /// Blocks taken side by side.
    pub const LANES: usize = 4;

    /// The CRC32Cs of the `LANES` blocks of `group`.
    ///
    /// # Safety
    /// The CPU must have SSE4.2.
    #[target_feature(enable = "sse4.2")]
    pub unsafe fn of_group(group: &[u8]) -> [u32; LANES] {
        let (a, rest) = group.split_at(BLOCK as usize);
        let (b, rest) = rest.split_at(BLOCK as usize);
        let (c, d) = rest.split_at(BLOCK as usize);
        let mut crc = [!0u64; LANES];
        for (((a, b), c), d) in words(a).zip(words(b)).zip(words(c)).zip(words(d)) {
            crc[0] = _mm_crc32_u64(crc[0], a);
            crc[1] = _mm_crc32_u64(crc[1], b);
            crc[2] = _mm_crc32_u64(crc[2], c);
            crc[3] = _mm_crc32_u64(crc[3], d);
        }
        crc.map(|c| !(c as u32))
    }

    /// A block's bytes as the 8-byte words the instruction takes.
    fn words(block: &[u8]) -> impl Iterator<Item = u64> + '_ {
        block.chunks_exact(8).map(|bytes| {
            let mut w = [0u8; 8];
            w.copy_from_slice(bytes);
            u64::from_le_bytes(w)
        })
    }
}

pub struct BlockSums {
    path: PathBuf,
    file: File,
    /// None while the layer holds no block (an empty mapping is not allowed).
    map: Option<MmapMut>,
    blocks: u64,
    /// The table's pages known to be held by the file (one bit each, a page
    /// covering 1,024 blocks): stores into them allocate nothing.
    held: Vec<u64>,
}

/// Bytes of the table in one page of the mapping.
const PAGE: u64 = 4096;

impl BlockSums {
    /// Opens (or creates) the table for a layer of `blocks` blocks.
    pub fn open(path: &Path, blocks: u64) -> Result<BlockSums, ReplicaError> {
        let file = super::open_or_create(path)?;
        let mut sums = BlockSums {
            path: path.to_path_buf(),
            file,
            map: None,
            blocks: 0,
            held: Vec::new(),
        };
        sums.resize(blocks)?;
        Ok(sums)
    }

    /// Grows or shrinks the table to `blocks` entries.
    pub fn resize(&mut self, blocks: u64) -> Result<(), ReplicaError> {
        let io = |e| ReplicaError::io(&self.path, e);
        self.map = None;
        self.file.set_len(blocks * 4).map_err(io)?;
        // Pages past the new end are gone (a shrink frees them).
        let pages = (blocks * 4).div_ceil(PAGE);
        self.held.truncate(pages.div_ceil(64) as usize);
        if let Some(last) = self.held.last_mut()
            && !pages.is_multiple_of(64)
        {
            *last &= (1u64 << (pages % 64)) - 1;
        }
        if blocks > 0 {
            // SAFETY: the file belongs to this replica's directory; only this
            // table maps and writes it, and it is resized only here, with
            // the old mapping dropped first.
            let map = unsafe {
                memmap2::MmapOptions::new()
                    .len((blocks * 4) as usize)
                    .map_mut(&self.file)
            }
            .map_err(io)?;
            self.map = Some(map);
        }
        self.blocks = blocks;
        Ok(())
    }

    /// The recorded checksum of block `b`.
    pub fn get(&self, b: u64) -> u32 {
        match &self.map {
            Some(m) if b < self.blocks => {
                let at = (b * 4) as usize;
                u32::from_le_bytes([m[at], m[at + 1], m[at + 2], m[at + 3]])
            }
            _ => 0,
        }
    }

    /// The table's bytes for blocks `first..last`, 4 a block (cut at its
    /// end).
    pub fn bytes(&self, first: u64, last: u64) -> &[u8] {
        match &self.map {
            Some(m) => {
                let end = last.min(self.blocks);
                let start = first.min(end);
                &m[(start * 4) as usize..(end * 4) as usize]
            }
            None => &[],
        }
    }

    /// Makes the file hold the table's pages of blocks `first..last`, so
    /// that recording their checksums allocates nothing; ENOSPC when the
    /// disk has no room for them (nothing is recorded then).
    pub fn reserve(&mut self, first: u64, last: u64) -> Result<(), ReplicaError> {
        let last = last.min(self.blocks);
        if first >= last || self.map.is_none() {
            return Ok(());
        }
        for page in (first * 4 / PAGE)..=((last * 4 - 1) / PAGE) {
            let (word, bit) = ((page / 64) as usize, page % 64);
            if self.held.get(word).is_some_and(|w| w & (1 << bit) != 0) {
                continue;
            }
            let at = page * PAGE;
            let len = PAGE.min(self.blocks * 4 - at);
            nix::fcntl::fallocate(
                std::os::fd::AsFd::as_fd(&self.file),
                nix::fcntl::FallocateFlags::FALLOC_FL_KEEP_SIZE,
                at as i64,
                len as i64,
            )
            .map_err(|e| ReplicaError::io(&self.path, std::io::Error::from(e)))?;
            if self.held.len() <= word {
                self.held.resize(word + 1, 0);
            }
            self.held[word] |= 1 << bit;
        }
        Ok(())
    }

    /// Records the checksum of block `b`.
    pub fn set(&mut self, b: u64, sum: u32) -> Result<(), ReplicaError> {
        self.reserve(b, b + 1)?;
        if let Some(m) = &mut self.map
            && b < self.blocks
        {
            let at = (b * 4) as usize;
            m[at..at + 4].copy_from_slice(&sum.to_le_bytes());
        }
        Ok(())
    }

    /// Records checksums as given (`of_blocks`'s form) for the blocks from
    /// `first`.
    pub fn set_given(&mut self, first: u64, given: &[u8]) -> Result<(), ReplicaError> {
        let at = (first * 4) as usize;
        let end = at + given.len();
        if end > (self.blocks * 4) as usize {
            return Ok(());
        }
        self.reserve(first, first + (given.len() / 4) as u64)?;
        if let Some(m) = &mut self.map {
            m[at..end].copy_from_slice(given);
        }
        Ok(())
    }

    /// Records the checksums of the whole blocks in `data`, which starts at
    /// block `first`.
    pub fn set_all(&mut self, first: u64, data: &[u8]) -> Result<(), ReplicaError> {
        self.reserve(first, first + (data.len() as u64).div_ceil(BLOCK))?;
        if let Some(m) = &mut self.map {
            let (at, end) = ((first * 4) as usize, (self.blocks * 4) as usize);
            each(data, |i, sum| {
                let at = at + i * 4;
                if at + 4 <= end {
                    m[at..at + 4].copy_from_slice(&sum.to_le_bytes());
                }
            });
        }
        Ok(())
    }

    /// The blocks of whole blocks `data` (starting at block `first`) that
    /// differ from the table, every one.
    pub fn failing(&self, first: u64, data: &[u8]) -> Vec<u64> {
        let mut bad = Vec::new();
        each(data, |i, sum| {
            let b = first + i as u64;
            if sum != self.get(b) {
                bad.push(b);
            }
        });
        bad
    }

    /// Checks whole blocks `data` (starting at block `first`) against the
    /// table; the first block that differs.
    pub fn check(&self, first: u64, data: &[u8]) -> Result<(), u64> {
        let mut bad = None;
        each(data, |i, sum| {
            let b = first + i as u64;
            if bad.is_none() && sum != self.get(b) {
                bad = Some(b);
            }
        });
        bad.map_or(Ok(()), Err)
    }

    /// Makes the table durable: one `fdatasync`, which writes back the
    /// pages the mapping dirtied as well (the revision file's `sync` says
    /// why no `msync` comes first).
    pub fn sync(&self) -> Result<(), ReplicaError> {
        self.file
            .sync_data()
            .map_err(|e| ReplicaError::io(&self.path, e))
    }
}

#[cfg(test)]
mod tests {
    use super::{BLOCK, each, of};

    /// A store only lands in pages the file holds: `reserve` (and every
    /// `set*`, through it) allocates the table's pages a change touches,
    /// and only those, so the table stays sparse elsewhere.
    #[test]
    fn a_change_takes_the_pages_it_touches_first() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("layer-000001.sums");
        // 1 GiB of blocks: a table of 1 MiB, 256 pages, none held yet.
        let mut sums = super::BlockSums::open(&path, 1 << 18).unwrap();
        let held = || std::fs::metadata(&path).unwrap().blocks() * 512;
        assert_eq!(held(), 0);
        sums.reserve(0, 1).unwrap();
        assert_eq!(held(), 4096);
        // Blocks 1,000 to 1,100 straddle the first two pages' border.
        sums.set_all(1000, &vec![7u8; 100 * 4096]).unwrap();
        assert_eq!(held(), 2 * 4096);
        sums.set(200_000, 1).unwrap();
        assert_eq!(held(), 3 * 4096);
        assert_eq!(sums.get(200_000), 1);
    }

    /// The tables on disk hold these values: the CRC32C standard check
    /// value, and two whole blocks as every build since the format began
    /// computed them. A change of the CRC's implementation must keep them.
    #[test]
    fn a_blocks_checksum_is_the_crc32c_the_tables_on_disk_hold() {
        let pattern: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
        for way in EVERY_WAY {
            assert_eq!(way.of(b"123456789"), 0xe306_9283, "{way:?}");
            assert_eq!(way.of(&[0u8; 4096]), 0x98f9_4189, "{way:?}");
            assert_eq!(way.of(&pattern), 0x7190_77fc, "{way:?}");
        }
        assert_eq!(of(&pattern), 0x7190_77fc);
    }

    const EVERY_WAY: [super::Way; 4] = [
        super::Way::Folded,
        super::Way::Lanes,
        super::Way::Clmul,
        super::Way::Portable,
    ];

    /// CRC32C bit by bit, as its definition says (the reflected
    /// Castagnoli polynomial): the model every fast way is checked
    /// against.
    fn by_definition(data: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &byte in data {
            crc ^= u32::from(byte);
            for _ in 0..8 {
                crc = if crc & 1 == 1 {
                    (crc >> 1) ^ 0x82f6_3b78
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }

    proptest::proptest! {
        /// Every way a CPU may take (`Way`), not only this one's, gives
        /// the CRC32C of the definition, at random lengths up to 9,000
        /// bytes and random starts in memory: a way that differed would
        /// fail every table written before it.
        #[test]
        fn every_way_gives_the_crc32c_of_the_definition_at_any_length_and_alignment(
            bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..9000),
            skip in 0usize..64,
        ) {
            let data = &bytes[skip.min(bytes.len())..];
            let want = by_definition(data);
            proptest::prop_assert_eq!(of(data), want);
            for way in EVERY_WAY {
                proptest::prop_assert_eq!(way.of(data), want, "{:?}", way);
            }
        }

        /// `each` gives every block's `of`, in order, whether the blocks
        /// go in groups side by side or alone (a short group at the end,
        /// a short last block), at any start in memory, this CPU's way
        /// and every other (`Lanes` side by side where the CPU has the
        /// instruction).
        #[test]
        fn each_gives_every_blocks_checksum_in_order(
            blocks in 0usize..11,
            tail in 0usize..4096,
            seed in proptest::num::u8::ANY,
            skip in 0usize..64,
        ) {
            let len = blocks * BLOCK as usize + tail;
            let bytes: Vec<u8> = (0..len + skip)
                .map(|i| (i as u32).wrapping_mul(2_654_435_761).wrapping_add(u32::from(seed)) as u8)
                .collect();
            let data = &bytes[skip..];
            let want: Vec<(usize, u32)> =
                data.chunks(BLOCK as usize).map(by_definition).enumerate().collect();
            let mut got = Vec::new();
            each(data, |i, sum| got.push((i, sum)));
            proptest::prop_assert_eq!(&got, &want);
            for way in EVERY_WAY {
                got.clear();
                way.each(data, |i, sum| got.push((i, sum)));
                proptest::prop_assert_eq!(&got, &want, "{:?}", way);
            }
        }
    }
}
