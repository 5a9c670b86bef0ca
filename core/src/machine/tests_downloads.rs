//! Downloads in flight: progress in the entry, the commit in `config.artifact`, cancellation by
//! a confirmed delete or a changed plan, and the source's own retry delay.

use super::tests::*;
use super::*;

/// A node with `hf("m", "u1")` whose Updating publish has landed and whose download is in
/// flight (not answered): the harness and the download's id.
fn downloading() -> (H, EffectId) {
    let mut h = H::new();
    let effects = h.start(true, vec![hf("m", "u1")]);
    let dl = first_download(&mut h, effects);
    (h, dl.id)
}

/// The first download `effects` lead to, their publishes answered.
fn first_download(h: &mut H, mut effects: Vec<Effect>) -> Effect {
    for _ in 0..10 {
        if let Some(dl) = effects.iter().find(|e| matches!(e.op, Op::Download { .. })) {
            return dl.clone();
        }
        let publishes: Vec<EffectId> =
            effects.iter().filter(|e| matches!(e.op, Op::Publish { .. })).map(|e| e.id).collect();
        effects =
            publishes.into_iter().flat_map(|id| h.input(Input::EffectDone { id, outcome: Outcome::Done })).collect();
    }
    panic!("no download");
}

fn progress(completed_bytes: i64) -> wire::DownloadProgress {
    wire::DownloadProgress {
        phase: "downloading".into(),
        total_bytes: 100,
        completed_bytes,
        total_files: 2,
        completed_files: 1,
        speed_bytes_per_sec: 12.5,
        last_updated: "2026-12-03T10:00:00Z".into(),
    }
}

fn ended(marked: bool, result: DownloadResult) -> Outcome {
    Outcome::Downloaded(DownloadEnd { marked, result })
}

fn entries(effects: &[Effect]) -> Vec<(Option<ModelStatus>, wire::ModelEntry)> {
    effects
        .iter()
        .filter_map(|e| match &e.op {
            Op::Publish { label, entry, .. } => Some((*label, (**entry).clone())),
            _ => None,
        })
        .collect()
}

fn cancels(effects: &[Effect]) -> Vec<EffectId> {
    effects
        .iter()
        .filter_map(|e| match e.op {
            Op::CancelDownload { download } => Some(download),
            _ => None,
        })
        .collect()
}

fn confirm_delete(h: &mut H) -> Vec<Effect> {
    let e = h.watch(Kind::ClusterBaseModel, WatchEvent::Deleted(hf("m", "u1").into()));
    h.input(Input::LiveRead { id: one_get(&e), result: ReadResult::NotFound })
}

#[test]
fn progress_goes_into_the_entry_and_ready_carries_the_commit_and_no_progress() {
    let (mut h, dl) = downloading();
    let e = h.input(Input::DownloadProgress { id: dl, progress: progress(50) });
    let p = entries(&e);
    assert_eq!(p.len(), 1, "{e:?}");
    let (label, entry) = &p[0];
    assert_eq!(*label, None, "the label stays Updating: only the entry changes");
    assert_eq!(entry.status, ModelStatus::Updating);
    assert_eq!(entry.progress, Some(progress(50)));
    assert_eq!(entry.uid.as_deref(), Some("u1"));
    let commit = "a".repeat(40);
    let e = h.input(Input::EffectDone {
        id: dl,
        outcome: ended(true, DownloadResult::Done { commit: commit.clone(), metadata: None, bytes: 0 }),
    });
    let p = entries(&e);
    assert_eq!(p.len(), 1, "{e:?}");
    let (label, entry) = &p[0];
    assert_eq!((*label, entry.status), (Some(ModelStatus::Ready), ModelStatus::Ready));
    assert_eq!(entry.progress, None, "cleared on Ready");
    let artifact = &entry.config.as_ref().expect("config.artifact").artifact;
    assert_eq!(artifact.sha, commit);
    let parent = artifact.parent_path.clone().unwrap();
    assert_eq!(parent.into_iter().collect::<Vec<_>>(), vec![("clusterbasemodel.m".into(), "/mnt/models/m".into())]);
    assert_eq!(artifact.children_paths, Some(vec![]));
    // A late report of the finished download publishes nothing.
    assert!(entries(&h.input(Input::DownloadProgress { id: dl, progress: progress(100) })).is_empty());
}

