//! The node's disks: which directories they are, their identity file
//! `<disk>/ballast-disk.json`, and their usage (statvfs).
//!
//! A disk's id is chosen once, when the node first sees the directory, and
//! written into the identity file; it follows the directory from then on,
//! whatever the order of the `--disk` flags.
//!
//! The node also keeps its own record of every disk it opened, in its
//! state directory (`<state-dir>/disks/<id>.json`: id, uuid, path). A
//! directory that held a disk and has no identity file now is that disk,
//! missing, not a new one: a filesystem that did not mount after a reboot
//! leaves its mount point empty, and taking it as new would put replicas
//! on the root filesystem. The missing disk is not ready until its
//! identity file is back, or until that record is deleted.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use ballast::proto::agent::v1::{DiskIdentity, DiskStatus};
use serde::{Deserialize, Serialize};

use crate::error::Error;

/// The identity file's name, at the root of every disk.
pub const IDENTITY_FILE: &str = "ballast-disk.json";

/// `--disk <path>[:tag1,tag2]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskArg {
    pub path: PathBuf,
    pub tags: Vec<String>,
}

impl std::str::FromStr for DiskArg {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (path, tags) = match s.split_once(':') {
            Some((p, t)) => (p, t),
            None => (s, ""),
        };
        if path.is_empty() {
            return Err(format!("{s:?}: expected <path>[:tag1,tag2]"));
        }
        let tags: Vec<String> = tags
            .split(',')
            .filter(|t| !t.is_empty())
            .map(str::to_string)
            .collect();
        Ok(DiskArg {
            path: PathBuf::from(path),
            tags,
        })
    }
}

/// What `ballast-disk.json` holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskIdentityFile {
    pub id: String,
    pub uuid: String,
    pub created: chrono::DateTime<chrono::Utc>,
}

/// Available bytes are reported in steps of this much.
pub const ROUND: u64 = 16 << 20;

/// The node's record of a disk it opened (`<state-dir>/disks/<id>.json`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Seen {
    id: String,
    uuid: String,
    path: PathBuf,
}

/// An opened disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Disk {
    pub id: String,
    pub uuid: String,
    pub path: PathBuf,
    pub tags: Vec<String>,
    /// The node's record of it (deleted, the directory may be taken as a
    /// new disk).
    pub record: PathBuf,
}

impl Disk {
    pub fn identity(&self) -> DiskIdentity {
        DiskIdentity {
            id: self.id.clone(),
            uuid: self.uuid.clone(),
            path: self.path.display().to_string(),
            tags: self.tags.clone(),
        }
    }

    /// The sum of the sizes of the replicas on this disk.
    pub fn scheduled(&self) -> u64 {
        let Ok(entries) = std::fs::read_dir(self.path.join("replicas")) else {
            return 0;
        };
        entries
            .flatten()
            .filter_map(|e| crate::replica::Meta::read(&e.path()).ok())
            .map(|m| m.size)
            .sum()
    }

    /// Why the directory does not hold this disk now (its identity file
    /// is gone, or names another disk); None when it does.
    pub fn not_here(&self) -> Option<String> {
        match read_identity(&self.path) {
            Ok(Some(f)) if f.uuid == self.uuid => None,
            Ok(Some(f)) => Some(format!(
                "{IDENTITY_FILE} now names disk {} ({}), not {} ({})",
                f.id, f.uuid, self.id, self.uuid
            )),
            Ok(None) => Some(format!(
                "{IDENTITY_FILE} is missing: is the disk's filesystem mounted at {}? \
                 To take the directory as a new, empty disk, delete {} and restart the node plugin",
                self.path.display(),
                self.record.display()
            )),
            Err(e) => Some(e.to_string()),
        }
    }

