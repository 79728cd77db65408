//! One volume's replicas, sorted into what matters for planning, and the
//! effective modes of the volume (its own, or the settings').

use ballast::model::{AutoBalance, DataLocality, Robustness, VolumeAutoBalance};

use super::pass::Pass;
use super::view::{ReplicaView, VolumeView};

pub struct VolumeState<'a> {
    pub volume: &'a VolumeView,
    pub all: Vec<&'a ReplicaView>,
    pub rw: Vec<&'a ReplicaView>,
    pub rebuilding: Vec<&'a ReplicaView>,
    pub failed: Vec<&'a ReplicaView>,
    /// No replica has ever held data: a new volume.
    pub is_new: bool,
    pub locality: DataLocality,
    pub balance: AutoBalance,
    /// The volume's place in the view, when it was found by place: its
    /// replicas' `Facts` are then `pass.facts_at(place)`.
    pub place: Option<usize>,
}

impl<'a> VolumeState<'a> {
    pub fn new(pass: &Pass<'a>, volume: &'a VolumeView) -> Self {
        Self::of(pass, volume, pass.replicas_of(&volume.name), None)
    }

    /// The state of `view.volumes[i]`, found by place rather than name.
    pub fn at(pass: &Pass<'a>, i: usize) -> Self {
        let volume = &pass.view.volumes[i];
        Self::of(pass, volume, pass.replicas_at(i), Some(i))
    }

    fn of(
        pass: &Pass<'a>,
        volume: &'a VolumeView,
        replicas: &[&'a ReplicaView],
        place: Option<usize>,
    ) -> Self {
        let all: Vec<&ReplicaView> = replicas.to_vec();
        let mut rw = Vec::with_capacity(all.len());
        let mut rebuilding = Vec::new();
        let mut failed = Vec::new();
        for r in &all {
            // A replica may be rw and failed at once (a failure not yet
            // seen by its mode): it is in both lists.
            if r.is_rw() {
                rw.push(*r);
            }
            if r.is_failed() {
                failed.push(*r);
            }
            if r.is_rebuilding() {
                rebuilding.push(*r);
            }
        }
        let locality = volume.data_locality.unwrap_or(pass.default_locality);
        let balance = match volume.auto_balance {
            VolumeAutoBalance::Ignored => pass.default_balance,
            VolumeAutoBalance::Disabled => AutoBalance::Disabled,
            VolumeAutoBalance::LeastEffort => AutoBalance::LeastEffort,
            VolumeAutoBalance::BestEffort => AutoBalance::BestEffort,
        };
        VolumeState {
            volume,
            is_new: !all.iter().any(|r| r.held_data()),
            all,
            rw,
            rebuilding,
            failed,
            locality,
            balance,
            place,
        }
    }

    pub fn wanted(&self) -> usize {
        self.volume.number_of_replicas as usize
    }

    /// rw and rebuilding replicas.
    pub fn usable(&self) -> impl Iterator<Item = &'a ReplicaView> + '_ {
        self.rw.iter().chain(self.rebuilding.iter()).copied()
    }

    /// Usable replicas that are staying (not asked to leave).
    pub fn keep<'p>(&'p self, pass: &'p Pass<'a>) -> impl Iterator<Item = &'a ReplicaView> + 'p {
        self.usable()
            .filter(move |r| !pass.evicting.contains(&r.name))
    }

    pub fn robustness(&self) -> Robustness {
        let rw = self.rw.len();
        if rw == 0 && self.is_new && self.wanted() > 0 {
            Robustness::Unknown
        } else {
            Robustness::of(rw, self.wanted())
        }
    }

    pub fn object(&self) -> String {
        format!("volume/{}", self.volume.name)
    }

    /// The attached node, when data locality wants a replica there.
    pub fn local_node(&self) -> Option<&'a str> {
        match self.locality {
            DataLocality::BestEffort | DataLocality::StrictLocal => {
                self.volume.attached_node.as_deref()
            }
            DataLocality::Disabled => None,
        }
    }
}
