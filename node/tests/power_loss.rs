//! Power loss under a replica: its filesystem (a real ext4, on a real loop
//! device) sits on a disk that forgets what it was not told to keep
//! (`support/forgetful.rs`). What must hold: every write made before an
//! acknowledged flush reads back, and every block reads as something it
//! held (old or new bytes), never as an error, whatever reached the disk
//! of what followed.

#[allow(dead_code)] // shared with the engine tests; this one uses what starts engines
mod common;
#[path = "support/fill.rs"]
mod fill;
#[path = "support/forgetful.rs"]
mod forgetful;

use ballast_node::engine::ReplicaAddr;
use ballast_node::replica::{Replica, WRITEBACK_EVERY, replica_dir};
use forgetful::ForgetfulFs;

const BLOCK: u64 = 4096;

fn pattern(offset: u64, round: u8) -> Vec<u8> {
    (0..64 * 1024u64)
        .map(|i| (((offset + i) / BLOCK) as u8).wrapping_mul(31) ^ round)
        .collect()
}

/// A disk of 256 MiB that forgets, with an ext4 on it, in a directory
/// that lives as long as the first value returned.
fn forgetful_disk() -> (tempfile::TempDir, ForgetfulFs) {
    let dir = tempfile::tempdir().unwrap();
    let fs = ForgetfulFs::mount(
        &dir.path().join("disk.img"),
        &dir.path().join("fs"),
        256 << 20,
    );
    (dir, fs)
}

/// A new replica of 32 MiB (volume "v") on a forgetful disk: the disk's
/// directory, the disk, the replica's directory and the replica.
fn replica_on_a_forgetful_disk() -> (tempfile::TempDir, ForgetfulFs, std::path::PathBuf, Replica) {
    let (dir, fs) = forgetful_disk();
    let rdir = fs.at.join("r");
    let r = Replica::create_for(&rdir, "v", 32 << 20).unwrap();
    (dir, fs, rdir, r)
}

/// Writes `count` 64 KiB writes from `offset`, the pattern of `round`.
fn write_run(r: &mut Replica, offset: u64, count: u64, round: u8) {
    for i in 0..count {
        let at = offset + i * 64 * 1024;
        r.write(at, &pattern(at, round), None).unwrap();
    }
}

/// Reads back `count` 64 KiB writes from `offset`, each of which must hold
/// the pattern of `round`; `what` names them in a failure.
fn read_run(r: &Replica, offset: u64, count: u64, round: u8, what: &str) {
    let mut buf = vec![0u8; 64 * 1024];
    for i in 0..count {
        let at = offset + i * 64 * 1024;
        r.read(at, &mut buf).unwrap();
        assert!(
            buf == pattern(at, round),
            "{what} at {at} reads back other data"
        );
    }
}

/// Writes the 64 KiB writes `writes` (by their index) through `engine`,
/// the pattern of `round`, with no flush after them.
async fn engine_run(
    engine: &ballast_node::engine::Engine,
    writes: std::ops::Range<u64>,
    round: u8,
) {
    for i in writes {
        let at = i * 64 * 1024;
        engine.write(at, &pattern(at, round), false).await.unwrap();
    }
}

