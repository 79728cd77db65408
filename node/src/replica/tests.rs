//! The replica format against an in-memory model, and its on-disk shape.

use std::os::unix::fs::MetadataExt;

use proptest::prelude::*;

use super::sums::of_blocks;
use super::*;

#[derive(Clone, Debug)]
enum Op {
    Write {
        offset: u64,
        len: u64,
        byte: u8,
    },
    Trim {
        offset: u64,
        len: u64,
    },
    Snapshot,
    Reopen,
    Grow,
    Read {
        offset: u64,
        len: u64,
    },
    /// Merges the next pair of frozen layers; with `cut`, stops after that
    /// many chunks of 8 blocks and reopens, as after a crash.
    Merge {
        cut: Option<u8>,
    },
}

const START: u64 = 64 * BLOCK;

fn op() -> impl Strategy<Value = Op> {
    // Offsets and lengths in 512-byte units, as NBD clients send them.
    let range = (0u64..(START / 512), 1u64..40).prop_map(|(o, l)| (o * 512, l * 512));
    prop_oneof![
        6 => (range.clone(), any::<u8>()).prop_map(|((offset, len), byte)| Op::Write { offset, len, byte }),
        2 => range.clone().prop_map(|(offset, len)| Op::Trim { offset, len }),
        1 => Just(Op::Snapshot),
        1 => Just(Op::Reopen),
        1 => Just(Op::Grow),
        3 => range.prop_map(|(offset, len)| Op::Read { offset, len }),
        2 => prop::option::of(0u8..6).prop_map(|cut| Op::Merge { cut }),
    ]
}

/// 96 cases in CI; PROPTEST_CASES=5000 explores further.
fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok());
    ProptestConfig {
        cases: cases.unwrap_or(96),
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn reads_always_match_the_model(ops in prop::collection::vec(op(), 1..60)) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r");
        let mut r = Replica::create(&path, START).unwrap();
        let mut model = vec![0u8; START as usize];
        for op in ops {
            let size = model.len() as u64;
            match op {
                Op::Write { offset, len, byte } => {
                    let (offset, len) = (offset % size, len.min(size - offset % size));
                    r.write(offset, &vec![byte; len as usize], None).unwrap();
                    model[offset as usize..(offset + len) as usize].fill(byte);
                }
                Op::Trim { offset, len } => {
                    let (offset, len) = (offset % size, len.min(size - offset % size));
                    r.trim(offset, len, None).unwrap();
                    model[offset as usize..(offset + len) as usize].fill(0);
                }
                Op::Snapshot => {
                    r.snapshot(None).unwrap();
                }
                Op::Reopen => {
                    r.flush().unwrap();
                    drop(r);
                    r = Replica::open(&path).unwrap();
                }
                Op::Grow => {
                    let new = size + 8 * BLOCK;
                    r.grow(new).unwrap();
                    model.resize(new as usize, 0);
                }
                Op::Read { offset, len } => {
                    let (offset, len) = (offset % size, len.min(size - offset % size));
                    let mut buf = vec![0xEE; len as usize];
                    r.read(offset, &mut buf).unwrap();
                    prop_assert_eq!(&buf[..], &model[offset as usize..(offset + len) as usize]);
                }
                Op::Merge { cut } => {
                    let Some(j) = r.next_merge() else { continue };
                    let before = r.chain().len();
                    match cut {
                        None => {
                            r.merge(&j, false, |_| {}).unwrap();
                        }
                        Some(steps) => {
                            r.begin_merge(&j).unwrap();
                            let mut at = Some(0);
                            for _ in 0..steps {
                                let Some(b) = at else { break };
                                at = r.merge_some(b, 8, false).unwrap().next;
                            }
                            r.flush().unwrap();
                            drop(r);
                            r = Replica::open(&path).unwrap();
                        }
                    }
                    prop_assert_eq!(r.chain().len(), before - 1);
                    prop_assert!(!r.chain().contains(&j.from));
                    prop_assert!(!path.join(&j.from).exists(), "the merged layer's file is gone");
                }
            }
        }
        let mut all = vec![0u8; model.len()];
        r.read(0, &mut all).unwrap();
        prop_assert!(all == model, "final contents differ");
        r.verify().unwrap();
        drop(r);
        let r = Replica::open(&path).unwrap();
        let mut again = vec![0u8; model.len()];
        r.read(0, &mut again).unwrap();
        prop_assert!(again == model, "contents differ after reopen");
    }
}

#[test]
fn the_allocation_map_survives_a_reopen_and_files_stay_sparse() {
    let dir = tempfile::tempdir().unwrap();
    let size = 1 << 30;
    let mut r = Replica::create(dir.path(), size).unwrap();
    r.write(0, &[1u8; 4096], None).unwrap();
    r.write(512 << 20, &[2u8; 8192], None).unwrap();
    r.flush().unwrap();
    let head = dir.path().join(r.chain()[0].clone());
    let meta = std::fs::metadata(&head).unwrap();
    assert_eq!(meta.len(), size, "apparent size is the volume size");
    assert!(
        meta.blocks() * 512 <= 64 * 1024,
        "only written blocks are allocated: {}",
        meta.blocks() * 512
    );
    drop(r);
    let r = Replica::open(dir.path()).unwrap();
    assert_eq!(r.layers()[0].allocated, 3 * BLOCK);
}

#[test]
fn a_read_comes_from_the_newest_layer_that_holds_the_block() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = Replica::create(dir.path(), 16 * BLOCK).unwrap();
    r.write(0, &[1u8; 8192], None).unwrap();
    let frozen = r.snapshot(None).unwrap();
    r.write(4096, &[2u8; 4096], None).unwrap();
    let mut buf = vec![0u8; 8192];
    r.read(0, &mut buf).unwrap();
    assert!(buf[..4096].iter().all(|&b| b == 1) && buf[4096..].iter().all(|&b| b == 2));
    let layers = r.layers();
    assert_eq!(layers.len(), 2);
    assert_eq!(layers[0].name, frozen);
    assert!(layers[0].checksum.is_some() && layers[1].checksum.is_none());
    assert_eq!(
        (layers[0].allocated, layers[1].allocated),
        (2 * BLOCK, BLOCK)
    );
}

/// Checksums given with a write are recorded as given, and survive a
/// reopen; a write with checksums that is not whole blocks, or whose
/// checksums do not cover its blocks, is refused and changes nothing.
#[test]
fn a_write_with_its_checksums_records_them_as_given_and_refuses_a_mismatch_in_shape() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = Replica::create(dir.path(), 16 * BLOCK).unwrap();
    assert!(r.keeps_sums());
    let data: Vec<u8> = (0..2 * BLOCK).map(|i| (i % 7) as u8).collect();
    r.write_summed(0, &data, &of_blocks(&data), Some(1))
        .unwrap();
    let mut wrong = of_blocks(&data);
    wrong[4..].copy_from_slice(&of_blocks(&[9u8; BLOCK as usize]));
    r.write_summed(4 * BLOCK, &data, &wrong, Some(2)).unwrap();
    r.flush().unwrap();
    drop(r);
    let r = Replica::open(dir.path()).unwrap();
    let mut buf = vec![0u8; 2 * BLOCK as usize];
    r.read(0, &mut buf).unwrap();
    assert_eq!(buf, data);
    let mut one = vec![0u8; BLOCK as usize];
    r.read(4 * BLOCK, &mut one).unwrap();
    let e = r.read(5 * BLOCK, &mut one).unwrap_err();
    assert!(matches!(e, ReplicaError::CorruptBlock { .. }), "{e}");
    assert_eq!(r.revision(), 2);

    let mut r = r;
    for (offset, len, sums) in [
        (512, BLOCK as usize, 4),
        (0, 100, 4),
        (0, BLOCK as usize, 8),
    ] {
        let e = r
            .write_summed(offset, &vec![1u8; len], &vec![0u8; sums], Some(3))
            .unwrap_err();
        assert!(e.to_string().contains("whole blocks"), "{e}");
    }
    assert_eq!(r.revision(), 2, "a refused write changes nothing");
    let old = tempfile::tempdir().unwrap();
    assert!(
        !Replica::create_without_block_sums(old.path(), 16 * BLOCK)
            .unwrap()
            .keeps_sums()
    );
}

#[test]
fn trim_punches_holes_only_where_no_lower_layer_holds_data() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = Replica::create(dir.path(), 16 * BLOCK).unwrap();
    r.write(0, &[1u8; 4096], None).unwrap();
    r.snapshot(None).unwrap();
    r.write(4096, &[2u8; 4096], None).unwrap();
    r.trim(0, 2 * BLOCK, None).unwrap();
    let layers = r.layers();
    // Block 0 is held below: the head gets zeros. Block 1 only in the head: a hole.
    assert_eq!(layers[1].allocated, BLOCK);
    let mut buf = vec![9u8; 8192];
    r.read(0, &mut buf).unwrap();
    assert!(buf.iter().all(|&b| b == 0));
}

#[test]
fn a_corrupted_frozen_layer_fails_verification() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = Replica::create(dir.path(), 16 * BLOCK).unwrap();
    r.write(0, &[7u8; 4096], None).unwrap();
    let frozen = r.snapshot(None).unwrap();
    r.verify().unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(dir.path().join(&frozen))
        .unwrap()
        .write_all_at(&[8u8; 16], 100)
        .unwrap();
    let e = Replica::open(dir.path()).unwrap().verify().unwrap_err();
    assert!(e.to_string().contains("checksum"), "{e}");
}

#[test]
fn revisions_persist_and_bad_input_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = Replica::create(dir.path(), 16 * BLOCK).unwrap();
    r.write(0, &[1u8; 512], Some(41)).unwrap();
    r.write(0, &[1u8; 512], None).unwrap();
    assert_eq!(r.revision(), 42);
    r.flush().unwrap();
    drop(r);
    let mut r = Replica::open(dir.path()).unwrap();
    assert_eq!(r.revision(), 42);
    assert!(matches!(
        r.write(16 * BLOCK - 1, &[0u8; 2], None),
        Err(ReplicaError::OutOfRange { .. })
    ));
    assert!(matches!(
        r.write(u64::MAX, &[0u8; 2], None),
        Err(ReplicaError::OutOfRange { .. })
    ));
    assert!(r.grow(8 * BLOCK).is_err());
    assert!(
        Replica::create(dir.path(), 16 * BLOCK).is_err(),
        "one replica per directory"
    );
    assert!(
        Replica::create(&dir.path().join("x"), 1000).is_err(),
        "size must be block aligned"
    );
}

#[test]
fn the_revision_of_the_last_write_survives_a_reopen_without_a_flush() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("r");
    let mut r = Replica::create(&dir, 16 * BLOCK).unwrap();
    r.write(0, &[1u8; 4096], Some(7)).unwrap();
    r.trim(4096, 4096, Some(9)).unwrap();
    drop(r);
    // As after a crash of the process (not of the machine): no flush.
    let again = Replica::open(&dir).unwrap();
    assert_eq!(again.revision(), 9);
    let bytes = std::fs::read(dir.join("revision")).unwrap();
    assert_eq!(bytes[..8], 9u64.to_le_bytes());
    // The write log, too: after 8, the trim of 9.
    let after = again.writes_since(8).unwrap();
    assert_eq!(after.len(), 1);
    assert_eq!(
        (
            after[0].revision,
            after[0].op,
            after[0].offset,
            after[0].len
        ),
        (9, LogOp::Trim, 4096, 4096)
    );
}