#[test]
fn a_confirmed_delete_cancels_the_download_and_trashes_only_after_it_stopped() {
    let (mut h, dl) = downloading();
    let e = confirm_delete(&mut h);
    assert_eq!(cancels(&e), vec![dl]);
    assert!(destructive(&e).is_empty(), "nothing is removed while the download runs: {e:?}");
    assert!(entries(&h.input(Input::DownloadProgress { id: dl, progress: progress(60) })).is_empty());
    assert!(cancels(&h.advance(60_000)).is_empty(), "cancelled once");
    let e = h.input(Input::EffectDone { id: dl, outcome: ended(true, DownloadResult::Cancelled) });
    let all = h.settle(e);
    let ops = destructive(&all);
    assert!(matches!(ops[..], [Op::Unpublish { .. }, Op::TrashDir { path, .. }] if path == "m"), "{ops:?}");
    assert_eq!(h.s.model_count(), 0);
}

#[test]
fn a_cancelled_download_that_never_marked_its_directory_trashes_nothing() {
    let (mut h, dl) = downloading();
    confirm_delete(&mut h);
    let e = h.input(Input::EffectDone { id: dl, outcome: ended(false, DownloadResult::Cancelled) });
    let all = h.settle(e);
    let ops = destructive(&all);
    assert!(matches!(ops[..], [Op::Unpublish { .. }]), "{ops:?}");
    assert_eq!(h.s.model_count(), 0);
}

#[test]
fn a_phantom_delete_does_not_cancel_a_download() {
    let (mut h, dl) = downloading();
    let e = h.watch(Kind::ClusterBaseModel, WatchEvent::Deleted(hf("m", "u1").into()));
    assert!(cancels(&e).is_empty(), "a candidate is not evidence");
    let e = h.input(Input::LiveRead { id: one_get(&e), result: ReadResult::Found(hf("m", "u1").into()) });
    assert!(cancels(&e).is_empty() && destructive(&e).is_empty(), "{e:?}");
    assert_eq!(entries(&h.input(Input::DownloadProgress { id: dl, progress: progress(70) })).len(), 1);
}