#[test]
fn after_a_power_cut_every_flushed_write_reads_back_and_no_block_fails_its_checksum() {
    let (_dir, mut fs, rdir, mut r) = replica_on_a_forgetful_disk();
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
    read_run(&r, 0, 64, 1, "the flushed write");
    let mut buf = vec![0u8; 64 * 1024];
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
    // whole suspect block settles it, for good, once a flush made the
    // write durable: a stop before that leaves it suspect.
    drop(r);
    let mut r = Replica::open(&rdir).unwrap();
    assert_eq!(r.suspects(), suspects, "they are on the disk");
    let first = suspects[0] * BLOCK / (64 * 1024) * (64 * 1024);
    write_run(&mut r, first, 1, 4);
    assert!(!r.suspects().contains(&suspects[0]));
    drop(r);
    let mut r = Replica::open(&rdir).unwrap();
    assert_eq!(
        r.suspects(),
        suspects,
        "no flush after the write: still suspect on the disk"
    );
    write_run(&mut r, 0, 1, 3);
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

/// A flush that ends no interval of the dirty regions (one soon after the
/// last, as a writer flushing after each write makes them) makes the
/// writes durable and leaves their checksums and the revision file to the
/// next that does (`replica/regions.rs`; after a cut the counter only
/// picks the replica the others are made equal to, `engine/equalize.rs`). A cut before that loses no flushed write: its
/// blocks, in regions written lately, are checked, found not matching the
/// checksums the disk kept, and taken as they are, suspect. A flush that
/// ends an interval syncs the checksums, and a cut after it leaves no
/// block suspect; a clean close and a snapshot sync them whatever the
/// interval.
#[test]
fn a_flush_within_an_interval_leaves_the_checksums_and_the_counter_to_the_next_and_a_cut_before_it_loses_no_write()
 {
    let (_dir, mut fs, rdir, mut r) = replica_on_a_forgetful_disk();
    // Every flush after the first falls within its interval.
    r.set_flush_interval(std::time::Duration::from_secs(3600));
    write_run(&mut r, 0, 16, 1);
    r.flush().unwrap();
    write_run(&mut r, 8 << 20, 16, 2);
    r.flush().unwrap();
    drop(r);
    fs.power_cut();

    let mut r = Replica::open(&rdir).unwrap();
    read_run(&r, 0, 16, 1, "the flushed write");
    read_run(&r, 8 << 20, 16, 2, "the write flushed within the interval");
    assert_eq!(
        r.revision(),
        16,
        "the counter as the flush that ended the interval left it (32 when every flush syncs it)"
    );
    let suspects = r.suspects();
    assert_eq!(
        suspects,
        (2048..2048 + 256).collect::<Vec<u64>>(),
        "the blocks of the flush within the interval, and only those"
    );

    // The first flush of this open ends an interval: the checksums are
    // synced, and a cut after it finds every block matching.
    write_run(&mut r, 16 << 20, 16, 3);
    r.flush().unwrap();
    drop(r);
    fs.power_cut();
    let mut r = Replica::open(&rdir).unwrap();
    assert_eq!(r.suspects(), suspects, "nothing new is suspect");

    // A clean close syncs them within an interval too.
    r.set_flush_interval(std::time::Duration::from_secs(3600));
    r.flush().unwrap();
    write_run(&mut r, 20 << 20, 16, 4);
    assert!(r.close_clean("the test").unwrap());
    drop(r);
    fs.power_cut();
    let mut r = Replica::open(&rdir).unwrap();
    assert_eq!(
        r.suspects(),
        suspects,
        "closed clean: nothing new is suspect"
    );
    read_run(&r, 20 << 20, 16, 4, "the write before the clean close");

    // So does a snapshot, whose frozen layer no new boot checks (over
    // blocks written before, so that their checksums' pages are not new
    // to the filesystem, which would sync them with its journal).
    r.set_flush_interval(std::time::Duration::from_secs(3600));
    r.flush().unwrap();
    write_run(&mut r, 16 << 20, 16, 5);
    r.snapshot(None).unwrap();
    drop(r);
    fs.power_cut();
    let r = Replica::open(&rdir).unwrap();
    read_run(&r, 16 << 20, 16, 5, "the write before the snapshot");
}

/// A replica that guards its checksums (a volume's only rw replica while
/// another exists, `engine/guard.rs`) syncs them at every flush: a power
/// cut after a flush within the interval leaves no block suspect, where
/// without it every block of that write is (the test above). A block gone
/// bad in a region written lately is suspect, and keeps the checksum the
/// disk held, its sound one, for a copy to match. Turned off, the mark goes
/// first, and the checksums are left to the interval again.
#[test]
fn a_replica_guarding_its_checksums_syncs_them_at_every_flush_and_a_bad_block_keeps_the_disks_checksum()
 {
    let (_dir, mut fs, rdir, mut r) = replica_on_a_forgetful_disk();
    r.set_flush_interval(std::time::Duration::from_secs(3600));
    write_run(&mut r, 0, 16, 1);
    r.flush().unwrap();
    assert!(r.set_sums_every_flush(true).unwrap());
    assert!(!r.set_sums_every_flush(true).unwrap(), "on already");
    write_run(&mut r, 8 << 20, 16, 2);
    r.flush().unwrap();
    drop(r);
    fs.power_cut();

    let mut r = Replica::open(&rdir).unwrap();
    assert!(r.sums_every_flush(), "the mark is on the disk");
    read_run(&r, 0, 16, 1, "the first flushed write");
    read_run(&r, 8 << 20, 16, 2, "the write flushed within the interval");
    assert_eq!(
        r.suspects(),
        Vec::<u64>::new(),
        "the checksums of the write flushed within the interval were synced with it"
    );

    // A block whose data and checksum are on the disk goes bad there.
    r.set_flush_interval(std::time::Duration::from_secs(3600));
    write_run(&mut r, 16 << 20, 1, 3);
    r.flush().unwrap();
    drop(r);
    let bad = (16u64 << 20) / BLOCK + 5;
    let head = common::head_file(&rdir);
    common::flip_block(&head, bad * BLOCK);
    std::fs::File::open(&head).unwrap().sync_all().unwrap();
    fs.power_cut();
    let mut r = Replica::open(&rdir).unwrap();
    assert_eq!(r.suspects(), vec![bad], "the block gone bad, and only it");
    let sound = &pattern(16 << 20, 3)[(5 * BLOCK) as usize..][..BLOCK as usize];
    assert_eq!(
        r.suspect_sums()
            .iter()
            .map(|(b, s)| (*b, *s))
            .collect::<Vec<_>>(),
        vec![(bad, ballast_node::replica::block_sum(sound))],
        "the checksum the disk held, the sound block's, is kept"
    );

    // Turned off: a flush within the interval leaves the checksums again,
    // and what a cut then finds suspect keeps no checksum.
    r.set_flush_interval(std::time::Duration::from_secs(3600));
    r.flush().unwrap();
    assert!(r.set_sums_every_flush(false).unwrap());
    write_run(&mut r, 8 << 20, 16, 4);
    r.flush().unwrap();
    drop(r);
    fs.power_cut();
    let r = Replica::open(&rdir).unwrap();
    assert!(!r.sums_every_flush(), "the mark went durably");
    read_run(
        &r,
        8 << 20,
        16,
        4,
        "the write flushed after the guard ended",
    );
    let mut want: Vec<u64> = (2048..2048 + 256).collect();
    want.push(bad);
    assert_eq!(
        r.suspects(),
        want,
        "the blocks of the flush within the interval, and the bad one"
    );
    assert_eq!(
        r.suspect_sums().keys().copied().collect::<Vec<_>>(),
        vec![bad],
        "only the block found while the guard was on keeps a checksum"
    );
}

/// Guarded, a block of the head that held no flushed write (a hole, where
/// the volume reads the layer below, or zeros after a trim) yet holds
/// data after a power cut (a write no flush covered, or the disk gone
/// bad): its checksum on the disk is none, so it goes from the head, and
/// the volume reads it as at the last flush; it is not suspect. Found by
/// the soak (seed 20261261, reboots 4): a block flipped in the head of the
/// last current replica, where the head held none, was served flipped.
#[test]
fn a_guarded_heads_block_that_held_no_flushed_write_reads_as_at_the_last_flush_after_a_power_cut() {
    let (_dir, mut fs, rdir, mut r) = replica_on_a_forgetful_disk();
    write_run(&mut r, 0, 16, 1);
    r.snapshot(None).unwrap();
    // The head holds blocks 16..32 and 256..272 (the regions of both
    // holes below dirty); block 256 trimmed.
    write_run(&mut r, 64 * 1024, 1, 2);
    write_run(&mut r, 1 << 20, 1, 2);
    let trimmed = 256u64;
    r.trim(trimmed * BLOCK, BLOCK, None).unwrap();
    r.set_sums_every_flush(true).unwrap();
    r.flush().unwrap();
    drop(r);
    // Data appears where the head holds none: block 5 (held by the
    // frozen layer below) and the trimmed block.
    let head = common::head_file(&rdir);
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&head).unwrap();
        for b in [5, trimmed] {
            f.write_all_at(&[0x5a; BLOCK as usize], b * BLOCK).unwrap();
        }
        f.sync_all().unwrap();
    }
    fs.power_cut();

    let r = Replica::open(&rdir).unwrap();
    assert_eq!(r.suspects(), Vec::<u64>::new(), "neither is suspect");
    let mut buf = vec![0u8; BLOCK as usize];
    r.read(5 * BLOCK, &mut buf).unwrap();
    assert_eq!(
        buf,
        pattern(0, 1)[(5 * BLOCK) as usize..][..BLOCK as usize],
        "the layer below, as at the last flush"
    );
    r.read(trimmed * BLOCK, &mut buf).unwrap();
    assert_eq!(buf, vec![0u8; BLOCK as usize], "zeros, as the trim left it");
    read_run(&r, 64 * 1024, 1, 2, "the head's own write");
}

