//! `model-agent-sim`: run scenarios, swarms and trace replays. See `model-agent-sim help`.

use std::process::ExitCode;

use model_agent_sim::scenario::{self, Options, Report};
use model_agent_sim::world::AgentKind;

const HELP: &str = "\
model-agent-sim: deterministic simulation of a fleet running the model agent's core

USAGE:
  model-agent-sim scenario NAME [--nodes N] [--models M] [--seed S] [--agent core|upstream|both]
                                [--json] [--svg FILE]
  model-agent-sim swarm --seeds K [--seed FIRST] [--nodes N] [--models M] [--json] [--dump-traces DIR]
                        [--keep-going]
  model-agent-sim replay FILE [--check] [--svg FILE]
  model-agent-sim bench [--nodes N] [--models M] [--agent core|upstream|both] [--json] [--by-kind]
                        (crd-ssa wall time and events/s, both agents; --json adds each report,
                        --by-kind the wall time of each kind of step)
  model-agent-sim list

Scenarios: crd-ssa, apiserver-outage, stale-relist, unsynced-empty, delete-recreate, read-failures,
real-mass-delete, shutdown-mid-storm, readonly-root, stale-read, node-label-wipe, label-collision,
shared-copy.

A scenario exits 1 when the core shows damage or an invariant fails (the upstream model's damage
is reported, not failed). A swarm exits 1 at the first failing seed and prints the command that
replays it (with --keep-going it runs every seed and lists the failing ones). `replay --check` exits 1 when the core's effects differ from the recorded ones.

--svg FILE draws a timeline on one axis in seconds: for a scenario, one band per agent (one row
per node, damage to live models as marks); for `replay`, the trace's node and one row per model
(its state over time, its reads, label writes and removals).";

struct Args(Vec<String>);

impl Args {
    fn flag(&mut self, name: &str) -> bool {
        match self.0.iter().position(|a| a == name) {
            Some(i) => {
                self.0.remove(i);
                true
            }
            None => false,
        }
    }

    fn value(&mut self, name: &str) -> Result<Option<String>, String> {
        match self.0.iter().position(|a| a == name) {
            Some(i) if i + 1 < self.0.len() => {
                let v = self.0.remove(i + 1);
                self.0.remove(i);
                Ok(Some(v))
            }
            Some(_) => Err(format!("{name} needs a value")),
            None => Ok(None),
        }
    }

    fn number<T: std::str::FromStr>(&mut self, name: &str) -> Result<Option<T>, String> {
        self.value(name)?.map(|v| v.parse().map_err(|_| format!("{name}: not a number: {v}"))).transpose()
    }

    fn done(&self) -> Result<(), String> {
        match self.0.first() {
            Some(extra) => Err(format!("unexpected argument {extra:?}")),
            None => Ok(()),
        }
    }
}

fn main() -> ExitCode {
    let mut args = Args(std::env::args().skip(1).collect());
    let command = if args.0.is_empty() { "help".to_string() } else { args.0.remove(0) };
    let result = match command.as_str() {
        "scenario" => cmd_scenario(args),
        "swarm" => cmd_swarm(args),
        "replay" => cmd_replay(args),
        "bench" => cmd_bench(args),
        "list" => {
            scenario::SCENARIOS.iter().for_each(|s| println!("{s}"));
            Ok(true)
        }
        "help" | "--help" | "-h" => {
            println!("{HELP}");
            Ok(true)
        }
        other => Err(format!("unknown command {other:?}\n\n{HELP}")),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("model-agent-sim: {e}");
            ExitCode::from(2)
        }
    }
}