/// Pages of `file` that are dirty (written, writeback not started), from
/// the kernel's `cachestat` (Linux 6.5+; the same number on every arch).
fn dirty_pages(file: &File) -> u64 {
    #[repr(C)]
    struct Range {
        off: u64,
        len: u64,
    }
    #[repr(C)]
    #[derive(Default)]
    struct Stat {
        nr_cache: u64,
        nr_dirty: u64,
        nr_writeback: u64,
        nr_evicted: u64,
        nr_recently_evicted: u64,
    }
    const SYS_CACHESTAT: libc::c_long = 451;
    let range = Range { off: 0, len: 0 };
    let mut stat = Stat::default();
    // SAFETY: both pointers are to live structs of the layout the call
    // expects.
    let r = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            file.as_raw_fd(),
            &range as *const Range,
            &mut stat as *mut Stat,
            0,
        )
    };
    assert_eq!(r, 0, "cachestat: {}", std::io::Error::last_os_error());
    stat.nr_dirty
}

#[test]
fn writeback_of_the_head_starts_every_few_mebibytes_written() {
    let chunk = vec![0x5au8; 1 << 20];
    let below = WRITEBACK_EVERY / (1 << 20) - 1;
    let pages = (below << 20) / BLOCK;
    // Another test's `sync` (or the kernel's own writeback) may clean the
    // pages before the mark is reached; then the attempt says nothing, and
    // a new one is made.
    for _attempt in 0..5 {
        let d = tempfile::tempdir().unwrap();
        let mut r = Replica::create(d.path(), 64 << 20).unwrap();
        let head = File::open(d.path().join(r.chain().last().unwrap())).unwrap();
        for i in 0..below {
            r.write(i << 20, &chunk, None).unwrap();
        }
        // Below the mark, what was written waits in the page cache.
        if dirty_pages(&head) < pages * 9 / 10 {
            continue;
        }
        // The write that reaches it starts their writeback (on the
        // replica's writeback thread), without a flush.
        r.write(below << 20, &chunk, None).unwrap();
        let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while dirty_pages(&head) >= pages / 10 && std::time::Instant::now() < end {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(
            dirty_pages(&head) < pages / 10,
            "{} pages still dirty",
            dirty_pages(&head)
        );
        return;
    }
    panic!("in five attempts, the pages below the mark never stayed dirty");
}

/// The writeback thread ends once idle, and the next mark starts
/// another; the writes before and after read back.
#[test]
fn a_writeback_thread_left_idle_ends_and_the_next_mark_starts_another() {
    use std::sync::mpsc::TrySendError;
    let d = tempfile::tempdir().unwrap();
    let mut r = Replica::create(d.path(), 64 << 20).unwrap();
    r.set_writeback_idle(std::time::Duration::from_millis(50));
    let marks = WRITEBACK_EVERY >> 20;
    let mib = |i: u64| vec![i as u8 ^ 0x5a; 1 << 20];
    for i in 0..marks {
        r.write(i << 20, &mib(i), None).unwrap();
    }
    assert!(r.writeback.is_some(), "the mark started no thread");
    // Idle, its thread ends: what is handed to it finds no one (each
    // look a while after the last, so that the looks keep it no busier).
    let layer = d.path().join(&r.layers()[0].name);
    let probe = || File::open(&layer).unwrap();
    let end = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        match r.writeback.as_ref().unwrap().try_send(probe()) {
            Err(TrySendError::Disconnected(_)) => break,
            _ => {
                assert!(
                    std::time::Instant::now() < end,
                    "the writeback thread did not end in 30 s"
                );
                std::thread::sleep(std::time::Duration::from_millis(250));
            }
        }
    }
    // The next mark starts another, which takes what is handed to it.
    for i in marks..2 * marks {
        r.write(i << 20, &mib(i), None).unwrap();
    }
    assert!(
        !matches!(
            r.writeback.as_ref().unwrap().try_send(probe()),
            Err(TrySendError::Disconnected(_))
        ),
        "the next mark started no thread"
    );
    for i in 0..2 * marks {
        let mut got = vec![0u8; 1 << 20];
        r.read(i << 20, &mut got).unwrap();
        assert!(got == mib(i), "MiB {i} reads back other bytes");
    }
}

#[test]
fn with_the_mark_at_zero_writeback_is_left_to_the_kernel() {
    // (Whether the pages stay dirty is up to the kernel, and to any `sync`
    // another test runs: what is checked is that the replica never starts
    // a writeback itself.)
    let d = tempfile::tempdir().unwrap();
    let mut r = Replica::create(d.path(), 64 << 20).unwrap();
    r.set_writeback_every(0);
    let chunk = vec![0x5au8; 1 << 20];
    let written = 2 * WRITEBACK_EVERY / (1 << 20);
    for i in 0..written {
        r.write(i << 20, &chunk, None).unwrap();
    }
    assert!(r.writeback.is_none(), "a writeback thread was started");
    assert_eq!(r.unstarted, written << 20);
    // With a mark, the same writes start it.
    r.set_writeback_every(WRITEBACK_EVERY);
    r.write(0, &chunk, None).unwrap();
    assert!(r.writeback.is_some());
    assert_eq!(r.unstarted, 0);
}

#[test]
fn an_unused_growth_is_undone_but_a_used_one_never_is() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("r");
    let mut r = Replica::create(&dir, 16 * BLOCK).unwrap();
    r.write(0, &[3u8; 4096], None).unwrap();
    r.snapshot(None).unwrap();
    r.grow(64 * BLOCK).unwrap();
    // Nothing was written past the old size: back to it, every layer too.
    r.shrink_unused(16 * BLOCK).unwrap();
    assert_eq!(r.size(), 16 * BLOCK);
    for l in r.chain() {
        assert_eq!(std::fs::metadata(dir.join(l)).unwrap().len(), 16 * BLOCK);
    }
    let mut buf = [0u8; 4096];
    r.read(0, &mut buf).unwrap();
    assert_eq!(buf, [3u8; 4096]);
    r.verify().unwrap();
    drop(r);
    let mut r = Replica::open(&dir).unwrap();
    assert_eq!(r.size(), 16 * BLOCK, "the undo is recorded");
    // A block written past the old size: the growth was used.
    r.grow(64 * BLOCK).unwrap();
    r.write(40 * BLOCK, &[9u8; 4096], None).unwrap();
    let e = r.shrink_unused(16 * BLOCK).unwrap_err();
    assert!(e.to_string().contains("holds data past"), "{e}");
    assert_eq!(r.size(), 64 * BLOCK);
    r.read(40 * BLOCK, &mut buf).unwrap();
    assert_eq!(buf, [9u8; 4096]);
    assert!(r.grow(MAX_SIZE + BLOCK).is_err(), "past the format's limit");
}

/// Flips a byte of a layer file, as a bad disk would, behind the
/// replica's back.
fn flip(path: &std::path::Path, at: u64) {
    use std::os::unix::fs::FileExt;
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at).unwrap();
    b[0] ^= 0xff;
    f.write_all_at(&b, at).unwrap();
}

#[test]
fn a_flipped_byte_in_the_head_or_a_frozen_layer_is_never_read_back() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("r");
    let mut r = Replica::create(&dir, 64 * BLOCK).unwrap();
    r.write(0, &[1u8; 4 * BLOCK as usize], None).unwrap();
    // A partial write in the middle of a block: its checksum covers it all.
    r.write(10 * BLOCK + 100, &[2u8; 200], None).unwrap();
    r.flush().unwrap();
    let frozen = r.snapshot(None).unwrap();
    r.write(20 * BLOCK, &[3u8; 2 * BLOCK as usize], None)
        .unwrap();
    r.flush().unwrap();
    let head = r.chain().last().unwrap().clone();
    let mut buf = vec![0u8; 2 * BLOCK as usize];
    r.read(0, &mut buf).unwrap();
    r.read(10 * BLOCK + 150, &mut buf[..10]).unwrap();
    assert_eq!(&buf[..10], &[2u8; 10]);
    r.verify().unwrap();
    drop(r);

    flip(&dir.join(&frozen), 2 * BLOCK + 7);
    flip(&dir.join(&head), 21 * BLOCK + 4000);
    let r = Replica::open(&dir).unwrap();
    // The frozen layer's block 2: whole, partial, and within a larger read.
    for (offset, len) in [(2 * BLOCK, BLOCK), (2 * BLOCK + 5, 10), (0, 4 * BLOCK)] {
        let mut buf = vec![0u8; len as usize];
        let e = r.read(offset, &mut buf).unwrap_err();
        assert!(
            matches!(&e, ReplicaError::CorruptBlock { layer, block: 2, .. } if *layer == frozen),
            "{e}"
        );
    }
    // Its good blocks still read.
    let mut buf = vec![0u8; BLOCK as usize];
    r.read(BLOCK, &mut buf).unwrap();
    assert_eq!(buf, vec![1u8; BLOCK as usize]);
    // The head's block 21.
    let e = r.read(21 * BLOCK, &mut buf).unwrap_err();
    assert!(e.to_string().contains("block 21"), "{e}");
    r.read(20 * BLOCK, &mut buf).unwrap();
    // A rebuild's read of the frozen layer refuses the bad block too.
    let mut buf = vec![0u8; 4 * BLOCK as usize];
    let e = r.read_layer(&frozen, 0, &mut buf).unwrap_err();
    assert!(matches!(e, ReplicaError::CorruptBlock { .. }), "{e}");
    // And the whole-layer check and the scrub find it.
    let e = r.verify().unwrap_err();
    assert!(e.to_string().contains(&frozen), "{e}");
    let mut paced = 0;
    let e = Replica::scrub(&dir, |n| paced += n).unwrap_err();
    assert!(e.to_string().contains(&frozen), "{e}");
    assert!(paced > 0);
    // Marked for its bad block, the layer is neither kept nor copied by a
    // rebuild; its good blocks are still served, the bad one never.
    assert!(
        matches!(e, ReplicaError::CorruptBlock { block: 2, .. }),
        "{e}"
    );
    r.note_corruption(&e);
    assert!(r.is_corrupt(&frozen));
    drop(r);
    let r = Replica::open(&dir).unwrap();
    assert!(r.is_corrupt(&frozen), "the mark survives");
    let mut buf = vec![0u8; BLOCK as usize];
    r.read(BLOCK, &mut buf).unwrap();
    assert_eq!(buf, vec![1u8; BLOCK as usize], "a good block of the layer");
    assert!(r.read(2 * BLOCK, &mut buf).is_err(), "its bad block");
    let mut four = vec![0u8; 4 * BLOCK as usize];
    assert!(
        r.read_layer(&frozen, 0, &mut four).is_err(),
        "a rebuild's read"
    );
    // Its checksum found wrong (which blocks are bad is not known), it is
    // refused whole.
    r.note_corruption(&ReplicaError::CorruptLayer {
        layer: frozen.clone(),
        message: "checksum x, recorded y".into(),
    });
    drop(r);
    let r = Replica::open(&dir).unwrap();
    assert!(
        r.read(BLOCK, &mut buf).is_err(),
        "a good block of a layer marked whole"
    );
}

#[test]
fn a_scrub_of_a_sound_replica_checks_every_frozen_block() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("r");
    let mut r = Replica::create(&dir, 64 * BLOCK).unwrap();
    r.write(0, &[1u8; 3 * BLOCK as usize], None).unwrap();
    r.snapshot(None).unwrap();
    r.write(BLOCK, &[2u8; 2 * BLOCK as usize], None).unwrap();
    r.snapshot(None).unwrap();
    r.write(9 * BLOCK, &[3u8; BLOCK as usize], None).unwrap();
    assert_eq!(
        Replica::scrub(&dir, |_| {}).unwrap(),
        5 * BLOCK,
        "the head is left out"
    );
}