#[test]
fn a_replica_closed_clean_before_a_power_cut_keeps_its_log_and_its_checksums_hold() {
    let (_dir, mut fs, rdir, mut r) = replica_on_a_forgetful_disk();
    write_run(&mut r, 0, 64, 1);
    r.flush().unwrap();
    let flushed = r.revision();
    // Writes no flush of the client covers; the clean close makes them
    // durable, and says so.
    write_run(&mut r, 8 << 20, 64, 2);
    let closed = r.revision();
    assert!(
        r.close_clean("the node stops").unwrap(),
        "nothing under way: it marks"
    );
    assert!(
        r.write(0, &pattern(0, 9), None).is_err(),
        "a write after the clean close would make the mark a lie: it fails"
    );
    drop(r);
    fs.power_cut();
    // A block goes bad on the disk while the machine is off.
    let bad_block = 2048 + 5;
    let head = std::fs::OpenOptions::new()
        .write(true)
        .open(rdir.join("layer-000001.img"))
        .unwrap();
    std::os::unix::fs::FileExt::write_all_at(&head, &[0xee; 64], bad_block * BLOCK).unwrap();
    head.sync_all().unwrap();
    drop(head);

    let r = Replica::open(&rdir).unwrap();
    assert_eq!(r.revision(), closed);
    // The new boot found nothing left unsynced: the log answers for the
    // writes since the client's flush, so a replica behind is caught up.
    let since = r
        .writes_since(flushed)
        .expect("the write log is trusted after a clean close");
    assert_eq!(since.len() as u64, closed - flushed);
    assert!(
        r.suspects().is_empty(),
        "no head check, so no suspect block"
    );
    let mut buf = vec![0u8; 64 * 1024];
    for (offset, round) in (0..64u64)
        .map(|i| (i * 64 * 1024, 1))
        .chain((0..64u64).map(|i| ((8 << 20) + i * 64 * 1024, 2)))
    {
        if offset / BLOCK <= bad_block && bad_block < (offset + buf.len() as u64) / BLOCK {
            continue;
        }
        r.read(offset, &mut buf).unwrap();
        assert!(
            buf == pattern(offset, round),
            "the write at {offset} reads back"
        );
    }
    // The bad block is not taken for a write no flush covered: its
    // checksum still holds it to what was written, and its reads fail.
    let mut block = vec![0u8; BLOCK as usize];
    assert!(
        r.read(bad_block * BLOCK, &mut block).is_err(),
        "a block gone bad after a clean close is found corrupt"
    );
}

