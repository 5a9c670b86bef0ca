//! Where a benchmark's wall time goes, by kind of step: the agent handling each kind of input,
//! the simulated shell executing each kind of effect. Off unless asked for (`bench --by-kind`):
//! reading the clock twice a step costs about as much as a cheap step.
//!
//! Wall time per step is what it is on this host and at this fleet size; compare kinds within a
//! run, and one size against another, not against a number written down elsewhere.

use std::collections::BTreeMap;
use std::time::Instant;

use model_agent_core::machine::{Input, Op, WatchEvent};

/// Steps counted and nanoseconds spent, by kind.
#[derive(Clone, Debug, Default)]
pub struct StepProfile {
    by_kind: BTreeMap<&'static str, KindTotals>,
}

#[derive(Clone, Copy, Debug, Default)]
struct KindTotals {
    steps: u64,
    nanos: u64,
}

impl StepProfile {
    /// Add one step of `kind` that began at `started`.
    pub fn add(&mut self, kind: &'static str, started: Instant) {
        let nanos = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let totals = self.by_kind.entry(kind).or_default();
        totals.steps += 1;
        totals.nanos = totals.nanos.saturating_add(nanos);
    }

    /// One line per kind: steps, total milliseconds, nanoseconds per step, share of the total.
    pub fn table(&self) -> Vec<String> {
        let total_nanos: u64 = self.by_kind.values().map(|t| t.nanos).sum::<u64>().max(1);
        let mut rows: Vec<_> = self.by_kind.iter().collect();
        rows.sort_by(|a, b| b.1.nanos.cmp(&a.1.nanos).then(a.0.cmp(b.0)));
        let mut lines = vec![format!("{:<22}{:>12}{:>12}{:>12}{:>8}", "step", "count", "ms", "ns/step", "share")];
        for (kind, t) in rows {
            lines.push(format!(
                "{kind:<22}{:>12}{:>12}{:>12}{:>7.1}%",
                t.steps,
                t.nanos / 1_000_000,
                t.nanos / t.steps.max(1),
                t.nanos as f64 * 100.0 / total_nanos as f64
            ));
        }
        lines
    }
}

/// The kind of an input, as the table names it (`in:` for what the agent handles).
pub fn input_kind(input: &Input) -> &'static str {
    match input {
        Input::Watch { event, .. } => match event {
            WatchEvent::Applied(_) => "in:watch-applied",
            WatchEvent::Deleted(_) => "in:watch-deleted",
            WatchEvent::RelistStarted => "in:relist-started",
            WatchEvent::RelistItem(_) => "in:relist-item",
            WatchEvent::RelistDone => "in:relist-done",
        },
        Input::NodeObserved(_) => "in:node-observed",
        Input::LiveRead { .. } => "in:live-read",
        Input::LiveList { .. } => "in:live-list",
        Input::NodeRead { .. } => "in:node-read",
        Input::EffectDone { .. } => "in:effect-done",
        Input::RootProbed { .. } => "in:root-probed",
        Input::DriftObserved { .. } => "in:drift-observed",
        Input::DownloadProgress { .. } => "in:download-progress",
        Input::Tick => "in:tick",
        Input::Shutdown => "in:shutdown",
    }
}

/// The kind of an effect, as the table names it (`exec:` for what the simulated shell does).
pub fn op_kind(op: &Op) -> &'static str {
    match op {
        Op::LiveGet { .. } => "exec:live-get",
        Op::LiveList { .. } => "exec:live-list",
        Op::LiveGetNode => "exec:live-get-node",
        Op::Publish { .. } => "exec:publish",
        Op::Unpublish { .. } => "exec:unpublish",
        Op::VerifyLocal { .. } => "exec:verify-local",
        Op::Download { .. } => "exec:download",
        Op::Resolve { .. } => "exec:resolve",
        Op::Link { .. } => "exec:link",
        Op::Unlink { .. } => "exec:unlink",
        Op::FillSpec { .. } => "exec:fill-spec",
        Op::CancelDownload { .. } => "exec:cancel-download",
        Op::TrashDir { .. } => "exec:trash-dir",
        Op::PurgeTrash { .. } => "exec:purge-trash",
        Op::RemoveOrphanLabel { .. } => "exec:remove-orphan-label",
        Op::RemoveOrphanEntry { .. } => "exec:remove-orphan-entry",
        Op::ProbeRoot => "exec:probe-root",
        Op::Snapshot => "exec:snapshot",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_counts_each_kind_and_puts_the_costliest_first() {
        let mut p = StepProfile::default();
        let long_ago = Instant::now() - std::time::Duration::from_millis(5);
        p.add("in:tick", Instant::now());
        p.add("in:tick", Instant::now());
        p.add("exec:publish", long_ago);
        let table = p.table();
        assert_eq!(table.len(), 3, "{table:?}");
        assert!(table[1].starts_with("exec:publish") && table[1].contains(" 1 "), "{table:?}");
        assert!(table[2].starts_with("in:tick") && table[2].contains(" 2 "), "{table:?}");
        assert!(p.by_kind["exec:publish"].nanos >= 5_000_000);
    }

    #[test]
    fn every_input_and_op_has_a_kind_of_its_own_family() {
        assert_eq!(input_kind(&Input::Tick), "in:tick");
        assert_eq!(op_kind(&Op::Snapshot), "exec:snapshot");
        assert!(input_kind(&Input::Shutdown).starts_with("in:"));
        assert!(op_kind(&Op::ProbeRoot).starts_with("exec:"));
    }
}