/// A layer a merge folds away while a scrub reads the layers below it is
/// passed over, as a layer a merge changes is: before 2026-12-06 the scrub
/// failed ("No such file or directory") on the layer its reading of the
/// replica's record still named.
#[test]
fn a_scrub_passes_over_a_layer_merged_away_while_it_ran() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("r");
    let mut r = Replica::create(&dir, 64 * BLOCK).unwrap();
    r.write(0, &[1u8; 3 * BLOCK as usize], None).unwrap();
    r.snapshot(Some("s1")).unwrap();
    r.write(BLOCK, &[2u8; 2 * BLOCK as usize], None).unwrap();
    r.snapshot(None).unwrap();
    r.write(2 * BLOCK, &[3u8; BLOCK as usize], None).unwrap();
    r.snapshot(None).unwrap();
    let j = r.next_merge().unwrap();
    let (labelled, from) = (r.chain()[0].clone(), j.from.clone());
    assert_eq!(from, r.chain()[1], "the layer above the labelled one");
    let mut merged = false;
    let checked = Replica::scrub(&dir, |_| {
        if !merged {
            merged = true;
            r.merge(&j, false, |_| {}).unwrap();
        }
    })
    .unwrap();
    assert!(merged);
    assert!(!dir.join(&from).exists());
    assert!(checked >= 3 * BLOCK, "{labelled} was checked: {checked}");
    assert_eq!(Replica::scrub(&dir, |_| {}).unwrap(), 5 * BLOCK);
}

#[test]
fn after_an_unclean_stop_the_checksums_of_unflushed_writes_are_taken_again() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("r");
    let mut r = Replica::create(&dir, 64 * BLOCK).unwrap();
    r.write(0, &[5u8; BLOCK as usize], None).unwrap();
    r.flush().unwrap();
    // Not flushed: as if the stop came between the data reaching the file
    // and its checksum (here: the data changes behind the checksum).
    r.write(8 * BLOCK, &[6u8; BLOCK as usize], None).unwrap();
    let head = r.chain().last().unwrap().clone();
    drop(r);
    flip(&dir.join(&head), 8 * BLOCK + 1);
    let r = Replica::open(&dir).unwrap();
    let mut buf = vec![0u8; BLOCK as usize];
    r.read(8 * BLOCK, &mut buf).unwrap();
    assert_eq!(buf[1], !6u8, "taken from the data as it is");
    // A flushed block changed behind its checksum is corrupt.
    drop(r);
    flip(&dir.join(&head), 7);
    let r = Replica::open(&dir).unwrap();
    assert!(matches!(
        r.read(0, &mut buf),
        Err(ReplicaError::CorruptBlock { block: 0, .. })
    ));
}

/// A new replica at `dir` joined to `r`'s frozen layers, as a rebuild's
/// target starts: each of them pending until filled.
fn joined_to(r: &Replica, dir: &std::path::Path) -> Replica {
    let mut t = Replica::create(dir, r.size()).unwrap();
    let head = r.chain().last().unwrap().clone();
    t.join(&frozen_specs(r), &head, r.revision()).unwrap();
    t
}

/// The frozen layers of `r` as a join names them.
fn frozen_specs(r: &Replica) -> Vec<LayerSpec> {
    r.layers()
        .into_iter()
        .filter_map(|l| {
            l.checksum.map(|checksum| LayerSpec {
                name: l.name,
                checksum,
                snapshot: l.snapshot,
            })
        })
        .collect()
}

fn read_all(r: &Replica) -> Vec<u8> {
    let mut buf = vec![0u8; r.size() as usize];
    r.read(0, &mut buf).unwrap();
    buf
}

#[test]
fn a_join_that_would_claim_writes_the_replica_does_not_hold_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let mut r = Replica::create(d.path(), 16 * BLOCK).unwrap();
    r.write(0, &[7u8; 4096], Some(10)).unwrap();
    r.snapshot(None).unwrap();
    r.write(BLOCK, &[9u8; 4096], Some(11)).unwrap();
    let before = read_all(&r);
    let frozen = frozen_specs(&r);
    let next_head = format!("layer-{:06}.img", frozen.len() + 2);

    // No frozen layer at all: the rogue JOIN of the security review.
    let e = r.join(&[], "layer-000099.img", 1_000_000).unwrap_err();
    assert!(e.to_string().contains("no frozen layer"), "{e}");
    // Its own frozen layers, a new head and a revision jump: it would keep
    // the frozen layer, drop the head's write and claim revision 1000000.
    let e = r.join(&frozen, &next_head, 1_000_000).unwrap_err();
    assert!(e.to_string().contains("claim writes"), "{e}");
    // At its own revision, but dropping a head that holds a write.
    let e = r.join(&frozen, &next_head, 11).unwrap_err();
    assert!(e.to_string().contains("holds data"), "{e}");

    assert_eq!(r.revision(), 11);
    assert!(r.pending().is_empty());
    assert_eq!(read_all(&r), before, "a refused join changes nothing");
    drop(r);
    let r = Replica::open(d.path()).unwrap();
    assert_eq!(read_all(&r), before, "nor on disk");
}

#[test]
fn a_join_at_the_point_the_replica_already_holds_keeps_its_layers() {
    let d = tempfile::tempdir().unwrap();
    let mut r = Replica::create(d.path(), 16 * BLOCK).unwrap();
    r.write(0, &[7u8; 4096], Some(10)).unwrap();
    r.snapshot(None).unwrap();
    let before = read_all(&r);
    let frozen = frozen_specs(&r);
    let head = format!("layer-{:06}.img", frozen.len() + 2);
    let report = r.join(&frozen, &head, 10).unwrap();
    assert_eq!(report.kept.len(), frozen.len());
    assert!(report.pending.is_empty());
    assert_eq!(read_all(&r), before);
}

/// A path for a layer, or a size, block size or revision no replica has.
#[test]
fn a_meta_file_no_replica_could_have_written_is_refused_naming_it() {
    let d = tempfile::tempdir().unwrap();
    let r = Replica::create(d.path(), 16 * BLOCK).unwrap();
    drop(r);
    let path = d.path().join(META_FILE);
    let good: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let cases = [
        (
            "chain",
            serde_json::json!(["../../etc/passwd"]),
            "is not a layer name",
        ),
        (
            "chain",
            serde_json::json!(["/etc/passwd"]),
            "is not a layer name",
        ),
        (
            "chain",
            serde_json::json!(["layer-000001.img/../x"]),
            "is not a layer name",
        ),
        (
            "size",
            serde_json::json!(MAX_SIZE + BLOCK),
            "is not a positive multiple",
        ),
        ("size", serde_json::json!(0), "is not a positive multiple"),
        (
            "size",
            serde_json::json!(16 * BLOCK + 512),
            "is not a positive multiple",
        ),
        (
            "blockSize",
            serde_json::json!(512),
            "is not a positive multiple",
        ),
        (
            "revision",
            serde_json::json!(u64::MAX),
            "is past any a replica reaches",
        ),
    ];
    for (field, value, says) in cases {
        let mut m = good.clone();
        m[field] = value.clone();
        std::fs::write(&path, serde_json::to_vec(&m).unwrap()).unwrap();
        let e = Replica::open(d.path()).err().expect("refused");
        assert!(e.to_string().contains(says), "{field} {value}: {e}");
        assert!(e.to_string().contains(META_FILE), "{field} {value}: {e}");
    }
    std::fs::write(&path, serde_json::to_vec(&good).unwrap()).unwrap();
    Replica::open(d.path()).unwrap();
}

/// A replica with two frozen layers and a head: A in the first, B over
/// part of it and beside it in the second, C in the head. Returns what it
/// reads as.
fn three_layers(dir: &Path) -> (Replica, Vec<u8>) {
    let mut r = Replica::create(dir, START).unwrap();
    r.write(0, &vec![0xa1; (16 * BLOCK) as usize], None)
        .unwrap();
    r.snapshot(None).unwrap();
    r.write(8 * BLOCK, &vec![0xb1; (16 * BLOCK) as usize], None)
        .unwrap();
    r.write(40 * BLOCK, &vec![0xb2; (4 * BLOCK) as usize], None)
        .unwrap();
    r.snapshot(None).unwrap();
    r.write(2 * BLOCK, &vec![0xc1; (2 * BLOCK) as usize], None)
        .unwrap();
    let mut all = vec![0u8; START as usize];
    r.read(0, &mut all).unwrap();
    (r, all)
}

fn allocated(r: &Replica) -> u64 {
    r.layers().iter().map(|l| l.allocated).sum()
}

/// A paced merge folds only into the layers frozen when it began: a head
/// frozen while it runs (as a rebuild freezes every replica's head, then
/// copies the frozen layers) is left for the next merge, so that the
/// layer a rebuild copies does not change under it. Before, the merge
/// went on into it, and the rebuild's copy failed ("the source's layer
/// is not complete").
#[test]
fn a_paced_merge_leaves_a_head_frozen_while_it_ran_for_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = Replica::create(dir.path(), 16 << 20).unwrap();
    // 5 MiB only the lowest layer holds: two steps at 1 MiB/s, the second
    // about 4 s after the first.
    r.write(0, &vec![0xa1; 5 << 20], None).unwrap();
    r.snapshot(None).unwrap();
    r.write(8 << 20, &vec![0xb1; 1 << 20], None).unwrap();
    r.snapshot(None).unwrap();
    r.write(12 << 20, &vec![0xc1; 1 << 20], None).unwrap();
    let mut want = vec![0u8; 16 << 20];
    r.read(0, &mut want).unwrap();
    let r = std::sync::Arc::new(std::sync::RwLock::new(r));
    let merging = {
        let r = r.clone();
        std::thread::spawn(move || super::merge_paced(&r, &[], 1 << 20, &|| false))
    };
    std::thread::sleep(std::time::Duration::from_secs(1));
    let frozen = r.write().unwrap().snapshot(None).unwrap();
    let report = merging.join().unwrap().unwrap();
    assert_eq!(report.merged, 1, "{report:?}");
    let r = r.read().unwrap();
    assert_eq!(
        r.chain(),
        ["layer-000002.img", frozen.as_str(), "layer-000004.img"],
        "the layer frozen during the merge was merged into"
    );
    assert!(r.next_merge().is_some(), "left for the next merge");
    let mut all = vec![0u8; 16 << 20];
    r.read(0, &mut all).unwrap();
    assert!(all == want, "reads changed");
}

#[test]
fn a_merge_keeps_every_read_and_gives_the_overlap_back() {
    let dir = tempfile::tempdir().unwrap();
    let (mut r, want) = three_layers(dir.path());
    let before = allocated(&r);
    let j = r.next_merge().expect("the lower frozen layer merges");
    assert_eq!(
        (j.from.as_str(), j.into.as_str()),
        ("layer-000001.img", "layer-000002.img")
    );
    let copied = r.merge(&j, false, |_| {}).unwrap();
    // Blocks 0..8 of A are not under B: they move up; 8..16 were overlaid.
    assert_eq!(copied, 8 * BLOCK);
    assert_eq!(
        allocated(&r),
        before - 8 * BLOCK,
        "the overlap is given back"
    );
    assert_eq!(r.chain(), ["layer-000002.img", "layer-000003.img"]);
    let mut all = vec![0u8; START as usize];
    r.read(0, &mut all).unwrap();
    assert!(all == want, "reads changed");
    r.verify().unwrap();
    // The head is never merged into.
    assert_eq!(r.next_merge(), None);
    drop(r);
    let r = Replica::open(dir.path()).unwrap();
    r.read(0, &mut all).unwrap();
    assert!(all == want, "reads changed after reopen");
    assert!(!dir.path().join("layer-000001.img").exists());
    assert!(!dir.path().join("layer-000001.sums").exists());
}

/// Whether this process holds no file open that was at `path` and is
/// removed (its name gone, or given to a new file) within 30 s: a thread
/// of `close_apart` closes it, and is waited for, never for ever.
fn closed_soon(path: &Path) -> bool {
    let gone = format!("{} (deleted)", path.display());
    let open = || {
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .flatten()
            .filter_map(|fd| std::fs::read_link(fd.path()).ok())
            .any(|to| to.to_string_lossy() == gone)
    };
    let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while open() && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    !open()
}