#[test]
fn the_clean_close_mark_goes_at_the_next_open_so_a_later_power_cut_checks_the_head() {
    let (_dir, mut fs, rdir, mut r) = replica_on_a_forgetful_disk();
    write_run(&mut r, 0, 16, 1);
    assert!(r.close_clean("a planned stop").unwrap());
    drop(r);
    // Opened again in the same boot: it goes on, unmarked on the disk.
    let mut r = Replica::open(&rdir).unwrap();
    write_run(&mut r, 8 << 20, 192, 2);
    forgetful::heads_reach_the_disk(&fs.at);
    drop(r);
    fs.power_cut();

    let r = Replica::open(&rdir).unwrap();
    assert_eq!(
        r.writes_since(r.revision()),
        None,
        "the mark was cleared on the disk before the writes: the cut is seen"
    );
    assert!(
        !r.suspects().is_empty(),
        "the head was checked: the unflushed writes' blocks are suspect"
    );
    let mut buf = vec![0u8; 64 * 1024];
    for i in 0..16u64 {
        let at = i * 64 * 1024;
        r.read(at, &mut buf).unwrap();
        assert!(buf == pattern(at, 1), "the write at {at} reads back");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_told_to_stop_closes_its_lent_replica_clean_and_the_next_boot_trusts_it() {
    let (_dir, mut fs) = forgetful_disk();
    let others = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let vol = 16u64 << 20;
    let mut addrs = vec![common::replica_server(&fs.at, "v-r0", vol).await];
    for (i, d) in others.iter().enumerate() {
        addrs.push(common::replica_server(d.path(), &format!("v-r{}", i + 1), vol).await);
    }
    let engine = common::engine_over(vol, &addrs, Some("v-r0")).await;
    let local = replica_dir(&fs.at, "v-r0");
    engine
        .lend_local(local.clone(), WRITEBACK_EVERY)
        .await
        .unwrap();
    // Flushed writes, then writes no flush of the client covers.
    engine_run(&engine, 0..32, 1).await;
    engine.flush().await.unwrap();
    engine_run(&engine, 64..128, 2).await;
    let closed = engine.close(std::time::Duration::from_secs(5)).await;
    assert!(closed.is_some(), "no I/O was under way");
    drop(closed);
    drop(engine);
    // The machine is shut down and comes back: a power cut after the
    // clean close loses nothing it made durable.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    fs.power_cut();

    let r = Replica::open(&local).unwrap();
    assert_eq!(r.revision(), 32 + 64, "every write");
    assert_eq!(
        r.writes_since(32).map(|w| w.len()),
        Some(64),
        "its write log is trusted after the clean close: a replica behind it is caught up"
    );
    assert!(r.suspects().is_empty());
    let mut buf = vec![0u8; 65536];
    for i in (0..32u64).chain(64..128) {
        r.read(i * 65536, &mut buf).unwrap();
        let round = if i < 32 { 1 } else { 2 };
        assert!(
            buf == pattern(i * 65536, round),
            "the write at {} reads back",
            i * 65536
        );
    }
}

#[test]
fn a_stopping_node_plugin_closes_the_replicas_it_holds_clean() {
    let (_dir, mut fs) = forgetful_disk();
    let vol = 16u64 << 20;
    Replica::create(&replica_dir(&fs.at, "v-r1"), vol).unwrap();
    let table = ballast_node::replica::Replicas::new(vec![fs.at.clone()]);
    let shared = table.find("v-r1").unwrap();
    // Writes a remote engine made through the server, no flush after them.
    write_run(&mut shared.write().unwrap(), 0, 64, 1);
    table.close_all("the node plugin stopped");
    assert!(
        shared
            .write()
            .unwrap()
            .write(0, &pattern(0, 9), None)
            .is_err(),
        "nothing is written after the clean close"
    );
    let refused = table.find("v-r1").err().unwrap_or_default();
    assert!(refused.contains("closed"), "nor opened again: {refused}");
    drop((shared, table));
    fs.power_cut();

    let r = Replica::open(&replica_dir(&fs.at, "v-r1")).unwrap();
    assert_eq!(r.revision(), 64);
    assert_eq!(
        r.writes_since(0).map(|w| w.len()),
        Some(64),
        "its log is trusted"
    );
    let mut buf = vec![0u8; 65536];
    for i in 0..64u64 {
        r.read(i * 65536, &mut buf).unwrap();
        assert!(
            buf == pattern(i * 65536, 1),
            "the write at {} reads back",
            i * 65536
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_whose_loan_lapsed_does_not_mark_its_replica_clean() {
    let (d0, d1) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let vol = 4u64 << 20;
    let local = replica_dir(d0.path(), "v-r0");
    Replica::create(&local, vol).unwrap();
    let node = common::NodeProcess::start(d0.path(), "127.0.0.1:0").await;
    let addrs = [
        ReplicaAddr {
            name: "v-r0".into(),
            addr: node.addr.clone(),
        },
        common::replica_server(d1.path(), "v-r1", vol).await,
    ];
    let engine = common::engine_over(vol, &addrs, Some("v-r0")).await;
    engine
        .lend_local(local.clone(), WRITEBACK_EVERY)
        .await
        .unwrap();
    engine_run(&engine, 0..16, 1).await;
    // Its node plugin goes (a restart): the loan lapses, and until it is
    // lent again someone else may write the files through the next one.
    drop(node);
    let closed = engine.close(std::time::Duration::from_secs(5)).await;
    assert!(closed.is_some());
    drop(closed);
    drop(engine);
    forgetful::as_after_a_reboot(d0.path());

    let r = Replica::open(&local).unwrap();
    assert_eq!(r.revision(), 16);
    assert_eq!(
        r.writes_since(0),
        None,
        "not closed clean without its loan: the new boot checks the head and forgets the log"
    );
}

/// After a power cut, the blocks of one replica that no longer match their
/// checksums (here gone bad while the machines were off) are suspect; the
/// engine that starts on the replicas gives each the copy another replica
/// holds sound, runs of them at a time (`engine/settle.rs`), and a block
/// suspect in both, holding different bytes in each, takes the first
/// replica's bytes in the other, so that both read the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_settles_suspect_blocks_from_the_replica_that_holds_them_sound() {
    let (d0, d1) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let vol = 8u64 << 20;
    let names = ["v-r0", "v-r1"];
    for (d, name) in [(&d0, names[0]), (&d1, names[1])] {
        let dir = replica_dir(d.path(), name);
        Replica::create(&dir, vol).unwrap();
        let mut r = Replica::open(&dir).unwrap();
        write_run(&mut r, 0, vol / (64 * 1024), 7);
        r.flush().unwrap();
    }
    // Bad in v-r0: a run of 300 blocks (more than one copy's worth) and one
    // block apart, flipped; in v-r1: ten blocks inside v-r0's run, other
    // bytes.
    let bad0: Vec<u64> = (64..364).chain([1500]).collect();
    let bad1: Vec<u64> = (100..110).collect();
    for (d, name, bad) in [(&d0, names[0], &bad0), (&d1, names[1], &bad1)] {
        let head = common::head_file(&replica_dir(d.path(), name));
        for &b in bad {
            if name == names[0] {
                common::flip_block(&head, b * BLOCK);
            } else {
                use std::os::unix::fs::FileExt;
                let f = std::fs::OpenOptions::new().write(true).open(&head).unwrap();
                f.write_all_at(&[0x5a; BLOCK as usize], b * BLOCK).unwrap();
            }
        }
        forgetful::as_after_a_reboot(d.path());
    }
    let addrs = [
        common::serve(d0.path(), names[0]).await,
        common::serve(d1.path(), names[1]).await,
    ];
    let engine = common::engine_over(vol, &addrs, None).await;

    let tls = ballast_node::wire::tls::WireTls::default();
    let both_bad = |b: u64| bad1.contains(&b);
    for ((at, bad), still) in addrs.iter().zip([&bad0, &bad1]).zip([bad1.clone(), vec![]]) {
        let c = ballast_node::wire::client::ReplicaClient::dial(&tls, &at.addr, &at.name)
            .await
            .unwrap();
        let suspect: Vec<u64> = c.info().await.unwrap()["suspect"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_u64().unwrap())
            .collect();
        assert_eq!(
            suspect, still,
            "{}: the blocks bad in both stay suspect in the first replica, and are written in the other",
            at.name
        );
        let data = c.read(0, vol as u32).await.unwrap();
        for b in 0..vol / BLOCK {
            let block = &data[(b * BLOCK) as usize..((b + 1) * BLOCK) as usize];
            let sound = pattern(b / 16 * 16 * BLOCK, 7)[(b % 16 * BLOCK) as usize..]
                [..BLOCK as usize]
                .to_vec();
            if both_bad(b) {
                let flipped: Vec<u8> = sound.iter().map(|x| !x).collect();
                assert_eq!(
                    block, flipped,
                    "{}: block {b}, suspect in both, holds the first replica's bytes",
                    at.name
                );
            } else {
                assert_eq!(
                    block,
                    sound,
                    "{}: block {b} (bad here: {})",
                    at.name,
                    bad.contains(&b)
                );
            }
        }
    }
    let whole = engine.read(0, vol as u32).await.unwrap();
    for b in (0..vol / BLOCK).filter(|b| !both_bad(*b)) {
        let sound = pattern(b / 16 * 16 * BLOCK, 7);
        assert_eq!(
            &whole[(b * BLOCK) as usize..((b + 1) * BLOCK) as usize],
            &sound[(b % 16 * BLOCK) as usize..][..BLOCK as usize],
            "the engine reads block {b} sound"
        );
    }
}

/// The volume's one current replica guarded its checksums (its others
/// were dropped: stale) when a power cut came. A block of it gone bad
/// since its last write takes the copy of a stale replica that matches the
/// checksum it kept (`Engine::settle_from_stale`); a block written after
/// the stale replica was left behind, then gone bad, matches no copy and is
/// served as it is (a stale replica that does not answer is passed
/// over); and the replica guards on under the new engine. Had it
/// not guarded, no stale copy is taken, though one matches: the disk's
/// checksum could then be older than a flushed write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suspect_block_of_the_one_current_replica_takes_a_stale_copy_that_matches_its_kept_checksum()
 {
    let vol = 8u64 << 20;
    let (kept_old, written_since) = (5u64, 20u64);
    let sound = |b: u64, round: u8| {
        pattern(b / 16 * 16 * BLOCK, round)[(b % 16 * BLOCK) as usize..][..BLOCK as usize].to_vec()
    };
    for guarded in [true, false] {
        let (d0, d1) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let names = ["v-r0", "v-r1"];
        for (d, name) in [(&d0, names[0]), (&d1, names[1])] {
            let dir = replica_dir(d.path(), name);
            Replica::create(&dir, vol).unwrap();
            let mut r = Replica::open(&dir).unwrap();
            write_run(&mut r, 0, vol / (64 * 1024), 7);
            r.flush().unwrap();
        }
        // v-r1 is left behind; v-r0 goes on alone.
        let dir0 = replica_dir(d0.path(), names[0]);
        let mut r = Replica::open(&dir0).unwrap();
        r.set_sums_every_flush(guarded).unwrap();
        write_run(&mut r, 16 * BLOCK, 1, 8);
        r.flush().unwrap();
        drop(r);
        let head = common::head_file(&dir0);
        for b in [kept_old, written_since] {
            common::flip_block(&head, b * BLOCK);
        }
        forgetful::as_after_a_reboot(d0.path());

        let addrs = [
            common::serve(d0.path(), names[0]).await,
            common::serve(d1.path(), names[1]).await,
        ];
        let engine = common::engine_over(vol, &addrs[..1], None).await;
        // A stale replica whose node does not answer is passed over.
        let gone = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().to_string()
        };
        let stale = [
            ReplicaAddr {
                name: "v-r9".into(),
                addr: gone,
            },
            addrs[1].clone(),
        ];
        let settled = engine.settle_from_stale(&stale).await;
        let read = |b: u64| {
            let engine = engine.clone();
            async move { engine.read(b * BLOCK, BLOCK as u32).await.unwrap().to_vec() }
        };
        let flipped = |v: Vec<u8>| v.iter().map(|x| !x).collect::<Vec<u8>>();
        let tls = ballast_node::wire::tls::WireTls::default();
        let c = ballast_node::wire::client::ReplicaClient::dial(&tls, &addrs[0].addr, names[0])
            .await
            .unwrap();
        if guarded {
            assert_eq!(settled, 1, "the block gone bad since its last write");
            assert_eq!(
                read(kept_old).await,
                sound(kept_old, 7),
                "the stale copy that matches"
            );
            assert_eq!(
                read(written_since).await,
                flipped(sound(written_since, 8)),
                "no copy matches a block written after the stale replica was left: as it is"
            );
            assert_eq!(
                c.info().await.unwrap()["suspect"],
                serde_json::json!([written_since])
            );
            // The guard goes on under the new engine (its own task).
            let mut on = false;
            for _ in 0..100 {
                on = c.info().await.unwrap()["sums_every_flush"] == true;
                if on {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            assert!(
                on,
                "the one current replica guards while a stale one is known"
            );
        } else {
            assert_eq!(settled, 0, "without the guard no checksum was kept");
            assert_eq!(
                read(kept_old).await,
                flipped(sound(kept_old, 7)),
                "served as it is"
            );
            assert_eq!(
                c.info().await.unwrap()["suspect"],
                serde_json::json!([kept_old, written_since])
            );
        }
        // The stale replica is read, never written.
        let c1 = ballast_node::wire::client::ReplicaClient::dial(&tls, &addrs[1].addr, names[1])
            .await
            .unwrap();
        assert_eq!(
            c1.read(written_since * BLOCK, BLOCK as u32)
                .await
                .unwrap()
                .to_vec(),
            sound(written_since, 7)
        );
    }
}

/// Serves the replicas `names` of `d0` and `d1` and starts an engine of a
/// volume of `vol` bytes over them (`local` its node's replica, if any);
/// both must stay rw (`case` names the run in a failure). Returns their
/// addresses, the engine and its status.
async fn engine_over_both(
    d0: &tempfile::TempDir,
    d1: &tempfile::TempDir,
    names: [&str; 2],
    vol: u64,
    local: Option<&str>,
    case: &str,
) -> (
    [ReplicaAddr; 2],
    std::sync::Arc<ballast_node::engine::Engine>,
    Vec<ballast_node::engine::MemberStatus>,
) {
    let addrs = [
        common::serve(d0.path(), names[0]).await,
        common::serve(d1.path(), names[1]).await,
    ];
    let engine = common::engine_over(vol, &addrs, local).await;
    let status = engine.status().await;
    assert!(
        status
            .iter()
            .all(|m| m.mode == ballast::model::ReplicaMode::Rw),
        "{case}: both stay rw: {status:?}"
    );
    (addrs, engine, status)
}

/// Two replicas that hold different writes no flush covered, where their
/// write logs cannot tell (the revisions are the same, or a power cut
/// left the logs unable to say), are made equal as an engine starts, and
/// neither is rebuilt: over the regions either wrote lately, every block
/// whose CRC differs from the keeper's (the first replica at the highest
/// revision) takes the keeper's copy (`engine/equalize.rs`), a block only
/// the other held included. After a crash of the process (the page cache
/// kept), after a power cut whose disks had everything, and after a cut
/// with the other replica a write behind (before, it was rebuilt whole).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_makes_its_replicas_equal_where_they_were_written_lately_with_no_rebuild() {
    const MIB: u64 = 1 << 20;
    for (cut, behind) in [(false, false), (true, false), (true, true)] {
        let case = format!("cut {cut}, the other a write behind {behind}");
        let (d0, d1) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let vol = 8 * MIB;
        let names = ["v-r0", "v-r1"];
        // Both hold the first half (round 7); then r0 writes at 1 MiB and
        // at 6 MiB (round 8), and at 3 MiB when r1 is to be behind; r1 at
        // 2 MiB and at 1 MiB (round 9).
        let mut theirs = vec![vec![(MIB, 8), (6 * MIB, 8)], vec![(2 * MIB, 9), (MIB, 9)]];
        if behind {
            theirs[0].push((3 * MIB, 8));
        }
        let mut revisions = Vec::new();
        for ((d, name), writes) in [(&d0, names[0]), (&d1, names[1])].into_iter().zip(theirs) {
            let dir = replica_dir(d.path(), name);
            Replica::create(&dir, vol).unwrap();
            let mut r = Replica::open(&dir).unwrap();
            write_run(&mut r, 0, vol / 2 / (64 * 1024), 7);
            r.flush().unwrap();
            for (at, round) in writes {
                write_run(&mut r, at, 1, round);
            }
            if cut {
                // Everything reached the disk, the revision and the write
                // log too: the log is not trusted after the cut all the same.
                r.flush().unwrap();
            }
            revisions.push(r.revision());
            drop(r);
            if cut {
                forgetful::as_after_a_reboot(d.path());
            }
        }
        assert_eq!(revisions[0] > revisions[1], behind, "{case}: the revisions");
        let (addrs, _engine, status) = engine_over_both(&d0, &d1, names, vol, None, &case).await;
        let expected = |at: u64| -> Vec<u8> {
            let chunk = 64 * 1024;
            let base = at / chunk * chunk;
            let round = match base {
                b if b == MIB || b == 6 * MIB || (behind && b == 3 * MIB) => 8,
                b if b < vol / 2 => 7,
                _ => return vec![0u8; BLOCK as usize],
            };
            pattern(base, round)[(at - base) as usize..][..BLOCK as usize].to_vec()
        };
        let tls = ballast_node::wire::tls::WireTls::default();
        for at in &addrs {
            let c = ballast_node::wire::client::ReplicaClient::dial(&tls, &at.addr, &at.name)
                .await
                .unwrap();
            let data = c.read(0, vol as u32).await.unwrap();
            for b in 0..vol / BLOCK {
                assert!(
                    data[(b * BLOCK) as usize..][..BLOCK as usize] == expected(b * BLOCK)[..],
                    "{case}: {} block {b} holds the keeper's bytes",
                    at.name
                );
            }
        }
        let r1 = status.iter().find(|m| m.name == names[1]).unwrap();
        assert_eq!(
            r1.rebuild
                .as_ref()
                .map(|r| (r.path.as_str(), r.copied_bytes)),
            Some(("recent-regions", if behind { 4 } else { 3 } * 64 * 1024)),
            "{case}: the writes where they differed, and only those, copied"
        );
    }
}

/// After a power cut a replica the start made equal to the others may
/// keep a lower revision counter than theirs: here it holds the same
/// bytes, written once where the other wrote them twice (a cut can also
/// take its last bumps). As the engine's local replica it is lent all the
/// same, at the counter its server holds, and the volume's writes go
/// straight to its files. Before 2026-12-06 the loan was refused (its
/// files a revision behind the volume's) and the engine served its own
/// node's replica through the server (found by the fault test
/// `every_machine_loses_power_and_one_does_not_come_back`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_power_cut_a_local_replica_made_equal_at_a_lower_revision_is_lent() {
    const MIB: u64 = 1 << 20;
    let (d0, d1) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let vol = 8 * MIB;
    let names = ["v-r0", "v-r1"];
    let mut revisions = Vec::new();
    for (d, name, times) in [(&d0, names[0], 2), (&d1, names[1], 1)] {
        let dir = replica_dir(d.path(), name);
        Replica::create(&dir, vol).unwrap();
        let mut r = Replica::open(&dir).unwrap();
        write_run(&mut r, 0, 4, 7);
        r.flush().unwrap();
        for _ in 0..times {
            write_run(&mut r, MIB, 1, 8);
        }
        r.flush().unwrap();
        revisions.push(r.revision());
        drop(r);
        forgetful::as_after_a_reboot(d.path());
    }
    assert!(revisions[0] > revisions[1], "{revisions:?}");
    let (addrs, engine, _) =
        engine_over_both(&d0, &d1, names, vol, Some(names[1]), "the lower local").await;
    engine
        .lend_local(replica_dir(d1.path(), names[1]), WRITEBACK_EVERY)
        .await
        .unwrap();
    // Lent: its server serves its data to no one else.
    let tls = ballast_node::wire::tls::WireTls::default();
    let other = ballast_node::wire::client::ReplicaClient::dial(&tls, &addrs[1].addr, names[1])
        .await
        .unwrap();
    let refused = other.read(0, BLOCK as u32).await.unwrap_err().to_string();
    assert!(refused.contains("lent to its engine"), "{refused}");
    // The volume's writes reach both replicas, at one revision past the
    // higher counter.
    engine_run(&engine, 2..4, 9).await;
    engine.flush().await.unwrap();
    for at in [0, MIB, 2 * 64 * 1024, 3 * 64 * 1024] {
        let round = match at {
            a if a == MIB => 8,
            a if a < 2 * 64 * 1024 => 7,
            _ => 9,
        };
        let got = engine.read(at, 64 * 1024).await.unwrap();
        assert!(
            got[..] == pattern(at, round)[..],
            "the write at {at} reads back"
        );
    }
    let r0 = ballast_node::wire::client::ReplicaClient::dial(&tls, &addrs[0].addr, names[0])
        .await
        .unwrap();
    let got = r0.read(3 * 64 * 1024, 64 * 1024).await.unwrap();
    assert!(
        got == pattern(3 * 64 * 1024, 9),
        "the other replica has the write"
    );
    assert_eq!(
        r0.info().await.unwrap()["revision"].as_u64(),
        Some(revisions[0] + 2),
        "the writes after the higher counter"
    );
}

/// Where the keeper holds a block bad (it fails its checksum) that another
/// replica holds otherwise, the comparison of the regions written lately
/// leaves the other's copy as it is, copies the rest of the run, and both
/// replicas stay rw: a read of the block gets the sound copy (the engine's
/// repair), rather than the other replica failed and rebuilt from a keeper
/// that cannot give the block.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_the_keeper_holds_bad_stays_as_the_other_holds_it_when_they_are_made_equal() {
    const KIB: u64 = 1024;
    let (d0, d1) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let vol = 8u64 << 20;
    let names = ["v-r0", "v-r1"];
    // Both hold the first half (round 7), flushed. Then r0 writes at 3 and
    // 6 MiB (round 8), ahead of r1, which writes at 512 KiB (round 9).
    let theirs = [vec![(3 << 20, 8), (6 << 20, 8)], vec![(512 * KIB, 9)]];
    for ((d, name), writes) in [(&d0, names[0]), (&d1, names[1])].into_iter().zip(theirs) {
        let dir = replica_dir(d.path(), name);
        Replica::create(&dir, vol).unwrap();
        let mut r = Replica::open(&dir).unwrap();
        write_run(&mut r, 0, vol / 2 / (64 * KIB), 7);
        r.flush().unwrap();
        for (at, round) in writes {
            write_run(&mut r, at, 1, round);
        }
    }
    // In r0, a block of r1's write goes bad (no write of r0's names it).
    let bad = 512 * KIB / BLOCK + 3;
    common::flip_block(
        &common::head_file(&replica_dir(d0.path(), names[0])),
        bad * BLOCK,
    );
    let (addrs, engine, _) = engine_over_both(&d0, &d1, names, vol, None, "").await;
    let tls = ballast_node::wire::tls::WireTls::default();
    let r1 = ballast_node::wire::client::ReplicaClient::dial(&tls, &addrs[1].addr, &addrs[1].name)
        .await
        .unwrap();
    let block = |data: &[u8], b: u64| data[(b * BLOCK) as usize..][..BLOCK as usize].to_vec();
    let of = |at: u64, round: u8, b: u64| block(&pattern(at, round), b - at / BLOCK);
    let held = r1.read(0, vol as u32).await.unwrap();
    for b in 512 * KIB / BLOCK..576 * KIB / BLOCK {
        let want = if b == bad {
            of(512 * KIB, 9, b)
        } else {
            of(512 * KIB, 7, b)
        };
        assert!(
            block(&held, b) == want,
            "r1 block {b}: the keeper's copy, but the bad one its own"
        );
    }
    for b in (3u64 << 20) / BLOCK..(3u64 << 20) / BLOCK + 16 {
        assert!(
            block(&held, b) == of(3 << 20, 8, b),
            "r1 block {b}: the keeper's write"
        );
    }
    assert_eq!(
        engine.read(bad * BLOCK, BLOCK as u32).await.unwrap(),
        of(512 * KIB, 9, bad),
        "the engine reads the block the keeper holds bad as the other holds it"
    );
}

/// A new boot checks only the head's regions written lately
/// (`replica/regions.rs`): a block gone bad in a region no write touched
/// over the last flush intervals fails its reads, as it would
/// without the cut, rather than being taken as suspect; one in a region
/// written since is suspect, as before. A replica without the record of
/// its regions (made before it existed) has its whole head checked.
#[test]
fn a_new_boot_checks_only_the_regions_written_lately() {
    let d = tempfile::tempdir().unwrap();
    let dir = replica_dir(d.path(), "v-r0");
    let region = ballast_node::replica::DIRTY_REGION;
    Replica::create(&dir, 4 * region).unwrap();
    let mut r = Replica::open(&dir).unwrap();
    write_run(&mut r, 0, region / (64 * 1024), 1);
    // Flushes an interval apart with no write in between: the regions go
    // idle, and are cleared.
    for _ in 0..=ballast_node::replica::IDLE_FLUSHES {
        r.flush().unwrap();
        std::thread::sleep(ballast_node::replica::DIRTY_INTERVAL);
    }
    write_run(&mut r, 2 * region, 16, 2);
    drop(r);
    let (quiet, written) = (10, 2 * region / BLOCK + 5);
    let head = common::head_file(&dir);
    for b in [quiet, written] {
        common::flip_block(&head, b * BLOCK);
    }
    forgetful::as_after_a_reboot(d.path());

    let mut r = Replica::open(&dir).unwrap();
    assert_eq!(r.suspects(), vec![written], "only the region written since");
    let mut block = vec![0u8; BLOCK as usize];
    let err = r.read(quiet * BLOCK, &mut block).unwrap_err();
    assert!(
        err.to_string().contains("checksum"),
        "the block gone bad where nothing was written fails its reads: {err}"
    );
    r.read(written * BLOCK, &mut block).unwrap();
    // The replica goes on (a write elsewhere, a flush).
    write_run(&mut r, region, 1, 3);
    r.flush().unwrap();
    drop(r);

    // Without the record, the whole head is checked.
    std::fs::remove_file(dir.join("dirty-regions")).unwrap();
    forgetful::as_after_a_reboot(d.path());
    let r = Replica::open(&dir).unwrap();
    assert_eq!(
        r.suspects(),
        vec![quiet, written],
        "no record of the regions: every block of the head checked"
    );
}

/// After a cut, a write that settles a suspect block is made durable by
/// the next flush, which then rewrites the replica's list of them. On a
/// full disk there is no room for a new list: the flush still succeeds
/// (the list keeps naming the block, which is only taken as suspect again
/// after another cut, and settled again from the current replicas), and a
/// flush with room rewrites it. Before 2026-12-05 every flush of such a
/// replica failed with ENOSPC until space was freed.
#[test]
fn a_flush_that_settles_a_suspect_block_on_a_full_disk_succeeds_and_the_list_follows_with_room() {
    let (_d, fs) = forgetful_disk();
    let dir = replica_dir(&fs.at, "v-r0");
    Replica::create(&dir, 64 * BLOCK).unwrap();
    let mut r = Replica::open(&dir).unwrap();
    write_run(&mut r, 0, 1, 1);
    r.flush().unwrap();
    drop(r);
    common::flip_block(&common::head_file(&dir), 3 * BLOCK);
    forgetful::as_after_a_reboot(&fs.at);
    let mut r = Replica::open(&dir).unwrap();
    assert_eq!(r.suspects(), vec![3]);
    let listed = || std::fs::read_to_string(dir.join("suspect-blocks")).unwrap();
    assert_eq!(listed(), "[3]");

    // The disk filled to its last block.
    let filler = fill::fill_disk(&fs.at);
    let whole = pattern(0, 2);
    r.write(3 * BLOCK, &whole[..BLOCK as usize], None).unwrap();
    r.flush().unwrap();
    assert_eq!(r.suspects(), Vec::<u64>::new());
    assert_eq!(listed(), "[3]", "no room: the list on the disk is kept");
    let mut block = vec![0u8; BLOCK as usize];
    r.read(3 * BLOCK, &mut block).unwrap();
    assert!(block[..] == whole[..BLOCK as usize]);

    // Room again: the next flush rewrites the list.
    std::fs::remove_dir_all(&filler).unwrap();
    r.flush().unwrap();
    assert_eq!(listed(), "[]");
}

/// A power cut while the disk is full: the new boot's open must record
/// the blocks it finds suspect, durably, before it serves, in a new file.
/// Each replica keeps room for it (`room`, 1 MiB allocated at its first
/// open): the open gives that up, records the list and opens; a later
/// open with room makes it again. Before 2026-12-06 such an open failed
/// with ENOSPC until space was freed, and the volume could not attach.
#[test]
fn a_replica_opened_after_a_power_cut_on_a_full_disk_records_its_suspect_blocks_in_the_room_it_kept()
 {
    let (_d, fs) = forgetful_disk();
    let dir = replica_dir(&fs.at, "v-r0");
    Replica::create(&dir, 64 * BLOCK).unwrap();
    let kept = || {
        std::fs::metadata(dir.join(ballast_node::replica::ROOM_FILE))
            .map(|m| std::os::unix::fs::MetadataExt::blocks(&m) * 512)
            .unwrap_or(0)
    };
    assert_eq!(
        kept(),
        ballast_node::replica::ROOM,
        "a new replica keeps its room"
    );
    let mut r = Replica::open(&dir).unwrap();
    write_run(&mut r, 0, 1, 1);
    r.flush().unwrap();
    drop(r);
    common::flip_block(&common::head_file(&dir), 3 * BLOCK);
    let filler = fill::fill_disk(&fs.at);
    forgetful::as_after_a_reboot(&fs.at);

    let r = Replica::open(&dir).expect("opened after a power cut on a full disk");
    assert_eq!(r.suspects(), vec![3]);
    let listed = std::fs::read_to_string(dir.join("suspect-blocks")).unwrap();
    assert_eq!(listed, "[3]", "the list recorded in the room given up");
    assert_eq!(kept(), 0, "no room to make it again on a full disk");
    let mut block = vec![0u8; BLOCK as usize];
    r.read(0, &mut block).unwrap();
    assert!(
        block[..] == pattern(0, 1)[..BLOCK as usize],
        "a sound block reads as written"
    );
    drop(r);

    // Room again: the next open keeps it once more.
    std::fs::remove_dir_all(&filler).unwrap();
    let r = Replica::open(&dir).unwrap();
    assert_eq!(kept(), ballast_node::replica::ROOM);
    assert_eq!(
        r.suspects(),
        vec![3],
        "the block stays suspect until settled"
    );
}