fn cmd_scenario(mut args: Args) -> Result<bool, String> {
    if args.0.is_empty() {
        return Err("scenario needs a NAME".into());
    }
    let name = args.0.remove(0);
    let json = args.flag("--json");
    let svg = args.value("--svg")?;
    let agent = args.value("--agent")?.unwrap_or_else(|| "core".into());
    let base = Options {
        nodes: args.number("--nodes")?.unwrap_or(10),
        models: args.number("--models")?.unwrap_or(50),
        seed: args.number("--seed")?.unwrap_or(1),
        timeline: svg.is_some(),
        ..Options::default()
    };
    args.done()?;
    let agents = match agent.as_str() {
        "core" => vec![AgentKind::Core],
        "upstream" => vec![AgentKind::Upstream],
        "both" => vec![AgentKind::Core, AgentKind::Upstream],
        other => return Err(format!("--agent must be core, upstream or both, not {other:?}")),
    };
    let mut reports = Vec::new();
    let mut timelines = Vec::new();
    for agent in agents {
        let opts = Options { agent, ..base.clone() };
        let started = std::time::Instant::now();
        let (mut report, world) = scenario::run(&name, &opts)?;
        report.extra.insert("wall_ms".into(), (started.elapsed().as_millis() as u64).into());
        timelines.push((world.marks.unwrap_or_default(), world.now));
        reports.push(report);
    }
    if let Some(path) = &svg {
        let runs: Vec<_> =
            reports.iter().zip(&timelines).map(|(r, (marks, now))| (r, marks.as_slice(), *now)).collect();
        let picture = model_agent_sim::svg::render(&model_agent_sim::svg::scenario_timeline(&runs));
        std::fs::write(path, picture).map_err(|e| format!("{path}: {e}"))?;
    }
    if json {
        for r in &reports {
            println!("{}", serde_json::to_string(r).expect("report serialises"));
        }
    } else {
        print_table(&reports);
    }
    Ok(reports.iter().all(|r| r.agent != AgentKind::Core || r.clean()))
}

fn print_table(reports: &[Report]) {
    let r0 = &reports[0];
    println!("scenario {}: {} nodes, {} models, seed {}", r0.scenario, r0.nodes, r0.models, r0.seed);
    let row = |name: &str, f: &dyn Fn(&Report) -> String| {
        let cells: Vec<String> = reports.iter().map(|r| format!("{:>14}", f(r))).collect();
        println!("  {name:<32}{}", cells.join(""));
    };
    row("agent", &|r| r.agent.as_str().to_string());
    row("label removals of live models", &|r| r.label_removals_live.to_string());
    row("entry removals of live models", &|r| r.entry_removals_live.to_string());
    row("weights of live models removed", &|r| r.dir_removals_live.to_string());
    row("phantom deletes suppressed", &|r| r.phantom_deletes_suppressed.to_string());
    row("live GETs", &|r| r.api_get.to_string());
    row("live LISTs", &|r| r.api_list.to_string());
    row("cleanups done / expected", &|r| format!("{}/{}", r.cleanups_done, r.cleanups_expected));
    row("invariant violations", &|r| r.invariant_violation_count.to_string());
    row("virtual seconds", &|r| format!("{:.0}", r.virtual_seconds));
    for k in r0.extra.keys() {
        row(k, &|r| r.extra.get(k).map(|v| v.to_string()).unwrap_or_default());
    }
    for r in reports {
        for v in r.invariant_violations.iter().take(5) {
            println!("  [{}] {v}", r.agent.as_str());
        }
        // The core's history before its first violation (the upstream model's damage is expected).
        if r.agent == AgentKind::Core {
            r.history.iter().for_each(|line| println!("  [core] {line}"));
        }
    }
}

fn cmd_swarm(mut args: Args) -> Result<bool, String> {
    let seeds: u64 = args.number("--seeds")?.unwrap_or(50);
    let first: u64 = args.number("--seed")?.unwrap_or(0);
    let nodes = args.number("--nodes")?;
    let models = args.number("--models")?;
    let json = args.flag("--json");
    let dump = args.value("--dump-traces")?;
    let keep_going = args.flag("--keep-going");
    args.done()?;
    let started = std::time::Instant::now();
    let mut failed = Vec::new();
    for seed in first..first + seeds {
        let (report, world, knobs) = scenario::swarm_run(seed, nodes, models);
        if let Some(dir) = &dump {
            world
                .write_traces(std::path::Path::new(dir), &format!("seed-{seed}"))
                .map_err(|e| format!("{dir}: {e}"))?;
        }
        if !report.clean() {
            let mut cmd = format!("model-agent-sim swarm --seeds 1 --seed {seed}");
            if let Some(n) = nodes {
                cmd.push_str(&format!(" --nodes {n}"));
            }
            if let Some(m) = models {
                cmd.push_str(&format!(" --models {m}"));
            }
            println!("FAILED seed {seed} (knobs {})", serde_json::to_string(&knobs).expect("knobs serialise"));
            for v in report.invariant_violations.iter().take(20) {
                println!("  {v}");
            }
            for line in &report.history {
                println!("  {line}");
            }
            println!("replay: {cmd}");
            failed.push(seed);
            if !keep_going {
                return Ok(false);
            }
            continue;
        }
        if json {
            println!("{}", serde_json::to_string(&report).expect("report serialises"));
        }
    }
    let secs = started.elapsed().as_secs_f64();
    if !failed.is_empty() {
        println!("swarm: {} of {seeds} seeds from {first} failed in {secs:.1} s: {failed:?}", failed.len());
        return Ok(false);
    }
    println!("swarm: {seeds} seeds from {first} passed in {secs:.1} s");
    Ok(true)
}