    /// Measures the disk now. A disk whose identity file is gone or names
    /// another disk is not ready, and says why.
    pub fn status(&self) -> DiskStatus {
        let mut status = DiskStatus {
            id: self.id.clone(),
            path: self.path.display().to_string(),
            ..Default::default()
        };
        if let Some(why) = self.not_here() {
            status.message = why;
            return status;
        }
        match nix::sys::statvfs::statvfs(&self.path) {
            Ok(st) => {
                let frag = st.fragment_size();
                status.storage_maximum = st.blocks() * frag;
                // Rounded down, so that a few writes do not change the
                // node's record on every heartbeat.
                status.storage_available = st.blocks_available() * frag / ROUND * ROUND;
                status.storage_scheduled = self.scheduled();
                status.ready = true;
            }
            Err(e) => status.message = format!("statvfs: {e}"),
        }
        status
    }
}

fn read_identity(dir: &Path) -> Result<Option<DiskIdentityFile>, Error> {
    let path = dir.join(IDENTITY_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| Error::disk(dir, format!("{IDENTITY_FILE} is unreadable: {e}"))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::disk(
            dir,
            format!("cannot read {IDENTITY_FILE}: {e}"),
        )),
    }
}

/// Writes the identity file crash-safely: temp file, fsync, rename.
fn write_identity(dir: &Path, f: &DiskIdentityFile) -> Result<(), Error> {
    let body = serde_json::to_vec_pretty(f).map_err(|e| Error::disk(dir, e.to_string()))?;
    crate::replica::write_durably(dir, IDENTITY_FILE, &body)
        .map_err(|e| Error::disk(dir, format!("cannot write {IDENTITY_FILE}: {e}")))
}

/// The disk's directory, canonical; an error naming it when it is missing
/// or not a directory.
pub fn dir_of(arg: &DiskArg) -> Result<PathBuf, Error> {
    let path = std::fs::canonicalize(&arg.path)
        .map_err(|e| Error::disk(&arg.path, format!("cannot open: {e}")))?;
    if !path.is_dir() {
        return Err(Error::disk(&path, "is not a directory"));
    }
    Ok(path)
}

/// The node's records of the disks it opened, in `dir`; an error naming a
/// record that cannot be read (its protection would be lost unseen).
fn read_seen(dir: &Path) -> Result<Vec<Seen>, Error> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => {
            return Err(Error::disk(
                dir,
                format!("cannot read the disk records: {e}"),
            ));
        }
    };
    let mut seen = Vec::new();
    for e in entries.flatten() {
        let path = e.path();
        if path.extension().and_then(|x| x.to_str()) != Some("json") {
            continue;
        }
        let parsed = std::fs::read(&path)
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice::<Seen>(&b).map_err(|e| e.to_string()));
        seen.push(parsed.map_err(|e| {
            Error::disk(
                &path,
                format!(
                    "this disk record is unreadable ({e}); delete it to open the disks without it"
                ),
            )
        })?);
    }
    Ok(seen)
}

