//! The pace of a copy that rebuilds a replica over the network: the
//! volume's own `replicaRebuildRate` when it sets one, else the setting
//! for the way the copy is made (`replica-rebuild-rate` through an
//! attached volume's engine, `offline-copy-rate` node to node). Pure: the
//! actions read the volume and the settings and carry the result to the
//! node.

use std::fmt;

use ballast::model::VolumeSpec;
use ballast::settings::{OFFLINE_COPY_RATE, REPLICA_REBUILD_RATE, Settings};

/// How a replica is filled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Way {
    /// By the attached volume's engine.
    Engine,
    /// Node to node, the volume detached (or a restore).
    Offline,
}

/// A copy's pace: bytes per second (0: no limit) and what set it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pace {
    pub bytes_per_second: u64,
    /// The volume's field or the setting that gave the rate.
    pub from: &'static str,
}

/// The pace of a copy filling a replica of `spec` the given way.
pub fn pace(spec: &VolumeSpec, settings: &Settings, way: Way) -> Pace {
    if spec.replica_rebuild_rate > 0 {
        return Pace {
            bytes_per_second: spec.replica_rebuild_rate << 20,
            from: "the volume's replicaRebuildRate",
        };
    }
    match way {
        Way::Engine => Pace {
            bytes_per_second: settings.replica_rebuild_rate_bytes(),
            from: REPLICA_REBUILD_RATE,
        },
        Way::Offline => Pace {
            bytes_per_second: settings.offline_copy_rate_bytes(),
            from: OFFLINE_COPY_RATE,
        },
    }
}

impl fmt::Display for Pace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.bytes_per_second {
            0 => write!(f, "no limit ({} 0)", self.from),
            b => write!(f, "at most {} MiB/s ({})", b >> 20, self.from),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The volume's rate, when set, wins over the setting of either way;
    /// unset, each way follows its own setting, 0 being no limit.
    #[test]
    fn the_volumes_rate_wins_and_each_way_follows_its_setting_otherwise() {
        let settings = |engine: &str, offline: &str| {
            Settings::from_overrides([(REPLICA_REBUILD_RATE, engine), (OFFLINE_COPY_RATE, offline)])
        };
        let spec = |rate: u64| {
            let mut s = VolumeSpec::new(1 << 30, 2);
            s.replica_rebuild_rate = rate;
            s
        };
        for (volume, engine, offline, way, want, from) in [
            (0, "0", "0", Way::Engine, 0, REPLICA_REBUILD_RATE),
            (0, "100", "7", Way::Engine, 100, REPLICA_REBUILD_RATE),
            (0, "100", "7", Way::Offline, 7, OFFLINE_COPY_RATE),
            (
                200,
                "0",
                "0",
                Way::Engine,
                200,
                "the volume's replicaRebuildRate",
            ),
            (
                200,
                "100",
                "7",
                Way::Offline,
                200,
                "the volume's replicaRebuildRate",
            ),
            (
                50,
                "100",
                "0",
                Way::Engine,
                50,
                "the volume's replicaRebuildRate",
            ),
        ] {
            let p = pace(&spec(volume), &settings(engine, offline), way);
            assert_eq!(
                p,
                Pace {
                    bytes_per_second: want << 20,
                    from
                },
                "volume {volume}, settings {engine} / {offline}, {way:?}"
            );
        }
        let p = pace(&spec(0), &settings("0", "0"), Way::Offline);
        assert_eq!(p.to_string(), "no limit (offline-copy-rate 0)");
        let p = pace(&spec(50), &settings("0", "0"), Way::Engine);
        assert_eq!(
            p.to_string(),
            "at most 50 MiB/s (the volume's replicaRebuildRate)"
        );
    }
}
