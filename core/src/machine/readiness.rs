//! Readiness, as a pure function of the core's state.

use super::*;

/// One readiness check and why it fails.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Check {
    pub name: String,
    pub ok: bool,
    pub detail: String,
}

/// Readiness, as a pure function of state.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Readiness {
    pub ready: bool,
    pub checks: Vec<Check>,
}

impl State {
    /// ClusterBaseModels placed here that download: only they make write access part of
    /// readiness in `auto` (cluster-admin intent). A namespaced BaseModel that cannot download
    /// here is Failed on this node and never flips readiness: no tenant can stall a rollout.
    pub fn models_needing_write(&self) -> Vec<ModelKey> {
        let node = self.node.as_deref();
        let keys = self
            .slots
            .iter()
            .filter(|(key, _)| key.kind == Kind::ClusterBaseModel)
            .filter_map(|(key, slot)| {
                let inc = slot.current.as_ref()?;
                let downloads = inc.obj.spec().and_then(|s| s.uri.as_ref().ok()).is_some_and(|u| u.downloads());
                let placed = inc.may_stay();
                (downloads && placed && eligible_now(inc, node) == Some(true)).then(|| key.clone())
            })
            .collect::<Vec<_>>();
        sorted(keys)
    }

    /// Ready iff the first list of every kind completed and the models root exists, is a
    /// readable directory, and is writable when (and only when) write access is required.
    pub fn readiness(&self) -> Readiness {
        let mut checks = Vec::new();
        for kind in Kind::ALL {
            let synced = self.synced(kind);
            checks.push(Check {
                name: format!("{}-synced", kind.plural()),
                ok: synced,
                detail: if synced { "first list completed".into() } else { "waiting for the first list".into() },
            });
        }
        let root_path = &self.config.models_root;
        let (root_ok, root_detail) = match &self.root {
            None => (false, format!("models root {root_path} not probed yet")),
            Some(p) if !p.answered => (false, format!("models root {root_path} {}", p.detail)),
            Some(p) if !p.exists => (false, format!("models root {root_path} does not exist ({})", p.detail)),
            Some(p) if !p.is_dir => (false, format!("models root {root_path} is not a directory")),
            Some(p) if !p.readable => (false, format!("models root {root_path} is not readable ({})", p.detail)),
            Some(_) => (true, format!("models root {root_path} is a readable directory")),
        };
        checks.push(Check { name: "models-root".into(), ok: root_ok, detail: root_detail });
        let needing = self.models_needing_write();
        let required = match self.config.write_check {
            WriteCheck::Always => Some("--models-root-write-check=always".to_string()),
            WriteCheck::Never => None,
            WriteCheck::Auto if needing.is_empty() => None,
            WriteCheck::Auto => {
                let names: Vec<String> = needing.iter().take(5).map(ToString::to_string).collect();
                let more = if needing.len() > 5 { format!(" and {} more", needing.len() - 5) } else { String::new() };
                Some(format!("models that download are placed here: {}{more}", names.join(", ")))
            }
        };
        let writable = self.root.as_ref().is_some_and(|p| p.writable);
        let (ok, detail) = match (required, writable) {
            (None, true) => (true, "write access not required; models root is writable".to_string()),
            (None, false) => (true, "write access not required; models root is read-only".to_string()),
            (Some(why), true) => (true, format!("write access required ({why}); models root is writable")),
            (Some(why), false) => {
                let d = self.root.as_ref().map(|p| p.detail.as_str()).filter(|d| !d.is_empty());
                let d = d.map(|d| format!(" ({d})")).unwrap_or_default();
                (false, format!("models root {root_path} is read-only{d} but write access is required: {why}"))
            }
        };
        checks.push(Check { name: "models-root-writable".into(), ok, detail });
        Readiness { ready: checks.iter().all(|c| c.ok), checks }
    }
}