/// A merge's end, a read of the whole upper layer for its checksum, is
/// taken apart from the replica (`MergeEnd`), so that the volume's writes
/// go on meanwhile (until 2026-12-07 each of them waited for that read):
/// writes made to the head while it is taken are kept, and what the end
/// records is what an end taken with the replica held throughout records.
#[test]
fn a_merge_ended_apart_from_the_replica_keeps_the_writes_made_meanwhile_and_records_the_same() {
    let (held_dir, apart_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (mut held, mut want) = three_layers(held_dir.path());
    let (mut apart, _) = three_layers(apart_dir.path());
    let j = held.next_merge().unwrap();
    held.merge(&j, false, |_| {}).unwrap();

    apart.begin_merge(&j).unwrap();
    let mut at = Some(0);
    while let Some(b) = at {
        at = apart.merge_some(b, MERGE_CHUNK, false).unwrap().next;
    }
    let end = apart.merge_end().unwrap();
    // Over blocks the upper layer holds, one it took from the lower layer,
    // and one no layer held.
    let writes = [(9, 0xd1u8), (4, 0xd2), (41, 0xd3), (50, 0xd4)];
    let (first, rest) = writes.split_at(2);
    for &(b, byte) in first {
        apart
            .write(b * BLOCK, &[byte; BLOCK as usize], None)
            .unwrap();
    }
    let got = end.take().unwrap();
    for &(b, byte) in rest {
        apart
            .write(b * BLOCK, &[byte; BLOCK as usize], None)
            .unwrap();
    }
    let bad = apart.record_merge_end(end, got).unwrap().unwrap();
    assert!(bad.is_empty(), "{bad:?}");
    // The lower layer's files are gone from the directory, and closed on a
    // thread of their own: their last close frees (and may discard) every
    // block they held.
    let from = apart_dir.path().join(&j.from);
    assert!(!from.exists());
    assert!(closed_soon(&from), "the lower layer's file is closed");

    assert_eq!(apart.chain(), held.chain());
    assert_eq!(apart.next_merge(), None);
    let (a, h) = (apart.layers(), held.layers());
    assert_eq!(a[0], h[0], "the merged layer, its checksum with it");
    for &(b, byte) in &writes {
        want[(b * BLOCK) as usize..((b + 1) * BLOCK) as usize].fill(byte);
    }
    assert!(read_all(&apart) == want, "reads changed");
    apart.verify().unwrap();
    drop(apart);
    let apart = Replica::open(apart_dir.path()).unwrap();
    assert!(read_all(&apart) == want, "reads changed after reopen");
    apart.verify().unwrap();
}

/// A merge's end taken apart from the replica is not recorded once a
/// join ended the merge meanwhile (a rebuild replaced the chain): it
/// would record a checksum for a layer of the old chain and remove the
/// files of the layer the join keeps as a pending layer's seed.
#[test]
fn a_merge_end_taken_before_a_join_records_nothing() {
    let (dir, other) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (mut r, _) = three_layers(dir.path());
    let mut src = Replica::create(other.path(), START).unwrap();
    src.write(0, &vec![0xe1; (8 * BLOCK) as usize], None)
        .unwrap();
    src.snapshot(None).unwrap();
    src.write(0, &vec![0xe2; (4 * BLOCK) as usize], None)
        .unwrap();
    src.snapshot(None).unwrap();

    let j = r.next_merge().unwrap();
    r.begin_merge(&j).unwrap();
    let mut at = Some(0);
    while let Some(b) = at {
        at = r.merge_some(b, MERGE_CHUNK, false).unwrap().next;
    }
    let end = r.merge_end().unwrap();
    let got = end.take().unwrap();
    let head = src.chain().last().unwrap().clone();
    let report = r.join(&frozen_specs(&src), &head, src.revision()).unwrap();
    assert_eq!(report.seeded, [j.from.clone(), j.into.clone()]);
    let chain = r.chain();

    assert!(r.record_merge_end(end, got).unwrap().is_none());
    assert_eq!(r.chain(), chain);
    assert_eq!(r.pending(), [j.from.clone(), j.into.clone()]);
    assert!(
        dir.path().join(&j.from).exists(),
        "the seed of a pending layer is kept"
    );
    assert!(!r.is_corrupt(&j.into));
    drop(r);
    let r = Replica::open(dir.path()).unwrap();
    assert_eq!(r.chain(), chain);
    assert_eq!(r.pending(), [j.from, j.into]);
}

#[test]
fn a_merge_cut_off_mid_block_is_finished_at_open_with_the_same_data() {
    let dir = tempfile::tempdir().unwrap();
    let (mut r, want) = three_layers(dir.path());
    let j = r.next_merge().unwrap();
    r.begin_merge(&j).unwrap();
    // The first four blocks move; then the crash tears block 5 (written
    // half, as a crash may leave it) before its checksum was recorded.
    r.merge_some(0, 4, false).unwrap();
    let into = dir.path().join(&j.into);
    let f = std::fs::OpenOptions::new().write(true).open(&into).unwrap();
    f.write_all_at(&[0xa1; 2048], 5 * BLOCK).unwrap();
    drop(f);
    drop(r);
    // A look at it (a lent replica's INFO) sees the merge unfinished: the
    // upper layer's checksum is not reported, so no rebuild copies it.
    let view = Replica::open_view(dir.path()).unwrap();
    assert_eq!(view.layers()[1].checksum, None);
    drop(view);
    let r = Replica::open(dir.path()).unwrap();
    let mut all = vec![0u8; START as usize];
    assert_eq!(r.chain(), ["layer-000002.img", "layer-000003.img"]);
    r.read(0, &mut all).unwrap();
    assert!(all == want, "reads changed after the merge was finished");
    r.verify().unwrap();
}

/// A layer with lost blocks merges too: a lost block the upper layer
/// lacks moves up and stays lost there, one the upper layer wrote again
/// goes with the lower layer, and every other read is as before. So too
/// when a crash cuts the merge off and the open finishes it.
#[test]
fn a_layer_with_lost_blocks_merges_and_its_lost_blocks_stay_lost_above() {
    for cut in [false, true] {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("r");
        let mut r = Replica::create(&dir, 16 * BLOCK).unwrap();
        let data: Vec<u8> = (0..8 * BLOCK).map(|i| (i % 251) as u8).collect();
        r.write(0, &data, Some(1)).unwrap();
        let lower = r.snapshot(None).unwrap();
        for b in [2, 5] {
            flip(&dir.join(&lower), b * BLOCK + 1);
            r.lose_frozen_block(&lower, b * BLOCK).unwrap();
        }
        // Block 5 written again, and block 9 new, in the layer above.
        r.write(5 * BLOCK, &[0xb5; BLOCK as usize], Some(2))
            .unwrap();
        r.write(9 * BLOCK, &[0xb9; BLOCK as usize], Some(3))
            .unwrap();
        let upper = r.snapshot(None).unwrap();
        let j = r.next_merge().expect("a layer with lost blocks merges");
        assert_eq!(
            (j.from.as_str(), j.into.as_str()),
            (lower.as_str(), upper.as_str())
        );
        if cut {
            r.begin_merge(&j).unwrap();
            r.merge_some(0, 3, false).unwrap(); // blocks 0..3: 2 moves up, lost
            drop(r);
            r = Replica::open(&dir).unwrap();
        } else {
            r.merge(&j, false, |_| {}).unwrap();
        }
        for r in [r, Replica::open(&dir).unwrap()] {
            assert_eq!(r.chain()[0], upper, "cut {cut}");
            assert_eq!(r.layers()[0].lost, [2], "cut {cut}");
            let mut block = vec![0u8; BLOCK as usize];
            assert!(
                matches!(
                    r.read(2 * BLOCK, &mut block),
                    Err(ReplicaError::LostBlock { block: 2, ref layer }) if *layer == upper
                ),
                "cut {cut}"
            );
            r.read(5 * BLOCK, &mut block).unwrap();
            assert!(block == vec![0xb5; BLOCK as usize], "cut {cut}");
            r.read(9 * BLOCK, &mut block).unwrap();
            assert!(block == vec![0xb9; BLOCK as usize], "cut {cut}");
            for b in [0u64, 1, 3, 4, 6, 7] {
                r.read(b * BLOCK, &mut block).unwrap();
                let at = (b * BLOCK) as usize;
                assert!(
                    block[..] == data[at..at + BLOCK as usize],
                    "block {b}, cut {cut}"
                );
            }
            r.verify().unwrap();
        }
        assert!(!dir.join(&lower).exists(), "cut {cut}");
    }
}

#[test]
fn a_snapshot_layer_is_merged_only_once_its_label_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = Replica::create(dir.path(), START).unwrap();
    r.write(0, &[1u8; 4096], None).unwrap();
    assert_eq!(r.snapshot(Some("s1")).unwrap(), "layer-000001.img");
    // The same snapshot again changes nothing.
    assert_eq!(r.snapshot(Some("s1")).unwrap(), "layer-000001.img");
    r.write(0, &[2u8; 4096], None).unwrap();
    r.snapshot(None).unwrap();
    assert_eq!(r.next_merge(), None, "a labelled layer stays");
    assert!(
        r.snapshot(Some("../x")).is_err(),
        "a label is a snapshot id"
    );
    assert_eq!(
        r.keep_snapshots(&["s1".to_string()]).unwrap(),
        Vec::<String>::new()
    );
    assert_eq!(r.keep_snapshots(&[]).unwrap(), ["s1"]);
    let j = r.next_merge().unwrap();
    r.merge(&j, false, |_| {}).unwrap();
    let mut b = [0u8; 4096];
    r.read(0, &mut b).unwrap();
    assert_eq!(b, [2u8; 4096]);
}

#[test]
fn labels_travel_with_the_layers_a_join_takes() {
    let dir = tempfile::tempdir().unwrap();
    let mut src = Replica::create(&dir.path().join("src"), START).unwrap();
    src.write(0, &[7u8; 4096], None).unwrap();
    src.snapshot(Some("s1")).unwrap();
    let dst = joined_to(&src, &dir.path().join("dst"));
    let labels: Vec<Option<String>> = dst.layers().into_iter().map(|l| l.snapshot).collect();
    assert_eq!(labels, [Some("s1".to_string()), None]);
}

#[test]
fn a_replicas_engine_fence_only_rises_and_is_read_back_by_a_new_table() {
    let disk = tempfile::tempdir().unwrap();
    let dir = replica_dir(disk.path(), "v-r1");
    std::fs::create_dir_all(&dir).unwrap();
    drop(Replica::create(&dir, 16 * BLOCK).unwrap());
    let table = Replicas::new(vec![disk.path().to_path_buf()]);
    let fence = table.fence("v-r1").unwrap();
    assert_eq!(fence.load(std::sync::atomic::Ordering::SeqCst), 0);
    assert_eq!(table.raise_fence("v-r1", 2).unwrap(), 2);
    // A lower claim leaves it; whoever holds it sees the raise.
    assert_eq!(table.raise_fence("v-r1", 1).unwrap(), 2);
    assert_eq!(fence.load(std::sync::atomic::Ordering::SeqCst), 2);
    assert_eq!(table.raise_fence("v-r1", 5).unwrap(), 5);
    assert_eq!(fence.load(std::sync::atomic::Ordering::SeqCst), 5);
    // On disk before in memory: a node plugin started anew reads it.
    let again = Replicas::new(vec![disk.path().to_path_buf()]);
    assert_eq!(again.raise_fence("v-r1", 4).unwrap(), 5);
    assert!(again.fence("no-such").is_err());
}

