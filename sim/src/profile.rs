//! Where a benchmark's wall time goes, by kind of step: the agent handling each kind of input
//! (`in:`), the simulated shell executing each kind of effect (`exec:`). Off unless asked for
//! (`bench --by-kind`): reading the clock twice a step costs about as much as a cheap step.
//!
//! Wall time per step is what it is on this host and at this fleet size; compare kinds within a
//! run, and one size against another, not against a number written down elsewhere.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Which side of the simulation a step is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Side {
    /// The agent handles an input (`Input::kind_name`).
    Handle,
    /// The simulated shell executes an effect (`Op::kind_name`).
    Execute,
}

/// Steps counted and nanoseconds spent, by side and kind.
#[derive(Clone, Debug, Default)]
pub struct StepProfile {
    by_kind: BTreeMap<(Side, &'static str), KindTotals>,
}

#[derive(Clone, Copy, Debug, Default)]
struct KindTotals {
    steps: u64,
    nanos: u64,
}

impl StepProfile {
    /// Add one step of `kind` that began at `started`.
    pub fn add(&mut self, side: Side, kind: &'static str, started: Instant) {
        let nanos = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let totals = self.by_kind.entry((side, kind)).or_default();
        totals.steps += 1;
        totals.nanos = totals.nanos.saturating_add(nanos);
    }

    /// One line per kind, costliest first: steps, total milliseconds, nanoseconds per step,
    /// share of the time in steps. Then, with the run's `wall` time, where the whole run went:
    /// the agent's steps, the simulator's, and the rest (its queue, checks and scripting).
    pub fn table(&self, wall: Option<Duration>) -> Vec<String> {
        let total_nanos: u64 = self.by_kind.values().map(|t| t.nanos).sum::<u64>().max(1);
        let mut rows: Vec<_> = self.by_kind.iter().collect();
        rows.sort_by(|a, b| b.1.nanos.cmp(&a.1.nanos).then(a.0.cmp(b.0)));
        let mut lines = vec![format!("{:<26}{:>12}{:>12}{:>12}{:>8}", "step", "count", "ms", "ns/step", "share")];
        for ((side, kind), t) in rows {
            lines.push(format!(
                "{:<26}{:>12}{:>12}{:>12}{:>7.1}%",
                format!("{}:{kind}", side.prefix()),
                t.steps,
                t.nanos / 1_000_000,
                t.nanos / t.steps.max(1),
                t.nanos as f64 * 100.0 / total_nanos as f64
            ));
        }
        if let Some(wall) = wall {
            lines.extend(self.split(wall));
        }
        lines
    }

    /// The run's wall time split between the agent's steps, the simulator's and the rest.
    fn split(&self, wall: Duration) -> Vec<String> {
        let wall_nanos = u64::try_from(wall.as_nanos()).unwrap_or(u64::MAX).max(1);
        let on = |side: Side| self.by_kind.iter().filter(|((s, _), _)| *s == side).map(|(_, t)| t.nanos).sum::<u64>();
        let (agent, simulator) = (on(Side::Handle), on(Side::Execute));
        let rest = wall_nanos.saturating_sub(agent + simulator);
        let line = |what: &str, nanos: u64| {
            format!("{what:<50}{:>12}{:>7.1}%", nanos / 1_000_000, nanos as f64 * 100.0 / wall_nanos as f64)
        };
        vec![
            format!("{:<50}{:>12}{:>8}", "of the run's wall time", "ms", "share"),
            line("the agent handling inputs (in:)", agent),
            line("the simulator executing effects (exec:)", simulator),
            line("the rest (event queue, checks, scenario)", rest),
        ]
    }
}

impl Side {
    fn prefix(self) -> &'static str {
        match self {
            Side::Handle => "in",
            Side::Execute => "exec",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_counts_each_kind_and_puts_the_costliest_first() {
        let mut p = StepProfile::default();
        let long_ago = Instant::now() - std::time::Duration::from_millis(5);
        p.add(Side::Handle, "tick", Instant::now());
        p.add(Side::Handle, "tick", Instant::now());
        p.add(Side::Execute, "publish", long_ago);
        let table = p.table(None);
        assert_eq!(table.len(), 3, "{table:?}");
        assert!(table[1].starts_with("exec:publish") && table[1].contains(" 1 "), "{table:?}");
        assert!(table[2].starts_with("in:tick") && table[2].contains(" 2 "), "{table:?}");
        assert!(p.by_kind[&(Side::Execute, "publish")].nanos >= 5_000_000);
    }

    #[test]
    fn the_split_gives_the_wall_time_left_outside_the_steps_to_the_rest() {
        let mut p = StepProfile::default();
        p.by_kind.insert((Side::Handle, "tick"), KindTotals { steps: 3, nanos: 20_000_000 });
        p.by_kind.insert((Side::Execute, "publish"), KindTotals { steps: 1, nanos: 50_000_000 });
        let table = p.table(Some(Duration::from_millis(100)));
        assert_eq!(table.len(), 3 + 4, "{table:?}");
        let ms_and_share = |line: &str| line.split_whitespace().rev().take(2).collect::<Vec<_>>().join(" ");
        assert_eq!(ms_and_share(&table[4]), "20.0% 20", "{table:?}");
        assert_eq!(ms_and_share(&table[5]), "50.0% 50", "{table:?}");
        assert_eq!(ms_and_share(&table[6]), "30.0% 30", "{table:?}");
        // Steps that add up to more than the wall (a clock read late) leave the rest at zero.
        let over = p.table(Some(Duration::from_millis(60)));
        assert_eq!(ms_and_share(&over[6]), "0.0% 0", "{over:?}");
    }
}
