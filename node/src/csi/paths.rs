//! Where the node plugin may mount: below the kubelet's directory
//! (`--kubelet-dir`) and its own state directory, nowhere else. A staging
//! or target path is refused, naming its field, when it is relative, has
//! a `.` or `..` component, or leads (through symlinks) outside those
//! roots. It owns only the check; the mounts are `node.rs`'s.

use std::path::{Component, Path, PathBuf};

use crate::error::Error;

/// The directories below which CSI paths may lie.
#[derive(Clone, Debug)]
pub struct Confinement {
    roots: Vec<PathBuf>,
}

impl Confinement {
    pub fn new(roots: impl IntoIterator<Item = PathBuf>) -> Self {
        Confinement {
            roots: roots.into_iter().map(|r| resolve(&r)).collect(),
        }
    }

    /// `path` of request field `field`, when it lies below a root.
    pub fn check(&self, field: &str, path: &str) -> Result<PathBuf, Error> {
        let refuse = |why: String| Error::Invalid {
            field: field.into(),
            message: format!("{path:?} {why}"),
        };
        let p = Path::new(path);
        if !p.is_absolute() {
            return Err(refuse("is not an absolute path".into()));
        }
        if p.components()
            .any(|c| matches!(c, Component::ParentDir | Component::CurDir))
        {
            return Err(refuse("has a '.' or '..' component".into()));
        }
        let real = resolve(p);
        if !self.roots.iter().any(|r| real.starts_with(r)) {
            let roots: Vec<String> = self.roots.iter().map(|r| r.display().to_string()).collect();
            return Err(refuse(format!(
                "is outside the directories this node plugin may mount in: {} (--kubelet-dir and --state-dir)",
                roots.join(", ")
            )));
        }
        Ok(p.to_path_buf())
    }
}

/// `p` with its longest existing ancestor's symlinks resolved; the rest,
/// which does not exist yet, is appended as it is.
fn resolve(p: &Path) -> PathBuf {
    let mut rest = Vec::new();
    let mut at = p;
    loop {
        if let Ok(real) = at.canonicalize() {
            return rest.iter().rev().fold(real, |acc, c| acc.join(c));
        }
        match (at.parent(), at.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_os_string());
                at = parent;
            }
            _ => return p.to_path_buf(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(e: Error) -> String {
        match e {
            Error::Invalid { field, message } => format!("{field}: {message}"),
            e => panic!("not InvalidArgument: {e}"),
        }
    }

    #[test]
    fn only_paths_below_a_root_pass() {
        let d = tempfile::tempdir().unwrap();
        let kubelet = d.path().join("kubelet");
        let state = d.path().join("state");
        std::fs::create_dir_all(kubelet.join("pods")).unwrap();
        std::fs::create_dir_all(&state).unwrap();
        let outside = d.path().join("etc");
        std::fs::create_dir_all(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, kubelet.join("pods/escape")).unwrap();
        let c = Confinement::new([kubelet.clone(), state.clone()]);
        let s = |p: &Path| p.display().to_string();

        for ok in [kubelet.join("pods/a/mount"), state.join("x/y")] {
            assert_eq!(c.check("target_path", &s(&ok)).unwrap(), ok);
        }
        let cases = [
            ("relative/path".to_string(), "not an absolute path"),
            (s(&kubelet.join("pods/../../etc")), "'..'"),
            (s(&outside.join("passwd")), "outside"),
            ("/".to_string(), "outside"),
            (s(&kubelet.join("pods/escape/mount")), "outside"),
            (format!("{}-other/x", s(&kubelet)), "outside"),
        ];
        for (path, why) in cases {
            let e = field_of(c.check("staging_target_path", &path).unwrap_err());
            assert!(e.starts_with("staging_target_path: "), "{e}");
            assert!(e.contains(why), "{path}: {e}");
        }
    }
}