/// What the node still writes into a replica by its path while the
/// replica is deleted — a scrub noting a corrupt layer, a fence raised —
/// neither makes the deletion fail nor brings the directory back.
#[test]
fn a_replica_written_into_while_deleted_is_deleted_whole() {
    let disk = tempfile::tempdir().unwrap();
    let table = Replicas::new(vec![disk.path().to_path_buf()]);
    for round in 0..20 {
        let name = format!("v-r{round}");
        let dir = replica_dir(disk.path(), &name);
        std::fs::create_dir_all(&dir).unwrap();
        drop(Replica::create(&dir, 16 * BLOCK).unwrap());
        table.find(&name).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let (dir, stop) = (dir.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut written = 0u64;
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    if mark_corrupt_in(&dir, &Mark::whole(&format!("layer-{written}"))).is_ok() {
                        written += 1;
                    }
                }
                written
            })
        };
        // Deleted while files keep coming.
        while !dir.join(CORRUPT_FILE).exists() {
            std::thread::yield_now();
        }
        table.delete(&name, &dir).unwrap();
        assert!(!dir.exists(), "round {round}: {} is gone", dir.display());
        assert!(
            mark_corrupt_in(&dir, &Mark::whole("late")).is_err(),
            "round {round}: a late write finds no directory"
        );
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        assert!(writer.join().unwrap() > 0);
        assert!(
            table.find(&name).is_err(),
            "round {round}: not opened again"
        );
    }
    // Nothing is left of them once the node starts again.
    drop(Replicas::new(vec![disk.path().to_path_buf()]));
    let left: Vec<_> = std::fs::read_dir(disk.path().join("deleting"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "{left:?}");
    assert_eq!(
        std::fs::read_dir(disk.path().join("replicas"))
            .unwrap()
            .count(),
        0
    );
}

/// The replica's bookkeeping files gone bad on the disk: a suspect list
/// that does not parse, or names a block past the volume, fails the open,
/// naming it, rather than have its blocks served as sound; a bad byte in the corrupt marks spoils its own
/// line only, and the layer marked on the next line stays unserved.
#[test]
fn a_bad_suspect_list_fails_the_open_and_a_bad_mark_line_spoils_only_itself() {
    let d = tempfile::tempdir().unwrap();
    let mut r = Replica::create(d.path(), 16 * BLOCK).unwrap();
    r.write(0, &vec![0xa1; (4 * BLOCK) as usize], None).unwrap();
    let frozen = r.snapshot(None).unwrap();
    drop(r);

    for bad in [
        &b"[1, 2,\xff"[..],
        b"[1, 16]",
        b"[18446744073709551615]",
        // With kept checksums: one kept for a block that is not suspect,
        // a block past the end, a checksum past 32 bits.
        br#"{"blocks": [1], "sums": [[2, 7]]}"#,
        br#"{"blocks": [16], "sums": [[16, 7]]}"#,
        br#"{"blocks": [1], "sums": [[1, 4294967296]]}"#,
    ] {
        std::fs::write(d.path().join(SUSPECT_FILE), bad).unwrap();
        let e = Replica::open(d.path()).err().expect("refused");
        assert!(matches!(e, ReplicaError::Corrupt(_)), "{e}");
        assert!(e.to_string().contains(SUSPECT_FILE), "{e}");
    }
    std::fs::write(d.path().join(SUSPECT_FILE), b"[1, 15]").unwrap();
    assert_eq!(Replica::open(d.path()).unwrap().suspects(), [1, 15]);
    std::fs::write(
        d.path().join(SUSPECT_FILE),
        br#"{"blocks": [1, 15], "sums": [[15, 7]]}"#,
    )
    .unwrap();
    let r = Replica::open(d.path()).unwrap();
    assert_eq!(r.suspects(), [1, 15]);
    assert_eq!(r.suspect_sums().iter().collect::<Vec<_>>(), [(&15, &7)]);
    drop(r);
    std::fs::write(d.path().join(SUSPECT_FILE), b"[]").unwrap();

    let mut marks = b"layer-\xff\xfe\n".to_vec();
    marks.extend_from_slice(format!("{frozen}\n").as_bytes());
    std::fs::write(d.path().join(CORRUPT_FILE), &marks).unwrap();
    let r = Replica::open(d.path()).unwrap();
    assert!(r.is_corrupt(&frozen));
    let mut block = vec![0u8; BLOCK as usize];
    let e = r.read(0, &mut block).unwrap_err();
    assert!(e.to_string().contains("was found corrupt"), "{e}");
}

#[test]
fn a_corruption_error_says_where_it_failed() {
    let block = ReplicaError::CorruptBlock {
        dir: PathBuf::from("/d/replicas/v-r1"),
        layer: "layer-000002.img".into(),
        block: 513,
        recorded: Some(7),
    };
    assert_eq!(
        block.corruption(),
        Some(Corruption {
            layer: Some("layer-000002.img".into()),
            at: Some(513 * BLOCK),
            lost: false,
            recorded: Some(7),
        })
    );
    let lost = ReplicaError::LostBlock {
        layer: "head.img".into(),
        block: 7,
    };
    assert_eq!(
        lost.corruption(),
        Some(Corruption {
            layer: Some("head.img".into()),
            at: Some(7 * BLOCK),
            lost: true,
            recorded: None,
        })
    );
    let layer = ReplicaError::CorruptLayer {
        layer: "layer-000002.img".into(),
        message: "checksum 1, recorded 2".into(),
    };
    assert_eq!(
        layer.corruption(),
        Some(Corruption {
            layer: Some("layer-000002.img".into()),
            at: None,
            lost: false,
            recorded: None,
        })
    );
    assert_eq!(ReplicaError::Invalid("no".into()).corruption(), None);
}

/// Where the bin cannot be made (a disk too full for one more directory;
/// here a file holds its name), a replica is still deleted, in place.
#[test]
fn a_replica_is_deleted_where_its_bin_cannot_be_made() {
    let disk = tempfile::tempdir().unwrap();
    let table = Replicas::new(vec![disk.path().to_path_buf()]);
    // No bin in a directory without replicas (the empty mount point of a
    // disk that did not mount is left as it is).
    assert!(!disk.path().join("deleting").exists());
    std::fs::write(disk.path().join("deleting"), b"in the way").unwrap();
    let dir = replica_dir(disk.path(), "v-r1");
    std::fs::create_dir_all(&dir).unwrap();
    drop(Replica::create(&dir, 16 * BLOCK).unwrap());
    table.find("v-r1").unwrap();
    table.delete("v-r1", &dir).unwrap();
    assert!(!dir.exists());
    table.delete("v-r1", &dir).unwrap();
}

/// A write of part of a block the head holds keeps the rest of that
/// block's bytes: when they went bad on the disk, the write is refused
/// (CORRUPT), so that the bad bytes never come out of it with a checksum
/// to match. A write of the whole block replaces it, and a partial write
/// then goes through.
#[test]
fn a_partial_write_into_a_bad_block_is_refused_and_never_makes_its_bytes_pass() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("r");
    let mut r = Replica::create(&dir, 16 * BLOCK).unwrap();
    r.write(0, &[3u8; 2 * BLOCK as usize], None).unwrap();
    let head = r.chain().last().unwrap().clone();
    flip(&dir.join(&head), 2000);
    for (at, len) in [(100, 512), (BLOCK - 512, 1024), (0, 512)] {
        let e = r.write(at, &vec![9u8; len], None).unwrap_err();
        assert!(
            matches!(e, ReplicaError::CorruptBlock { block: 0, .. }),
            "{at}+{len}: {e}"
        );
    }
    // A trim that starts inside it is refused too, before it changes
    // anything: block 1 stays as it was.
    let e = r.trim(2000, 3 * BLOCK, None).unwrap_err();
    assert!(
        matches!(e, ReplicaError::CorruptBlock { block: 0, .. }),
        "{e}"
    );
    let mut block = vec![0u8; BLOCK as usize];
    r.read(BLOCK, &mut block).unwrap();
    assert_eq!(
        block,
        vec![3u8; BLOCK as usize],
        "the refused trim changed nothing"
    );
    assert!(
        r.read(0, &mut block).is_err(),
        "still bad, not made to pass"
    );
    // Block 1 is sound: a partial write into it works.
    r.write(BLOCK + 8, &[7u8; 8], None).unwrap();
    r.read(BLOCK, &mut block).unwrap();
    assert_eq!(&block[..8], &[3u8; 8]);
    assert_eq!(&block[8..16], &[7u8; 8]);
    // A whole-block write mends block 0; a partial one then goes through.
    r.write(0, &[5u8; BLOCK as usize], None).unwrap();
    r.write(100, &[6u8; 4], None).unwrap();
    r.read(0, &mut block).unwrap();
    assert_eq!(&block[96..104], &[5, 5, 5, 5, 6, 6, 6, 6]);
}

/// A head block that fails its checksum and that the engine gives up as
/// lost (no replica holds it sound) is frozen as it is: it fails every
/// read, here and in a copy of its layer made by a fill, while every other
/// block is served, and the layer checks whole. A bad block not given up
/// still fails the freeze, which then changes nothing. Written again, the
/// block reads back.
#[test]
fn a_block_given_up_as_lost_is_frozen_failing_its_reads_and_a_fill_keeps_it_so() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("r");
    let mut r = Replica::create(&dir, 16 * BLOCK).unwrap();
    let data: Vec<u8> = (0..8 * BLOCK).map(|i| (i % 251) as u8).collect();
    r.write(0, &data, Some(1)).unwrap();
    let head = r.chain().last().unwrap().clone();
    flip(&dir.join(&head), 3 * BLOCK + 5);
    flip(&dir.join(&head), 6 * BLOCK + 9);
    let e = r.snapshot(None).unwrap_err();
    assert!(
        matches!(e, ReplicaError::CorruptBlock { block: 3, .. }),
        "{e}"
    );
    let e = r.snapshot_losing(None, &BTreeSet::from([3])).unwrap_err();
    assert!(
        matches!(e, ReplicaError::CorruptBlock { block: 6, .. }),
        "{e}"
    );
    assert_eq!(
        r.chain(),
        vec![head.clone()],
        "a failed freeze changes nothing"
    );
    let frozen = r.snapshot_losing(None, &BTreeSet::from([3, 6])).unwrap();
    assert_eq!(frozen, head);

    let check = |r: &Replica, what: &str| {
        let mut block = vec![0u8; BLOCK as usize];
        for b in 0..8u64 {
            let got = r.read(b * BLOCK, &mut block);
            if b == 3 || b == 6 {
                assert!(
                    matches!(&got, Err(ReplicaError::LostBlock { block, .. }) if *block == b),
                    "{what}: block {b}: {got:?}"
                );
            } else {
                got.unwrap();
                let at = (b * BLOCK) as usize;
                assert!(block == data[at..at + BLOCK as usize], "{what}: block {b}");
            }
        }
        let mut two = vec![0u8; 2 * BLOCK as usize];
        assert!(r.read(2 * BLOCK, &mut two).is_err(), "{what}: across one");
        assert!(
            r.read(3 * BLOCK + 100, &mut [0u8; 10]).is_err(),
            "{what}: inside one"
        );
        assert_eq!(r.layers()[0].lost, [3, 6], "{what}");
        r.verify().unwrap();
    };
    check(&r, "frozen");
    drop(r);
    let mut r = Replica::open(&dir).unwrap();
    check(&r, "reopened");
    Replica::scrub(&dir, |_| {}).unwrap();

    // A fill: the layer as the source holds it, lost blocks included, and
    // their record.
    let tdir = d.path().join("t");
    let mut t = joined_to(&r, &tdir);
    let mut layer = vec![0u8; 8 * BLOCK as usize];
    r.read_layer(&frozen, 0, &mut layer).unwrap();
    t.write_layer(&frozen, 0, &layer).unwrap();
    t.complete_layer(&frozen, &r.layers()[0].lost).unwrap();
    check(&t, "filled");
    drop(t);
    check(&Replica::open(&tdir).unwrap(), "filled, reopened");

    // Merged into the layer above, the lost block moves up and still
    // fails its reads, and the layer checks whole.
    let above = r.snapshot(None).unwrap();
    let j = r.next_merge().expect("a layer with a lost block merges");
    assert_eq!(
        (j.from.as_str(), j.into.as_str()),
        (frozen.as_str(), above.as_str())
    );
    r.merge(&j, false, |_| {}).unwrap();
    assert_eq!(r.chain()[0], above);
    check(&r, "merged");
    drop(r);
    let mut r = Replica::open(&dir).unwrap();
    check(&r, "merged, reopened");
    // Written again, a lost block reads back.
    r.write(3 * BLOCK, &[1u8; BLOCK as usize], Some(2)).unwrap();
    let mut block = vec![0u8; BLOCK as usize];
    r.read(3 * BLOCK, &mut block).unwrap();
    assert_eq!(block, vec![1u8; BLOCK as usize]);
}

