//! CSI names and lists: the id of a volume or a snapshot for the name a CO
//! gave it (any string), and the pages of a paged list call. Shared by the
//! volume and the snapshot RPCs; calls nothing.

use crate::error::Error;

/// Longest name CreateVolume accepts: the CSI spec's limit on the strings
/// a CO sends.
pub const MAX_CSI_NAME: usize = 128;

/// The id for a CO's name of a volume or a snapshot, which may be any
/// string.
/// A name that is already a valid volume name is its own id (Kubernetes
/// sends `pvc-<uuid>`). Any other becomes the lower-cased letters and
/// digits of its start, runs of other characters as one '-', then '-' and
/// 16 hex digits of the name's hash: readable in `kubectl get`, and the
/// same id for the same name every time.
pub fn id_for(name: &str) -> String {
    if ballast::model::validate_name(name).is_ok() && name.len() <= crate::volumes::MAX_NAME {
        return name.to_string();
    }
    let hash = blake3::hash(name.as_bytes()).to_hex();
    let mut readable = String::new();
    for c in name.chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            readable.push(c);
        } else if !readable.is_empty() && !readable.ends_with('-') {
            readable.push('-');
        }
        // Room for '-' and the hash within the longest volume name.
        if readable.len() >= crate::volumes::MAX_NAME - 17 {
            break;
        }
    }
    let readable = readable.trim_end_matches('-');
    match readable {
        "" => format!("vol-{}", &hash[..16]),
        r => format!("{r}-{}", &hash[..16]),
    }
}

/// Checks a CO's name of a volume or a snapshot: 1 to 128 bytes.
pub fn check_name(name: &str) -> Result<(), Error> {
    if name.is_empty() {
        return Err(Error::invalid("name", "is required"));
    }
    if name.len() > MAX_CSI_NAME {
        return Err(Error::invalid(
            "name",
            format!(
                "is {} bytes long; at most {MAX_CSI_NAME} are accepted",
                name.len()
            ),
        ));
    }
    Ok(())
}

/// The page of `all` a paged list call asks for, and the token of the next
/// (empty at the end). The token is the index of the next entry; one this
/// plugin did not give is ABORTED.
pub fn page<'a, T>(
    all: &'a [T],
    max_entries: i32,
    starting_token: &str,
) -> Result<(&'a [T], String), Error> {
    if max_entries < 0 {
        return Err(Error::invalid("max_entries", "must not be negative"));
    }
    let start = if starting_token.is_empty() {
        0
    } else {
        starting_token
            .parse::<usize>()
            .ok()
            .filter(|i| *i <= all.len())
            .ok_or_else(|| {
                Error::Conflict(format!(
                    "starting_token {starting_token:?} is not one this plugin gave"
                ))
            })?
    };
    let end = match max_entries {
        0 => all.len(),
        n => (start + n as usize).min(all.len()),
    };
    let next = if end < all.len() {
        end.to_string()
    } else {
        String::new()
    };
    Ok((&all[start..end], next))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_follow_their_tokens_to_the_end_and_refuse_a_foreign_one() {
        let all: Vec<u32> = (0..5).collect();
        let (first, next) = page(&all, 2, "").unwrap();
        assert_eq!((first, next.as_str()), (&[0, 1][..], "2"));
        let (second, next) = page(&all, 2, &next).unwrap();
        assert_eq!((second, next.as_str()), (&[2, 3][..], "4"));
        let (last, next) = page(&all, 2, &next).unwrap();
        assert_eq!((last, next.as_str()), (&[4][..], ""));
        assert_eq!(page(&all, 0, "").unwrap().0.len(), 5);
        assert!(matches!(page(&all, 0, "6"), Err(Error::Conflict(_))));
        assert!(matches!(page(&all, 0, "x"), Err(Error::Conflict(_))));
        assert!(matches!(page(&all, -1, ""), Err(Error::Invalid { .. })));
    }

    #[test]
    fn any_co_name_maps_to_a_stable_valid_volume_id() {
        // Kubernetes' names are their own ids.
        assert_eq!(id_for("pvc-0a1b2c"), "pvc-0a1b2c");
        let long = format!("PVC-Upper_Case.with.dots-{}", "x".repeat(128 - 25));
        assert_eq!(long.len(), 128);
        for name in [
            long.as_str(),
            "Upper",
            "sanity-Node-Stage-1F2E",
            "-_.",
            "ünïcødé name",
            &"a".repeat(54),
        ] {
            let id = id_for(name);
            ballast::model::validate_name(&id).unwrap_or_else(|e| panic!("{name:?}: {e}"));
            assert!(id.len() <= crate::volumes::MAX_NAME, "{id}");
            assert_eq!(id_for(name), id, "stable");
        }
        assert!(id_for(&long).starts_with("pvc-upper-case-with-dots-xx"));
        assert_eq!(id_for("-_.").len(), "vol-".len() + 16);
        // Names that differ only in case or punctuation get different ids.
        assert_ne!(id_for("Data.1"), id_for("data-1"));
        assert_ne!(id_for("Data.1"), id_for("data_1"));
    }
}