/// The simulator's benchmark: `crd-ssa` on a large fleet, both agents, with wall time, events per
/// second and live reads per node.
fn cmd_bench(mut args: Args) -> Result<bool, String> {
    let nodes = args.number("--nodes")?.unwrap_or(1000);
    let models = args.number("--models")?.unwrap_or(1000);
    let json = args.flag("--json");
    let by_kind = args.flag("--by-kind");
    let agents = match args.value("--agent")?.as_deref().unwrap_or("both") {
        "core" => vec![AgentKind::Core],
        "upstream" => vec![AgentKind::Upstream],
        "both" => vec![AgentKind::Core, AgentKind::Upstream],
        other => return Err(format!("--agent must be core, upstream or both, not {other:?}")),
    };
    args.done()?;
    println!("crd-ssa, {nodes} nodes x {models} models, seed 1");
    println!(
        "{:<10}{:>10}{:>14}{:>16}{:>16}{:>18}",
        "agent", "wall s", "sim events", "events/s", "reads/node", "live removals"
    );
    let mut ok = true;
    for agent in agents {
        let opts = Options {
            nodes,
            models,
            seed: 1,
            agent,
            audit_every_step: false,
            profile_steps: by_kind,
            ..Options::default()
        };
        let started = std::time::Instant::now();
        let (r, world) = scenario::run("crd-ssa", &opts)?;
        let elapsed = started.elapsed();
        let wall = elapsed.as_secs_f64();
        let profile = world.profile.as_ref().map(|p| p.table(Some(elapsed))).unwrap_or_default();
        // Freeing a million-model world is teardown, not the scenario: it is left out of the wall.
        drop(world);
        println!(
            "{:<10}{:>10.2}{:>14}{:>16.0}{:>16.2}{:>18}",
            agent.as_str(),
            wall,
            r.events_processed,
            r.events_processed as f64 / wall,
            (r.api_get + r.api_list) as f64 / nodes as f64,
            r.label_removals_live + r.entry_removals_live + r.dir_removals_live
        );
        ok &= agent != AgentKind::Core || r.clean();
        if json {
            // The counts to compare before and after a change to the simulator (not the wall time).
            println!("{}", serde_json::to_string(&r).expect("report serialises"));
        }
        profile.iter().for_each(|line| println!("  {line}"));
    }
    Ok(ok)
}

fn cmd_replay(mut args: Args) -> Result<bool, String> {
    let check = args.flag("--check");
    let svg = args.value("--svg")?;
    if args.0.is_empty() {
        return Err("replay needs a FILE".into());
    }
    let path = args.0.remove(0);
    args.done()?;
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    let trace = model_agent_core::trace::parse(&text).map_err(|e| format!("{path}: {e}"))?;
    if let Some(out) = &svg {
        let timeline = model_agent_sim::svg::trace::timeline(&trace, &path);
        std::fs::write(out, model_agent_sim::svg::render(&timeline)).map_err(|e| format!("{out}: {e}"))?;
        if !check {
            // The picture is what was asked for: the trace is drawn as recorded, not re-run.
            return Ok(true);
        }
    }
    let (effects, divergence) = model_agent_core::trace::replay(&trace);
    for (i, (step, effects)) in trace.steps.iter().zip(&effects).enumerate() {
        println!("{}", serde_json::json!({"step": i, "now": step.now, "effects": effects}));
    }
    match (check, divergence) {
        (true, Some(d)) => {
            eprintln!("replay differs at step {}:\n  recorded: {}\n  replayed: {}", d.step, d.recorded, d.replayed);
            Ok(false)
        }
        (true, None) => {
            eprintln!("replay matches: {} steps", trace.steps.len());
            Ok(true)
        }
        _ => Ok(true),
    }
}

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