/// A filled layer's check, a read of the whole layer, is made apart from
/// the replica (`Completion`): the replica takes the volume's writes from
/// its join on, and its engine gives it up when one waits past the
/// replica timeout (until 2026-12-07 the check held the replica, about a
/// second per GiB of layer read cold). Writes made to its head meanwhile
/// are kept, and the layer completes as it does with the replica held; a
/// change of the layer meanwhile leaves it pending.
#[test]
fn a_filled_layer_is_checked_apart_from_the_replica_while_its_head_takes_writes() {
    let d = tempfile::tempdir().unwrap();
    let mut r = Replica::create(&d.path().join("r"), START).unwrap();
    r.write(0, &vec![0xa1; (16 * BLOCK) as usize], Some(1))
        .unwrap();
    r.write(40 * BLOCK, &vec![0xa2; (4 * BLOCK) as usize], Some(2))
        .unwrap();
    let frozen = r.snapshot(None).unwrap();
    let tdir = d.path().join("t");
    let mut t = joined_to(&r, &tdir);
    let mut layer = vec![0u8; START as usize];
    r.read_layer(&frozen, 0, &mut layer).unwrap();
    let half = (16 * BLOCK) as usize;

    t.write_layer(&frozen, 0, &layer[..half]).unwrap();
    let mut c = t.completion(&frozen, &[]).unwrap();
    t.write_layer(
        &frozen,
        40 * BLOCK,
        &layer[(40 * BLOCK) as usize..(44 * BLOCK) as usize],
    )
    .unwrap();
    let got = c.take().unwrap();
    let e = t.record_completion(c, &got).unwrap_err();
    assert!(
        e.to_string().contains("changed while it was checked"),
        "{e}"
    );
    assert_eq!(t.pending(), std::slice::from_ref(&frozen));

    let mut c = t.completion(&frozen, &[]).unwrap();
    let writes = [(2, 0xd1u8, 3), (30, 0xd2, 4), (41, 0xd3, 5)];
    for &(b, byte, rev) in &writes {
        t.write(b * BLOCK, &[byte; BLOCK as usize], Some(rev))
            .unwrap();
    }
    let got = c.take().unwrap();
    t.record_completion(c, &got).unwrap();
    assert!(t.pending().is_empty());
    assert_eq!(
        t.layers()[0],
        r.layers()[0],
        "the layer, its checksum with it"
    );
    let mut want = read_all(&r);
    for &(b, byte, _) in &writes {
        want[(b * BLOCK) as usize..((b + 1) * BLOCK) as usize].fill(byte);
    }
    assert!(read_all(&t) == want, "reads");
    t.verify().unwrap();
    drop(t);
    let t = Replica::open(&tdir).unwrap();
    assert!(read_all(&t) == want, "reads after reopen");
    t.verify().unwrap();
}

/// The files a join drops, and a pending layer's file that a reset
/// replaces, are closed on a thread of their own (`close_apart`): their
/// last close frees their blocks, which on a filesystem mounted with
/// `discard` takes about 0.6 s a GiB, and a join runs with the volume's
/// I/O paused (the complete bench measures it). Closed they are, none left
/// open; and the replica holds what it should.
#[test]
fn the_files_a_join_drops_and_a_reset_replaces_are_closed_apart() {
    let d = tempfile::tempdir().unwrap();
    let mut src = Replica::create(&d.path().join("src"), START).unwrap();
    src.write(0, &[1u8; BLOCK as usize], Some(1)).unwrap();
    let frozen = src.snapshot(None).unwrap();
    let tdir = d.path().join("t");
    let mut t = Replica::create(&tdir, START).unwrap();
    t.write(0, &[2u8; BLOCK as usize], Some(1)).unwrap();
    t.snapshot(None).unwrap();
    t.write(0, &vec![3u8; (8 * BLOCK) as usize], Some(2))
        .unwrap();
    let second = t.snapshot(None).unwrap();
    // The source's head is named as our second frozen layer: it goes.
    let head = src.chain().last().unwrap().clone();
    assert_eq!(head, second);
    let report = t.join(&frozen_specs(&src), &head, src.revision()).unwrap();
    assert_eq!(report.seeded, std::slice::from_ref(&frozen));
    assert!(
        closed_soon(&tdir.join(&second)),
        "the dropped layer's file is closed"
    );
    assert_eq!(std::fs::metadata(tdir.join(&second)).unwrap().blocks(), 0);

    // The seed did not match: emptied, its old file closed apart.
    t.reset_layer(&frozen).unwrap();
    assert!(
        closed_soon(&tdir.join(&frozen)),
        "the replaced file is closed"
    );
    assert_eq!(std::fs::metadata(tdir.join(&frozen)).unwrap().blocks(), 0);
    let mut layer = vec![0u8; BLOCK as usize];
    src.read_layer(&frozen, 0, &mut layer).unwrap();
    t.write_layer(&frozen, 0, &layer).unwrap();
    t.complete_layer(&frozen, &[]).unwrap();
    assert!(read_all(&t) == read_all(&src));
    drop(t);
    let t = Replica::open(&tdir).unwrap();
    assert!(read_all(&t) == read_all(&src));
}

/// A layer file no chain names (a merge or a join cut off between its
/// record and the removal of the old files) goes at the next open, its
/// table with it, and is closed apart (`close_apart`): none left open,
/// and the replica reads as before.
#[test]
fn a_layer_file_no_chain_names_goes_at_open_and_is_closed_apart() {
    let d = tempfile::tempdir().unwrap();
    let mut r = Replica::create(d.path(), START).unwrap();
    r.write(0, &[5u8; BLOCK as usize], Some(1)).unwrap();
    r.flush().unwrap();
    let before = read_all(&r);
    drop(r);
    let stray = d.path().join("layer-000009.img");
    std::fs::write(&stray, vec![9u8; (8 * BLOCK) as usize]).unwrap();
    std::fs::write(sums::path_of(&stray), [0u8; 32]).unwrap();
    let r = Replica::open(d.path()).unwrap();
    assert!(!stray.exists());
    assert!(!sums::path_of(&stray).exists());
    assert!(closed_soon(&stray), "the stray layer's file is closed");
    assert!(read_all(&r) == before);
}

/// A fill that names a lost block its layer does not hold is refused, and
/// the layer stays pending.
#[test]
fn a_fill_naming_a_lost_block_the_layer_lacks_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let mut r = Replica::create(&d.path().join("r"), 16 * BLOCK).unwrap();
    r.write(0, &[4u8; BLOCK as usize], Some(1)).unwrap();
    let frozen = r.snapshot(None).unwrap();
    let mut t = joined_to(&r, &d.path().join("t"));
    let mut layer = vec![0u8; BLOCK as usize];
    r.read_layer(&frozen, 0, &mut layer).unwrap();
    t.write_layer(&frozen, 0, &layer).unwrap();
    let e = t.complete_layer(&frozen, &[9]).unwrap_err();
    assert!(e.to_string().contains("block 9"), "{e}");
    assert_eq!(t.pending(), vec![frozen.clone()]);
    t.complete_layer(&frozen, &[]).unwrap();
    assert!(t.pending().is_empty());
}

/// What the controller asks of the last replica of a detached volume
/// once a copy from it failed on a bad block: each frozen layer marked
/// for a block gives up every block of it that fails, whichever block its
/// mark names; a layer marked whole (which of its data is bad is not
/// known), and one none of whose blocks fails, give up nothing and keep
/// their marks.
#[test]
fn the_marked_blocks_of_frozen_layers_are_given_up_with_every_other_failing_one_of_their_layer() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("r");
    let mut r = Replica::create(&dir, 16 * BLOCK).unwrap();
    let mut layers = Vec::new();
    for (i, fill) in [0xa1u8, 0xb2, 0xc3, 0xd4].into_iter().enumerate() {
        let at = i as u64 * 4 * BLOCK;
        r.write(at, &[fill; 4 * BLOCK as usize], Some(i as u64 + 1))
            .unwrap();
        layers.push(r.snapshot(None).unwrap());
    }
    let [a, b, c, d] = [0, 1, 2, 3].map(|i| layers[i].clone());
    for at in [1, 3, 5, 10] {
        flip(&dir.join(&layers[at / 4]), at as u64 * BLOCK + 1);
    }
    let mut block = vec![0u8; BLOCK as usize];
    let e = r.read(BLOCK, &mut block).unwrap_err();
    r.note_corruption(&e);
    r.mark_corrupt(&Mark::whole(&b)).unwrap();
    for (layer, sound) in [(&c, 9), (&d, 13)] {
        r.mark_corrupt(&Mark {
            layer: layer.clone(),
            block: Some(sound),
        })
        .unwrap();
    }
    let given_up = r.lose_marked_blocks().unwrap();
    assert_eq!(given_up, [(a.clone(), vec![1, 3]), (c.clone(), vec![10])]);
    let lost: Vec<Vec<u64>> = r.layers()[..4].iter().map(|l| l.lost.clone()).collect();
    assert_eq!(lost, [vec![1, 3], vec![], vec![10], vec![]]);
    assert!(
        !r.is_corrupt(&a) && !r.is_corrupt(&c),
        "they check whole again"
    );
    assert!(r.is_corrupt(&b) && r.is_corrupt(&d), "their marks stay");
    r.read(9 * BLOCK, &mut block).unwrap();
    assert_eq!(block, [0xc3; BLOCK as usize]);
    assert!(r.lose_marked_blocks().unwrap().is_empty(), "nothing more");
}

/// A block of a frozen layer that went bad after its freeze is given up
/// as lost only when it fails its checksum: the layer's checksum is taken
/// again with it as it is, its marks go, and it copies whole; a sound
/// block is refused. A second bad block of the layer is given up with it
/// (before, it failed the loss, and nothing changed at every attempt: the
/// layer could never be copied).
#[test]
fn a_bad_block_of_a_frozen_layer_is_given_up_only_when_bad_and_the_layer_then_copies_whole() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("r");
    let mut r = Replica::create(&dir, 16 * BLOCK).unwrap();
    let data: Vec<u8> = (0..8 * BLOCK).map(|i| (i % 251) as u8).collect();
    r.write(0, &data, Some(1)).unwrap();
    let frozen = r.snapshot(None).unwrap();
    let before = r.layers()[0].checksum.clone();
    let e = r.lose_frozen_block(&frozen, 2 * BLOCK).unwrap_err();
    assert!(e.to_string().contains("sound"), "{e}");
    flip(&dir.join(&frozen), 2 * BLOCK + 1);
    flip(&dir.join(&frozen), 5 * BLOCK + 1);
    let mut block = vec![0u8; BLOCK as usize];
    let e = r.read(2 * BLOCK, &mut block).unwrap_err();
    r.note_corruption(&e);
    assert!(r.is_corrupt(&frozen));
    // Block 2 is given up, and block 5 with it.
    assert_eq!(r.lose_frozen_block(&frozen, 2 * BLOCK).unwrap(), [2, 5]);
    assert_ne!(r.layers()[0].checksum, before, "taken again");
    assert_eq!(r.layers()[0].lost, [2, 5]);
    assert!(!r.is_corrupt(&frozen), "its marks went");
    r.verify().unwrap();
    for b in [2, 5] {
        assert!(
            matches!(
                r.read(b * BLOCK, &mut block),
                Err(ReplicaError::LostBlock { block, .. }) if block == b
            ),
            "block {b}"
        );
    }
    assert!(r.lose_frozen_block(&frozen, 5 * BLOCK).unwrap().is_empty());
    drop(r);
    let r = Replica::open(&dir).unwrap();
    assert!(!r.is_corrupt(&frozen), "nor after a reopen");
    assert_eq!(r.layers()[0].lost, [2, 5]);
    // A fill copies it whole now.
    let mut t = joined_to(&r, &d.path().join("t"));
    let mut layer = vec![0u8; 8 * BLOCK as usize];
    r.read_layer(&frozen, 0, &mut layer).unwrap();
    t.write_layer(&frozen, 0, &layer).unwrap();
    t.complete_layer(&frozen, &r.layers()[0].lost).unwrap();
    for b in 0..8u64 {
        let got = t.read(b * BLOCK, &mut block);
        if b == 2 || b == 5 {
            assert!(got.is_err(), "block {b} stays lost");
        } else {
            got.unwrap();
            let at = (b * BLOCK) as usize;
            assert!(block == data[at..at + BLOCK as usize], "block {b}");
        }
    }
}

