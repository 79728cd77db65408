//! Closed sets of values that appear in the model, the settings and the
//! StorageClass parameters. Each one parses from and prints to the exact
//! string users type, and knows its accepted values for error messages.

/// Declares a string enum with `as_str`, `FromStr`, `ALL`, `accepted()`
/// and serde as the same strings.
macro_rules! string_enum {
    ($(#[$meta:meta])* $name:ident { $($variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name { $($variant),+ }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];
            pub const NAMES: &'static [&'static str] = &[$($text),+];

            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }

            /// The accepted values, comma separated, for error messages.
            pub fn accepted() -> String {
                Self::NAMES.join(", ")
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl std::str::FromStr for $name {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                match s {
                    $($text => Ok($name::$variant),)+
                    other => Err(format!(
                        "{other:?} is not one of: {}", Self::accepted()
                    )),
                }
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl schemars::JsonSchema for $name {
            fn schema_name() -> std::borrow::Cow<'static, str> {
                stringify!($name).into()
            }
            fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
                schemars::json_schema!({ "type": "string", "enum": Self::NAMES })
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

string_enum!(
    /// Where a volume wants a replica relative to the node using it (seed 003).
    DataLocality {
        Disabled => "disabled",
        BestEffort => "best-effort",
        StrictLocal => "strict-local",
    }
);

string_enum!(
    /// The global auto-balance mode (seed 000).
    AutoBalance {
        Disabled => "disabled",
        LeastEffort => "least-effort",
        BestEffort => "best-effort",
    }
);

string_enum!(
    /// A volume's own auto-balance mode; `ignored` follows the setting.
    VolumeAutoBalance {
        Ignored => "ignored",
        Disabled => "disabled",
        LeastEffort => "least-effort",
        BestEffort => "best-effort",
    }
);

string_enum!(
    /// What a node drain waits for (seed 002).
    NodeDrainPolicy {
        BlockIfContainsLastReplica => "block-if-contains-last-replica",
        AllowIfReplicaIsStopped => "allow-if-replica-is-stopped",
        AlwaysAllow => "always-allow",
        BlockForEviction => "block-for-eviction",
        BlockForEvictionIfContainsLastReplica => "block-for-eviction-if-contains-last-replica",
    }
);

string_enum!(
    /// Health of a volume's replica set.
    Robustness {
        Healthy => "healthy",
        Degraded => "degraded",
        Faulted => "faulted",
        Unknown => "unknown",
    }
);

impl Robustness {
    /// A volume's robustness from how many of its replicas hold its latest
    /// data (`rw`) against how many it wants: healthy with all of them,
    /// degraded with some, faulted with none.
    pub fn of(rw: usize, wanted: usize) -> Robustness {
        if rw >= wanted {
            Robustness::Healthy
        } else if rw > 0 {
            Robustness::Degraded
        } else {
            Robustness::Faulted
        }
    }
}

string_enum!(
    /// Lifecycle of a volume.
    VolumeState {
        Creating => "creating",
        Detached => "detached",
        Attaching => "attaching",
        Attached => "attached",
        Detaching => "detaching",
        Deleting => "deleting",
    }
);

string_enum!(
    /// The I/O mode of a replica in its engine.
    ReplicaMode {
        Rw => "rw",
        Wo => "wo",
        Err => "err",
    }
);

string_enum!(
    /// Whether a replica should be running.
    DesiredState {
        Running => "running",
        Stopped => "stopped",
    }
);

string_enum!(
    /// Filesystem made on a mount volume.
    FsType {
        Ext4 => "ext4",
        Xfs => "xfs",
    }
);

string_enum!(
    /// How a volume may be used by pods.
    AccessMode {
        ReadWriteOnce => "rwo",
        ReadOnlyMany => "rox",
    }
);

string_enum!(
    /// How the engine of an attached volume is exposed.
    Frontend {
        BlockDev => "blockdev",
        Nbd => "nbd",
    }
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_names_accepted_values() {
        for v in NodeDrainPolicy::ALL {
            assert_eq!(v.as_str().parse::<NodeDrainPolicy>(), Ok(*v));
        }
        let err = "sometimes".parse::<DataLocality>().unwrap_err();
        assert!(err.contains("disabled, best-effort, strict-local"), "{err}");
        let json = serde_json::to_string(&AutoBalance::BestEffort).unwrap();
        assert_eq!(json, "\"best-effort\"");
    }
}