/// Opens every disk: checks the directories, reads their identity files,
/// and writes one (with a new id `disk-N`) on each disk seen for the first
/// time. `records` holds the node's records of the disks it opened: a
/// directory that held one of them and has no identity file now is that
/// disk, missing (not ready), never a new one.
pub fn open_disks(args: &[DiskArg], records: &Path) -> Result<Vec<Disk>, Error> {
    if args.is_empty() {
        return Err(Error::Invalid {
            field: "--disk".into(),
            message: "at least one --disk <path> is required".into(),
        });
    }
    let mut seen_paths = BTreeSet::new();
    let mut found = Vec::new();
    for arg in args {
        let path = dir_of(arg)?;
        if !seen_paths.insert(path.clone()) {
            return Err(Error::disk(&path, "is given twice"));
        }
        found.push((arg, path.clone(), read_identity(&path)?));
    }
    let mut used: BTreeSet<String> = BTreeSet::new();
    for (_, path, f) in &found {
        if let Some(f) = f
            && !used.insert(f.id.clone())
        {
            return Err(Error::disk(
                path,
                format!(
                    "its {IDENTITY_FILE} claims id {}, which another disk of this node has (a copied disk?)",
                    f.id
                ),
            ));
        }
    }
    // A directory without an identity file that held a disk of the node's
    // records, nowhere among these now: that disk, missing.
    let seen = read_seen(records)?;
    let present: BTreeSet<&str> = found
        .iter()
        .filter_map(|(_, _, f)| f.as_ref().map(|f| f.uuid.as_str()))
        .collect();
    let missing: Vec<Option<&Seen>> = found
        .iter()
        .map(|(_, path, f)| {
            seen.iter().find(|s| {
                f.is_none()
                    && s.path == *path
                    && !present.contains(s.uuid.as_str())
                    && !used.contains(&s.id)
            })
        })
        .collect();
    used.extend(missing.iter().flatten().map(|s| s.id.clone()));
    std::fs::create_dir_all(records).map_err(|e| {
        Error::disk(
            records,
            format!("cannot make the disk records' directory: {e}"),
        )
    })?;
    let mut disks = Vec::new();
    for ((arg, path, f), gone) in found.iter().zip(&missing) {
        let (id, uuid) = match (f, gone) {
            (Some(f), _) => (f.id.clone(), f.uuid.clone()),
            (None, Some(s)) => {
                tracing::warn!(disk = %s.id, path = %path.display(),
                    "the directory held this disk and has no identity file now: not taken as a new disk");
                (s.id.clone(), s.uuid.clone())
            }
            (None, None) => {
                let id = (1..)
                    .map(|n| format!("disk-{n}"))
                    .find(|id| !used.contains(id))
                    .unwrap_or_default();
                used.insert(id.clone());
                let f = DiskIdentityFile {
                    id,
                    uuid: uuid::Uuid::new_v4().to_string(),
                    created: chrono::Utc::now(),
                };
                write_identity(path, &f)?;
                tracing::info!(disk = %f.id, path = %path.display(), "new disk: wrote its identity file");
                (f.id, f.uuid)
            }
        };
        let record = records.join(format!("{id}.json"));
        // A missing disk's record stays as it was.
        if gone.is_none() {
            let seen = Seen {
                id: id.clone(),
                uuid: uuid.clone(),
                path: path.clone(),
            };
            let body = serde_json::to_vec_pretty(&seen)
                .map_err(|e| Error::disk(&record, e.to_string()))?;
            crate::replica::write_durably(records, &format!("{id}.json"), &body)
                .map_err(|e| Error::disk(&record, format!("cannot write the disk record: {e}")))?;
        }
        disks.push(Disk {
            id,
            uuid,
            path: path.clone(),
            tags: arg.tags.clone(),
            record,
        });
    }
    Ok(disks)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The node's disk records, beside the disks in the test's directory.
    fn records(root: &tempfile::TempDir) -> PathBuf {
        root.path().join("state/disks")
    }

    fn arg(p: &Path) -> DiskArg {
        DiskArg {
            path: p.to_path_buf(),
            tags: vec![],
        }
    }

    #[test]
    fn parses_disk_flags() {
        let d: DiskArg = "/data/a:ssd,fast".parse().unwrap();
        assert_eq!(d.path, PathBuf::from("/data/a"));
        assert_eq!(d.tags, ["ssd", "fast"]);
        assert!("".parse::<DiskArg>().is_err());
    }

    #[test]
    fn first_sight_writes_identity_and_ids_follow_the_directory() {
        let root = tempfile::tempdir().unwrap();
        let (a, b) = (root.path().join("a"), root.path().join("b"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        let first = open_disks(&[arg(&a), arg(&b)], &records(&root)).unwrap();
        assert_eq!(first[0].id, "disk-1");
        assert_eq!(first[1].id, "disk-2");
        assert!(a.join(IDENTITY_FILE).exists());
        // Flags in the other order: same ids, same uuids.
        let again = open_disks(&[arg(&b), arg(&a)], &records(&root)).unwrap();
        assert_eq!(again[0].id, "disk-2");
        assert_eq!(again[0].uuid, first[1].uuid);
        assert_eq!(again[1].id, "disk-1");
    }

    #[test]
    fn status_measures_and_turns_not_ready_without_identity() {
        let root = tempfile::tempdir().unwrap();
        let disks = open_disks(&[arg(root.path())], &records(&root)).unwrap();
        let s = disks[0].status();
        assert!(s.ready, "{}", s.message);
        assert!(s.storage_maximum > 0 && s.storage_available <= s.storage_maximum);
        assert_eq!(s.storage_available % ROUND, 0, "available is rounded");
        assert_eq!(s.storage_scheduled, 0);
        for (name, size) in [("v-r1", 8 << 20), ("w-r1", 4 << 20)] {
            crate::replica::Replica::create(&root.path().join("replicas").join(name), size)
                .unwrap();
        }
        assert_eq!(disks[0].status().storage_scheduled, 12 << 20);
        std::fs::remove_file(root.path().join(IDENTITY_FILE)).unwrap();
        let s = disks[0].status();
        assert!(!s.ready);
        assert!(s.message.contains("missing"), "{}", s.message);
    }

    #[test]
    fn bad_disks_are_refused_with_the_reason() {
        let root = tempfile::tempdir().unwrap();
        let missing = root.path().join("nope");
        let e = open_disks(&[arg(&missing)], &records(&root))
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot open"), "{e}");
        let e = open_disks(&[arg(root.path()), arg(root.path())], &records(&root))
            .unwrap_err()
            .to_string();
        assert!(e.contains("given twice"), "{e}");
        let e = open_disks(&[], &records(&root)).unwrap_err().to_string();
        assert!(e.contains("--disk"), "{e}");
        // A copied disk: two directories whose identity files claim one id.
        let (a, b) = (root.path().join("a"), root.path().join("b"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        open_disks(&[arg(&a)], &records(&root)).unwrap();
        std::fs::copy(a.join(IDENTITY_FILE), b.join(IDENTITY_FILE)).unwrap();
        let e = open_disks(&[arg(&a), arg(&b)], &records(&root))
            .unwrap_err()
            .to_string();
        assert!(e.contains("another disk"), "{e}");
    }

    #[test]
    fn a_directory_that_held_a_disk_and_has_no_identity_now_is_that_disk_missing_not_a_new_one() {
        let root = tempfile::tempdir().unwrap();
        let (a, away) = (root.path().join("a"), root.path().join("a-unmounted"));
        std::fs::create_dir_all(&a).unwrap();
        let first = open_disks(&[arg(&a)], &records(&root)).unwrap();
        assert!(first[0].status().ready);
        // Its filesystem not mounted: the mount point is an empty directory.
        std::fs::rename(&a, &away).unwrap();
        std::fs::create_dir_all(&a).unwrap();
        let again = open_disks(&[arg(&a)], &records(&root)).unwrap();
        assert_eq!(
            (&again[0].id, &again[0].uuid),
            (&first[0].id, &first[0].uuid)
        );
        assert!(!a.join(IDENTITY_FILE).exists(), "taken as a new disk");
        let s = again[0].status();
        assert!(!s.ready);
        let record = records(&root).join("disk-1.json");
        assert!(
            s.message.contains("is the disk's filesystem mounted")
                && s.message.contains(&record.display().to_string()),
            "{}",
            s.message
        );
        // Mounted again: ready, the same disk.
        std::fs::remove_dir(&a).unwrap();
        std::fs::rename(&away, &a).unwrap();
        assert!(again[0].status().ready);
        // A new, empty disk in its place: taken once the record is deleted.
        std::fs::remove_file(a.join(IDENTITY_FILE)).unwrap();
        assert!(
            open_disks(&[arg(&a)], &records(&root)).unwrap()[0]
                .not_here()
                .is_some()
        );
        std::fs::remove_file(&record).unwrap();
        let new = open_disks(&[arg(&a)], &records(&root)).unwrap();
        assert_eq!(new[0].id, "disk-1");
        assert_ne!(new[0].uuid, first[0].uuid);
        assert!(new[0].status().ready);
        // An unreadable record is named, not passed over.
        std::fs::write(&record, b"{").unwrap();
        let e = open_disks(&[arg(&a)], &records(&root))
            .unwrap_err()
            .to_string();
        assert!(e.contains("disk-1.json") && e.contains("unreadable"), "{e}");
    }
}