/// A clean close marks a quiet replica, and lets go unmarked one whose
/// rebuild's fill is under way (its pending layers are not what the mark
/// vouches for); either fails every I/O after, and an open clears a mark.
#[test]
fn a_clean_close_marks_a_quiet_replica_and_not_one_being_filled() {
    let d = tempfile::tempdir().unwrap();
    let mut r = Replica::create(&d.path().join("r"), 16 * BLOCK).unwrap();
    r.write(0, &[4u8; BLOCK as usize], Some(1)).unwrap();
    let frozen = r.snapshot(None).unwrap();
    let mut t = joined_to(&r, &d.path().join("t"));
    assert_eq!(t.pending(), vec![frozen]);
    assert!(
        !t.close_clean("the node stops").unwrap(),
        "a fill is under way"
    );
    assert!(!t.revision_file.has_clean_mark());
    assert!(t.write(0, &[5u8; BLOCK as usize], Some(2)).is_err());

    r.write(BLOCK, &[6u8; BLOCK as usize], Some(2)).unwrap();
    assert!(r.close_clean("the node stops").unwrap());
    assert!(r.revision_file.closed_clean_at(2));
    assert!(r.write(0, &[7u8; BLOCK as usize], Some(3)).is_err());
    drop(r);
    let r = Replica::open(&d.path().join("r")).unwrap();
    assert!(!r.revision_file.has_clean_mark(), "the open cleared it");
    let mut block = vec![0u8; BLOCK as usize];
    r.read(BLOCK, &mut block).unwrap();
    assert_eq!(block, vec![6u8; BLOCK as usize]);
}

/// A view of a replica (what its server opens of one lent to its engine,
/// to serve a rebuild's reads) opened and read while the replica's owner
/// merges it finds no block corrupt: a merge writes a block it copies up,
/// then its checksum, and a view that read between the two took a sound
/// block for a corrupt one (2026-12-06: the rebuild then failed its
/// source, and the server marked the block). Such a read now fails as
/// changed under the view; every other read returns the data.
#[test]
fn a_view_read_while_its_owner_merges_finds_no_block_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = Replica::create(dir.path(), 64 << 20).unwrap();
    // 48 MiB only the lowest layer holds: twelve steps, each a run of
    // 4 MiB written, then its checksums taken.
    let data: Vec<u8> = (0..(48usize << 20))
        .map(|i| (i / 4096 % 253) as u8)
        .collect();
    r.write(0, &data, None).unwrap();
    r.snapshot(None).unwrap();
    r.write(56 << 20, &vec![0xb1; 1 << 20], None).unwrap();
    r.snapshot(None).unwrap();
    let into = r.chain()[1].clone();
    let r = std::sync::Arc::new(std::sync::RwLock::new(r));
    let merging = {
        let r = r.clone();
        std::thread::spawn(move || super::merge_paced(&r, &[], 1 << 40, &|| false))
    };
    let (mut views, mut read) = (0, 0);
    let mut buf = vec![0u8; 64 << 10];
    let mut at = 0u64;
    // A read that failed: only as changed under the view.
    let seen = |e: ReplicaError, what: String| {
        assert!(matches!(e, ReplicaError::Changed(_)), "{what}: {e}");
    };
    while !merging.is_finished() {
        // A view opened as the merge ends may find a file the merge
        // removed: no view then, as for a rebuild's read (asked again).
        let Ok(v) = Replica::open_view(dir.path()) else {
            continue;
        };
        views += 1;
        // Somewhere else each time, over the lower layer's data (a read
        // of `buf`'s length from `at` ends within it).
        let within = data.len() as u64 - buf.len() as u64;
        at = (at + (7 << 20) + (36 << 10)) % within / BLOCK * BLOCK;
        if v.chain().contains(&into) {
            // As a rebuild reads a layer.
            match v.read_layer(&into, at, &mut buf) {
                Ok(()) => read += 1,
                Err(e) => seen(e, format!("view {views}, layer read at {at}")),
            }
        }
        // As the volume reads.
        match v.read(at, &mut buf) {
            Ok(()) => {
                assert!(buf == data[at as usize..at as usize + buf.len()], "at {at}");
                read += 1;
            }
            Err(e) => seen(e, format!("view {views}, read at {at}")),
        }
    }
    let report = merging.join().unwrap().unwrap();
    assert_eq!(report.merged, 1, "{report:?}");
    assert!(views > 0 && read > 0, "no view read while the merge ran");
}

/// The same, step by step: a block the merge has written into the upper
/// layer, its checksum not yet, seen through a view opened then, fails
/// every read and check as changed under the view, and nothing marks it;
/// once the step is done, the view reads the data. A block gone bad where
/// no merge runs is still found corrupt through a view.
#[test]
fn a_block_a_merge_is_writing_is_no_verdict_through_a_view_and_marks_nothing() {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap();
    let (mut r, want) = three_layers(dir.path());
    let j = r.next_merge().unwrap();
    r.begin_merge(&j).unwrap();
    // Block 0 of the lower layer written into the upper one, as a step
    // writes it before its checksum.
    let into = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.path().join(&j.into))
        .unwrap();
    into.write_all_at(&want[..BLOCK as usize], 0).unwrap();
    let v = Replica::open_view(dir.path()).unwrap();
    let mut block = vec![0u8; BLOCK as usize];
    let seen = [
        v.read_layer(&j.into, 0, &mut block).unwrap_err(),
        v.read(0, &mut block).unwrap_err(),
        v.verify_layer(&j.into).unwrap_err(),
    ];
    for e in &seen {
        assert!(matches!(e, ReplicaError::Changed(_)), "{e}");
        v.note_corruption(e);
    }
    assert!(!v.is_corrupt(&j.into), "a view marked the layer");
    assert!(
        !dir.path().join(CORRUPT_FILE).exists(),
        "a mark was written"
    );
    // The owner's merge goes on (its step writes the block and its
    // checksum): a view then reads the data.
    r.merge(&j, false, |_| {}).unwrap();
    let v = Replica::open_view(dir.path()).unwrap();
    let mut all = vec![0u8; START as usize];
    v.read(0, &mut all).unwrap();
    assert!(all == want, "reads changed");
    v.verify_layer(&j.into).unwrap();
    // A block gone bad in a frozen layer no merge writes: a verdict.
    flip(&dir.path().join(&j.into), 40 * BLOCK + 5);
    let v = Replica::open_view(dir.path()).unwrap();
    let e = v.read_layer(&j.into, 40 * BLOCK, &mut block).unwrap_err();
    assert!(
        matches!(e, ReplicaError::CorruptBlock { block: 40, .. }),
        "{e}"
    );
    let e = v.verify_layer(&j.into).unwrap_err();
    assert!(
        matches!(e, ReplicaError::CorruptBlock { block: 40, .. }),
        "{e}"
    );
}

/// A merge that meets a block gone bad in the layer it folds away (one
/// the upper layer lacks) carries it up as it is, with the checksum it
/// was written with, and ends; so does one whose upper layer has a block
/// gone bad. Each still fails its reads (a sound copy elsewhere, with
/// that checksum, mends it), the upper layer is marked and has its
/// checksum (the replica can be a rebuild's source again), and the merge
/// says what it found. Before 2026-12-06 the merge failed at the block at
/// every attempt, its journal stayed, and the upper layer reported no
/// checksum for ever.
#[test]
fn a_merge_that_meets_a_bad_block_carries_it_up_marked_and_ends() {
    let dir = tempfile::tempdir().unwrap();
    let (r, want) = three_layers(dir.path());
    // Block 5 of the lower layer (the upper one lacks it, the head too),
    // and block 41 of the upper one.
    flip(&dir.path().join("layer-000001.img"), 5 * BLOCK + 9);
    flip(&dir.path().join("layer-000002.img"), 41 * BLOCK + 9);
    let sum_of = |b: u64| sums::of(&want[(b * BLOCK) as usize..((b + 1) * BLOCK) as usize]);
    let r = std::sync::Arc::new(std::sync::RwLock::new(r));
    let e = super::merge_paced(&r, &[], 1 << 30, &|| false).unwrap_err();
    match &e {
        ReplicaError::CorruptBlock {
            layer,
            block,
            recorded,
            ..
        } => {
            assert_eq!((layer.as_str(), *block), ("layer-000002.img", 5), "{e}");
            assert_eq!(*recorded, Some(sum_of(5)), "{e}");
        }
        e => panic!("{e}"),
    }
    let check = |r: &Replica| {
        assert_eq!(r.chain(), ["layer-000002.img", "layer-000003.img"]);
        assert_eq!(r.next_merge(), None);
        let layers = r.layers();
        assert!(layers[0].checksum.is_some(), "{:?}", layers[0]);
        assert!(r.is_corrupt("layer-000002.img"));
        let mut block = vec![0u8; BLOCK as usize];
        for b in [5, 41] {
            match r.read(b * BLOCK, &mut block).unwrap_err() {
                ReplicaError::CorruptBlock {
                    block, recorded, ..
                } => assert_eq!((block, recorded), (b, Some(sum_of(b)))),
                e => panic!("block {b}: {e}"),
            }
        }
        for b in (0..START / BLOCK).filter(|b| ![5, 41].contains(b)) {
            r.read(b * BLOCK, &mut block).unwrap();
            assert!(
                block == want[(b * BLOCK) as usize..((b + 1) * BLOCK) as usize],
                "block {b}"
            );
        }
    };
    check(&r.read().unwrap());
    let again = super::merge_paced(&r, &[], 1 << 30, &|| false).unwrap();
    assert_eq!(again.merged, 0, "{again:?}");
    drop(r);
    check(&Replica::open(dir.path()).unwrap());
    let marks = std::fs::read_to_string(dir.path().join(CORRUPT_FILE)).unwrap();
    assert!(marks.contains("layer-000002.img block 5"), "{marks}");
}

/// A merge cut off by a crash is finished at the next open, which copies
/// up again each block of the upper layer that fails its checksum: one
/// the merge tore. A block of the upper layer's own (written over the
/// lower one's) gone bad on the disk is no tear: copied over, the lower
/// layer's older data would be served as sound in its place. It is
/// passed over, fails its reads and is marked (2026-12-06: it was
/// replaced, silently).
#[test]
fn a_merge_finished_at_open_never_puts_older_data_over_a_block_of_the_upper_layer_gone_bad() {
    let dir = tempfile::tempdir().unwrap();
    let (mut r, want) = three_layers(dir.path());
    let j = r.next_merge().unwrap();
    r.begin_merge(&j).unwrap();
    r.merge_some(0, 4, false).unwrap();
    drop(r);
    // Block 10: the upper layer's 0xb1 over the lower one's 0xa1.
    flip(&dir.path().join(&j.into), 10 * BLOCK + 9);
    let r = Replica::open(dir.path()).unwrap();
    assert_eq!(r.chain(), ["layer-000002.img", "layer-000003.img"]);
    let mut block = vec![0u8; BLOCK as usize];
    match r.read(10 * BLOCK, &mut block) {
        Err(ReplicaError::CorruptBlock { block: 10, .. }) => {}
        Ok(()) => panic!(
            "block 10 read {:#x}, the upper layer's was {:#x}",
            block[0],
            want[(10 * BLOCK) as usize]
        ),
        Err(e) => panic!("{e}"),
    }
    assert!(r.is_corrupt(&j.into));
    for b in (0..START / BLOCK).filter(|&b| b != 10) {
        r.read(b * BLOCK, &mut block).unwrap();
        assert!(
            block == want[(b * BLOCK) as usize..((b + 1) * BLOCK) as usize],
            "block {b}"
        );
    }
}

