//! Power loss under a replica: its filesystem (a real ext4, on a real loop
//! device) sits on a disk that forgets what it was not told to keep
//! (`support/forgetful.rs`). What must hold: every write made before an
//! acknowledged flush reads back, and every block reads as something it
//! held (old or new bytes), never as an error, whatever reached the disk
//! of what followed.

#[path = "support/forgetful.rs"]
mod forgetful;

use ballast_node::replica::Replica;
use forgetful::ForgetfulFs;

const BLOCK: u64 = 4096;

fn pattern(offset: u64, round: u8) -> Vec<u8> {
    (0..64 * 1024u64)
        .map(|i| (((offset + i) / BLOCK) as u8).wrapping_mul(31) ^ round)
        .collect()
}

/// Writes `count` 64 KiB writes from `offset`, the pattern of `round`.
fn write_run(r: &mut Replica, offset: u64, count: u64, round: u8) {
    for i in 0..count {
        let at = offset + i * 64 * 1024;
        r.write(at, &pattern(at, round), None).unwrap();
    }
}

#[test]
fn after_a_power_cut_every_flushed_write_reads_back_and_no_block_fails_its_checksum() {
    let dir = tempfile::tempdir().unwrap();
    let mut fs = ForgetfulFs::mount(
        &dir.path().join("disk.img"),
        &dir.path().join("fs"),
        256 << 20,
    );
    let rdir = fs.at.join("r");
    let vol = 32u64 << 20;
    let mut r = Replica::create_for(&rdir, "v", vol).unwrap();
    // 4 MiB flushed, then 12 MiB more that no flush covers.
    write_run(&mut r, 0, 64, 1);
    r.flush().unwrap();
    write_run(&mut r, 8 << 20, 192, 2);
    forgetful::heads_reach_the_disk(&fs.at);
    drop(r);
    let lost = fs.power_cut();
    eprintln!("the power cut took {lost} blocks from the disk's cache, and the page cache");

    let r = Replica::open(&rdir).unwrap();
    // Its write log may have lost entries of writes whose data the disk
    // kept: it says nothing of what came after its revision, so that a
    // replica made equal to it is rebuilt, not caught up from the log.
    assert_eq!(r.writes_since(r.revision()), None);
    let mut buf = vec![0u8; 64 * 1024];
    for i in 0..64u64 {
        let at = i * 64 * 1024;
        r.read(at, &mut buf).unwrap();
        assert!(
            buf == pattern(at, 1),
            "the flushed write at {at} reads back other data"
        );
    }
    // What no flush covered holds, block by block, the old bytes (zeros)
    // or the new: never an error, never other bytes.
    let (mut new, mut old) = (0, 0);
    for i in 0..192u64 {
        let at = (8 << 20) + i * 64 * 1024;
        let want = pattern(at, 2);
        for b in 0..16usize {
            let block = &mut buf[..BLOCK as usize];
            let offset = at + b as u64 * BLOCK;
            r.read(offset, block)
                .unwrap_or_else(|e| panic!("block at {offset}, written but not flushed: {e}"));
            let range = b * BLOCK as usize..(b + 1) * BLOCK as usize;
            if *block == want[range] {
                new += 1;
            } else if block.iter().all(|x| *x == 0) {
                old += 1;
            } else {
                panic!("block at {offset} holds bytes it never held");
            }
        }
    }
    eprintln!("unflushed blocks: {new} new, {old} old");
    assert!(new > 0, "the test meant the head's data to reach the disk");
    // The blocks that did not match are suspect (an engine settles them
    // from a replica that holds them sound), and only those: no flushed
    // block is among them.
    let suspects = r.suspects();
    assert!(!suspects.is_empty());
    assert!(
        suspects.iter().all(|b| (2048..2048 + 192 * 16).contains(b)),
        "suspect blocks outside the unflushed writes: {suspects:?}"
    );
    // And the replica goes on: a write, a flush, a reopen. A write of a
    // whole suspect block settles it, for good.
    drop(r);
    let mut r = Replica::open(&rdir).unwrap();
    assert_eq!(r.suspects(), suspects, "they are on the disk");
    write_run(&mut r, 0, 1, 3);
    let first = suspects[0] * BLOCK / (64 * 1024) * (64 * 1024);
    write_run(&mut r, first, 1, 4);
    r.flush().unwrap();
    drop(r);
    let r = Replica::open(&rdir).unwrap();
    r.read(0, &mut buf).unwrap();
    assert!(buf == pattern(0, 3));
    assert!(!r.suspects().contains(&suspects[0]), "a write settles it");
    assert_eq!(
        r.suspects().len(),
        suspects
            .iter()
            .filter(|b| **b * BLOCK / (64 * 1024) * (64 * 1024) != first)
            .count()
    );
}