#[test]
fn a_changed_storage_uri_cancels_and_downloads_the_new_one() {
    let (mut h, dl) = downloading();
    let moved = obj(&ModelKey::cluster("m"), "u1", "hf://org/other", Some("/mnt/models/m"));
    let e = h.apply(moved);
    assert_eq!(cancels(&e), vec![dl]);
    assert!(!e.iter().any(|e| matches!(e.op, Op::Download { .. })), "one download at a time");
    let e = h.input(Input::EffectDone { id: dl, outcome: ended(true, DownloadResult::Cancelled) });
    let all = h.settle(e);
    let uris: Vec<&str> = all
        .iter()
        .filter_map(|e| match &e.op {
            Op::Download { storage_uri, .. } => Some(storage_uri.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(uris, vec!["hf://org/other"]);
    assert!(destructive(&all).is_empty(), "{all:?}");
}

#[test]
fn the_source_s_retry_delay_is_honoured_when_longer_than_the_backoff() {
    let (mut h, dl) = downloading();
    let reason = "hf://org/repo is gated: request access".to_string();
    let result = DownloadResult::Failed { reason: reason.clone(), retry_after_ms: Some(300_000) };
    let e = h.input(Input::EffectDone { id: dl, outcome: ended(false, result) });
    assert_eq!(published(&e), vec![(ModelStatus::Failed, Some(reason))]);
    h.settle(e);
    let mut retried_at = None;
    for t in (10_000..=300_000).step_by(10_000) {
        let e = h.advance(10_000);
        let e = h.settle(e);
        if e.iter().any(|e| matches!(e.op, Op::Download { .. })) {
            retried_at = Some(t);
            break;
        }
    }
    assert_eq!(retried_at, Some(300_000), "not before the source's delay, and then at once");
}

/// A retry delay that takes the clock to its end (`Instant(u64::MAX)`): the record keeps the
/// instant one earlier (`WordOption`), and the timer set must hold that same instant, or the
/// entry outlives the record (`H` checks `invariants()` after every input).
#[test]
fn a_retry_delay_that_saturates_the_clock_keeps_the_timer_and_the_record_in_step() {
    let (mut h, dl) = downloading();
    let result = DownloadResult::Failed { reason: "later".into(), retry_after_ms: Some(u64::MAX) };
    let e = h.input(Input::EffectDone { id: dl, outcome: ended(false, result) });
    h.settle(e);
    for _ in 0..3 {
        let e = h.advance(10_000);
        let e = h.settle(e);
        assert!(!e.iter().any(|e| matches!(e.op, Op::Download { .. })), "no retry before the source's delay");
        assert_eq!(h.s.invariants(), Ok(()));
    }
}

#[test]
fn only_a_download_sent_before_the_first_snapshot_keeps_the_uids_its_marker_named() {
    let keeps_marked = |snapshot_first: bool| {
        let mut h = H::new();
        let mut effects = h.start(true, vec![hf("m", "u1")]);
        if snapshot_first {
            let id = snapshot_request(&effects);
            effects.extend(h.input(Input::DriftObserved { id, snapshot: DriftSnapshot::default() }));
        }
        match first_download(&mut h, effects).op {
            Op::Download { keep_marked, .. } => keep_marked,
            _ => unreachable!("a download"),
        }
    };
    assert!(keeps_marked(false), "the core does not know what the marker names yet");
    assert!(!keeps_marked(true), "once it knows, the marker names exactly the owners it gives");
}

#[test]
fn a_revalidation_after_a_restart_keeps_the_ready_label_and_publishes_no_progress() {
    let mut h = H::new();
    let label = wire::label_key(&ModelKey::cluster("m"));
    let e = h.start_on(node(&[(label.as_str(), "Ready")]), true, vec![hf("m", "u1")]);
    let dl = e.iter().find(|e| matches!(e.op, Op::Download { .. })).expect("revalidated at once").id;
    assert!(published(&e).is_empty(), "no Updating first: {e:?}");
    assert!(entries(&h.input(Input::DownloadProgress { id: dl, progress: progress(10) })).is_empty());
}

fn qwen() -> wire::ModelConfig {
    wire::ModelConfig {
        model_type: "qwen2".into(),
        model_architecture: "Qwen2ForCausalLM".into(),
        model_parameter_size: "1.09B".into(),
        max_tokens: 32768,
        model_capabilities: vec!["TEXT_TO_TEXT".into()],
        ..wire::ModelConfig::default()
    }
}

#[test]
fn a_download_with_metadata_publishes_it_beside_the_artifact() {
    let (mut h, dl) = downloading();
    let metadata = Some(Box::new(qwen()));
    let done = DownloadResult::Done { commit: "c".repeat(40), metadata, bytes: 0 };
    let p = entries(&h.input(Input::EffectDone { id: dl, outcome: ended(true, done) }));
    let config = p[0].1.config.clone().expect("config");
    assert_eq!((config.model_type.as_str(), config.max_tokens), ("qwen2", 32768));
    assert_eq!(config.artifact.sha, "c".repeat(40), "the artifact is the core's, whatever the metadata says");
    assert_eq!(config.artifact.children_paths, Some(vec![]));
}

/// A `local://` model whose check is in flight: the harness and the check's effect.
fn verifying(o: ModelObject) -> (H, Effect) {
    let mut h = H::new();
    let mut effects = h.start(true, vec![o]);
    for _ in 0..10 {
        if let Some(v) = effects.iter().find(|e| matches!(e.op, Op::VerifyLocal { .. })) {
            return (h, v.clone());
        }
        let publishes: Vec<EffectId> =
            effects.iter().filter(|e| matches!(e.op, Op::Publish { .. })).map(|e| e.id).collect();
        effects =
            publishes.into_iter().flat_map(|id| h.input(Input::EffectDone { id, outcome: Outcome::Done })).collect();
    }
    panic!("no check");
}

#[test]
fn a_local_check_asks_for_metadata_and_publishes_it_with_an_empty_artifact_as_ome_does() {
    let (mut h, check) = verifying(local("m", "u1"));
    assert!(matches!(check.op, Op::VerifyLocal { parse_metadata: true, .. }), "{check:?}");
    let done = DownloadResult::Done { commit: String::new(), metadata: Some(Box::new(qwen())), bytes: 0 };
    let p = entries(&h.input(Input::EffectDone { id: check.id, outcome: ended(false, done) }));
    let (label, entry) = &p[0];
    assert_eq!(*label, Some(ModelStatus::Ready));
    let config = entry.config.clone().expect("config");
    assert_eq!(config.model_architecture, "Qwen2ForCausalLM");
    assert_eq!(config.artifact, wire::Artifact::default(), "sha \"\", parentPath and childrenPaths null");
    assert_eq!(h.view(&ModelKey::cluster("m"), "u1").owned_dir, None, "a check never owns the directory");
}

#[test]
fn a_plain_done_for_a_check_publishes_ready_without_config() {
    let (mut h, check) = verifying(local("m", "u1"));
    let p = entries(&h.input(Input::EffectDone { id: check.id, outcome: Outcome::Done }));
    assert_eq!((p[0].0, p[0].1.config.clone()), (Some(ModelStatus::Ready), None));
}

#[test]
fn metadata_larger_than_the_cap_is_dropped_and_the_model_is_ready_without_it() {
    let (mut h, check) = verifying(local("m", "u1"));
    let huge = wire::ModelConfig { model_type: "x".repeat(wire::MODEL_CONFIG_BYTES_MAX), ..qwen() };
    assert!(!wire::model_config_fits(&huge) && wire::model_config_fits(&qwen()));
    let done = DownloadResult::Done { commit: String::new(), metadata: Some(Box::new(huge)), bytes: 0 };
    let p = entries(&h.input(Input::EffectDone { id: check.id, outcome: ended(false, done) }));
    assert_eq!((p[0].0, p[0].1.config.clone()), (Some(ModelStatus::Ready), None));
}

#[test]
fn the_skip_annotation_asks_for_no_metadata() {
    let mut o = local("m", "u1");
    let mut spec = (**o.spec.as_ref().unwrap()).clone();
    spec.skip_config_parsing = true;
    o.spec = Ok(Arc::new(spec));
    let (_, check) = verifying(o);
    assert!(matches!(check.op, Op::VerifyLocal { parse_metadata: false, .. }), "{check:?}");
}

/// A `local://` model Ready with metadata under `config`: the harness, and what the Ready
/// publish's landing asked for.
fn ready_with_metadata(config: Config) -> (H, Vec<Effect>) {
    let mut h = H::with(config);
    let mut effects = h.start(true, vec![local("m", "u1")]);
    for _ in 0..10 {
        let mut next = Vec::new();
        for e in &effects {
            let outcome = match &e.op {
                Op::VerifyLocal { .. } => ended(
                    false,
                    DownloadResult::Done { commit: String::new(), metadata: Some(Box::new(qwen())), bytes: 0 },
                ),
                Op::Publish { .. } => Outcome::Done,
                _ => continue,
            };
            next.extend(h.input(Input::EffectDone { id: e.id, outcome }));
        }
        let ready = Published::Status { status: ModelStatus::Ready, reason: None };
        if h.view(&ModelKey::cluster("m"), "u1").published == ready {
            return (h, next);
        }
        effects = next;
    }
    panic!("never Ready");
}

fn fills(effects: &[Effect]) -> Vec<(EffectId, String)> {
    effects
        .iter()
        .filter_map(|e| match &e.op {
            Op::FillSpec { dir, .. } => Some((e.id, dir.clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn with_update_model_spec_a_ready_model_fills_its_spec_once() {
    let (mut h, e) = ready_with_metadata(Config { update_model_spec: true, ..config() });
    let f = fills(&e);
    assert_eq!(f.iter().map(|(_, d)| d.as_str()).collect::<Vec<_>>(), vec!["/mnt/models/m"], "{e:?}");
    assert!(fills(&h.input(Input::EffectDone { id: f[0].0, outcome: Outcome::Done })).is_empty());
    assert!(fills(&h.advance(600_000)).is_empty(), "once per incarnation");
}

#[test]
fn a_failed_spec_fill_is_given_up_and_holds_back_no_cleanup() {
    let (mut h, e) = ready_with_metadata(Config { update_model_spec: true, ..config() });
    let failed = Outcome::Failed("PATCH: forbidden".into());
    let e = h.input(Input::EffectDone { id: fills(&e)[0].0, outcome: failed });
    assert!(fills(&e).is_empty() && fills(&h.advance(600_000)).is_empty(), "not retried");
    // A confirmed delete right after the failure is cleaned up at once (no backoff).
    let e = h.watch(Kind::ClusterBaseModel, WatchEvent::Deleted(local("m", "u1").into()));
    let e = h.input(Input::LiveRead { id: one_get(&e), result: ReadResult::NotFound });
    assert!(matches!(destructive(&e)[..], [Op::Unpublish { .. }]), "{e:?}");
}

#[test]
fn without_update_model_spec_the_agent_never_writes_a_model() {
    let (mut h, e) = ready_with_metadata(config());
    assert!(fills(&e).is_empty() && fills(&h.advance(600_000)).is_empty());
}