/// Reads the whole head ahead of its freeze, as a replica's server does
/// for WARM.
fn warm_all(r: &Replica) {
    warm(r).unwrap();
}

const MIB: u64 = 1 << 20;

#[test]
fn a_head_read_ahead_and_written_after_freezes_with_the_checksum_of_what_it_holds() {
    let d = tempfile::tempdir().unwrap();
    let (one, two) = (d.path().join("one"), d.path().join("two"));
    let mut warmed = Replica::create(&one, 16 * MIB).unwrap();
    let mut cold = Replica::create(&two, 16 * MIB).unwrap();
    for r in [&mut warmed, &mut cold] {
        for (chunk, byte) in [(0, 1u8), (3, 2), (7, 3), (12, 4)] {
            r.write(chunk * MIB + BLOCK, &[byte; 3 * BLOCK as usize], None)
                .unwrap();
        }
    }
    warm_all(&warmed);
    assert_eq!(warmed.warm_chunks(), 4);
    // A write over a chunk read ahead, a trim of another (its block
    // becomes a hole), a write into one that held nothing.
    for r in [&mut warmed, &mut cold] {
        r.write(3 * MIB + BLOCK + 10, &[9u8; 100], None).unwrap();
        r.trim(7 * MIB + 2 * BLOCK, BLOCK, None).unwrap();
        r.write(9 * MIB, &[5u8; BLOCK as usize], None).unwrap();
    }
    assert_eq!(warmed.warm_chunks(), 2, "chunks 0 and 12 stand");
    let a = warmed.snapshot(None).unwrap();
    let b = cold.snapshot(None).unwrap();
    assert_eq!(warmed.warm_chunks(), 0, "a new head starts with none");
    // What a freeze that read the whole head records, and what the layer
    // holds when read whole again.
    let sum = &warmed.meta.frozen[&a];
    assert!(sum.starts_with("c1:"), "{sum}");
    assert_eq!(sum, &cold.meta.frozen[&b]);
    warmed.verify().unwrap();
    drop(warmed);
    Replica::open(&one).unwrap().verify().unwrap();
    Replica::scrub(&one, |_| {}).unwrap();
}

#[test]
fn a_chunk_read_ahead_is_not_read_again_by_the_freeze_and_a_block_gone_bad_after_is_found_by_the_scrub()
 {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("r");
    let mut r = Replica::create(&dir, 4 * MIB).unwrap();
    r.write(0, &[6u8; 3 * MIB as usize], None).unwrap();
    r.flush().unwrap();
    warm_all(&r);
    assert_eq!(r.warm_chunks(), 3);
    let head = r.chain().last().unwrap().clone();
    flip(&dir.join(&head), MIB + 5);
    // The freeze reads none of it again (it would fail on the block).
    let frozen = r.snapshot(None).unwrap();
    assert_eq!(frozen, head);
    // The checksum is of the block as it was written: a read, the check
    // of the whole layer and the scrub each find it bad.
    let mut buf = vec![0u8; BLOCK as usize];
    let e = r.read(MIB, &mut buf).unwrap_err();
    assert!(
        matches!(e, ReplicaError::CorruptBlock { block: 256, .. }),
        "{e}"
    );
    let e = r.verify().unwrap_err();
    assert!(
        matches!(e, ReplicaError::CorruptBlock { block: 256, .. }),
        "{e}"
    );
    let e = Replica::scrub(&dir, |_| {}).unwrap_err();
    assert!(e.to_string().contains(&frozen), "{e}");
}

#[test]
fn a_chunk_with_a_bad_block_is_left_to_the_freeze_which_finds_the_block() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("r");
    let mut r = Replica::create(&dir, 4 * MIB).unwrap();
    r.write(0, &[6u8; 3 * MIB as usize], None).unwrap();
    r.flush().unwrap();
    let head = r.chain().last().unwrap().clone();
    flip(&dir.join(&head), 2 * MIB + 3 * BLOCK + 1);
    warm_all(&r);
    assert_eq!(r.warm_chunks(), 2, "the chunk with the bad block is left");
    let e = r.snapshot(None).unwrap_err();
    assert!(
        matches!(e, ReplicaError::CorruptBlock { block: 515, .. }),
        "{e}"
    );
    // Written again, the block is sound and the freeze goes through.
    r.write(2 * MIB + 3 * BLOCK, &[7u8; BLOCK as usize], None)
        .unwrap();
    r.snapshot(None).unwrap();
    r.verify().unwrap();
}

#[test]
fn a_freeze_read_by_several_threads_records_what_one_reader_does_and_fails_on_the_first_bad_chunk()
{
    let d = tempfile::tempdir().unwrap();
    let (one, four) = (d.path().join("one"), d.path().join("four"));
    let mut alone = Replica::create(&one, 48 * MIB).unwrap();
    let mut many = Replica::create(&four, 48 * MIB).unwrap();
    alone.set_freeze_readers(1);
    many.set_freeze_readers(4);
    // Chunks whole, in part, across a chunk's end, and holes between.
    let mut x = 7u8;
    for (at, len) in [
        (0, MIB),
        (5 * MIB + 3 * BLOCK, 9 * BLOCK),
        (9 * MIB - 2 * BLOCK, 4 * BLOCK),
    ]
    .into_iter()
    .chain((12..44).map(|c| (c * MIB + (c % 5) * BLOCK, (c % 7 + 1) * 64 * BLOCK)))
    {
        x = x.wrapping_mul(31).wrapping_add(17);
        let data: Vec<u8> = (0..len).map(|i| (i as u8) ^ x).collect();
        for r in [&mut alone, &mut many] {
            r.write(at, &data, None).unwrap();
        }
    }
    let a = alone.snapshot(None).unwrap();
    let b = many.snapshot(None).unwrap();
    assert_eq!(alone.last_freeze(), (0, 36));
    assert_eq!(many.last_freeze(), (0, 36));
    let sum = &many.meta.frozen[&b];
    assert!(sum.starts_with("c1:"), "{sum}");
    assert_eq!(sum, &alone.meta.frozen[&a], "the same checksum either way");
    many.verify().unwrap();

    // Bad blocks in four chunks: the freeze names the first
    // in the volume's order, and every one given up is frozen lost,
    // whichever thread read it.
    many.write(5 * MIB, &[1u8; MIB as usize], None).unwrap();
    many.write(30 * MIB, &[2u8; 3 * MIB as usize], None)
        .unwrap();
    let head = many.chain().last().unwrap().clone();
    // The last two in chunks next to each other: two readers find them
    // at about the same time, and the first in order is the one named.
    let bad = [5 * 256 + 17, 30 * 256 + 3, 31 * 256 + 200, 32 * 256];
    for b in bad {
        flip(&four.join(&head), b * BLOCK + 11);
    }
    for _ in 0..4 {
        let e = many.snapshot(None).unwrap_err();
        assert!(
            matches!(e, ReplicaError::CorruptBlock { block, .. } if block == bad[0]),
            "{e}"
        );
        let e = many
            .snapshot_losing(None, &BTreeSet::from([bad[0], bad[1]]))
            .unwrap_err();
        assert!(
            matches!(e, ReplicaError::CorruptBlock { block, .. } if block == bad[2]),
            "{e}"
        );
    }
    assert_eq!(
        many.chain().last(),
        Some(&head),
        "a failed freeze changes nothing"
    );
    let frozen = many.snapshot_losing(None, &BTreeSet::from(bad)).unwrap();
    assert_eq!(frozen, head);
    assert_eq!(many.meta.lost[&frozen], BTreeSet::from(bad));
    let mut block = vec![0u8; BLOCK as usize];
    for b in bad {
        assert!(matches!(
            many.read(b * BLOCK, &mut block),
            Err(ReplicaError::LostBlock { .. })
        ));
    }
    many.read(5 * MIB + BLOCK, &mut block).unwrap();
    assert!(
        block.iter().all(|b| *b == 1),
        "a sound block of a chunk with a lost one"
    );
}

#[test]
fn a_layer_checksum_recorded_before_the_chunked_form_is_checked_in_its_own_form() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("r");
    let mut r = Replica::create(&dir, 4 * MIB).unwrap();
    r.write(BLOCK, &[3u8; 300 * BLOCK as usize], None).unwrap();
    r.write(3 * MIB, &[4u8; BLOCK as usize], None).unwrap();
    let frozen = r.snapshot(None).unwrap();
    // The record as a freeze from before the chunked form wrote it.
    let runs = checksum::take(&r.layers[0], checksum::Form::Runs, |_, _| Ok(())).unwrap();
    assert!(!runs.contains(':') && runs.len() == 64, "{runs}");
    assert_ne!(runs, r.meta.frozen[&frozen]);
    let mut meta = r.meta.clone();
    meta.frozen.insert(frozen.clone(), runs.clone());
    meta.write(&dir).unwrap();
    drop(r);
    let r = Replica::open(&dir).unwrap();
    assert_eq!(r.meta.frozen[&frozen], runs);
    r.verify().unwrap();
    Replica::scrub(&dir, |_| {}).unwrap();
    // Recorded wrong in that form, it fails as a wrong chunked one does.
    let mut meta = r.meta.clone();
    meta.frozen.insert(frozen.clone(), "0".repeat(64));
    meta.write(&dir).unwrap();
    drop(r);
    let e = Replica::open(&dir).unwrap().verify().unwrap_err();
    assert!(
        matches!(&e, ReplicaError::CorruptLayer { layer, .. } if *layer == frozen),
        "{e}"
    );
}

#[test]
fn a_chunk_written_or_frozen_while_it_is_read_ahead_keeps_no_digest() {
    let d = tempfile::tempdir().unwrap();
    let mut r = Replica::create(&d.path().join("r"), 4 * MIB).unwrap();
    r.write(0, &[1u8; 2 * MIB as usize], None).unwrap();
    // Read with no write between: kept.
    let ahead = r.warm_next(0).unwrap().unwrap();
    let digest = ahead.read().unwrap();
    assert!(digest.is_some());
    r.warm_keep(ahead, digest);
    assert_eq!(r.warm_chunks(), 1);
    // A write into the chunk between its choice and its keeping: the
    // digest read (of the data before the write, or torn) is not kept.
    let ahead = r.warm_next(1).unwrap().unwrap();
    let digest = ahead.read().unwrap();
    r.write(MIB + 5 * BLOCK, &[2u8; 10], None).unwrap();
    r.warm_keep(ahead, digest);
    assert_eq!(r.warm_chunks(), 1);
    // A write into another chunk spoils nothing.
    let ahead = r.warm_next(1).unwrap().unwrap();
    let digest = ahead.read().unwrap();
    r.write(3 * MIB, &[3u8; 10], None).unwrap();
    r.warm_keep(ahead, digest);
    assert_eq!(r.warm_chunks(), 2);
    // A freeze between the two: the head is another.
    let more = r.warm_next(0).unwrap().unwrap();
    assert_eq!(more.chunk, 3);
    let digest = more.read().unwrap();
    r.snapshot(None).unwrap();
    r.write(3 * MIB, &[4u8; 10], None).unwrap();
    r.warm_keep(more, digest);
    assert_eq!(r.warm_chunks(), 0);
    // Whatever was read ahead, the layer frozen checks whole.
    r.verify().unwrap();
}
