//! The shell half of model metadata: reads a model directory for `model-agent-metadata`
//! through a directory fd, one component at a time with `O_NOFOLLOW`, so nothing resolves
//! outside the directory, and gives up at a deadline. It reads only what the pure crate asks
//! for: config files (size-checked before reading) and safetensors headers (by range).

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Instant;

use nix::dir::Dir;
use nix::fcntl::{AtFlags, OFlag, openat};
use nix::sys::stat::{Mode, SFlag, fstatat};

use model_agent_metadata::{Entry, EntryKind, FsError, ModelFiles};

/// Metadata parsing of one model gives up after this long (slow or hung network mounts).
pub const PARSE_DEADLINE_MS: u64 = 10_000;

pub struct FdModelFiles {
    root: OwnedFd,
    deadline: Instant,
}

fn errno(e: nix::errno::Errno) -> FsError {
    if e == nix::errno::Errno::ENOENT { FsError::NotFound } else { FsError::Other(e.to_string()) }
}

impl FdModelFiles {
    /// Open `dir` itself (refusing a symlink as the last component) as the root of all reads.
    pub fn open(dir: &Path, deadline: Instant) -> Result<FdModelFiles, String> {
        let flags = OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_RDONLY;
        let root = nix::fcntl::open(dir, flags, Mode::empty()).map_err(|e| format!("{}: {e}", dir.display()))?;
        Ok(FdModelFiles { root, deadline })
    }

    /// Open `dir` for reading: beneath `models_root` when it is there, from the root's fd one
    /// component at a time without following symlinks; elsewhere (a `local://` share, which the
    /// check reached through any symlinks on its path) its real path, as `open`. Inside, no
    /// symlink is ever followed.
    pub fn open_under(models_root: &Path, dir: &Path, deadline: Instant) -> Result<FdModelFiles, String> {
        let Some(rel) = dir.strip_prefix(models_root).ok().filter(|r| !r.as_os_str().is_empty()) else {
            let real = std::fs::canonicalize(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            return FdModelFiles::open(&real, deadline);
        };
        let rel = rel.to_str().ok_or_else(|| format!("{}: not UTF-8", dir.display()))?;
        let root = crate::fsops::open_root(models_root)?;
        Ok(FdModelFiles { root: crate::fsops::open_beneath(&root, rel)?, deadline })
    }

    fn check_deadline(&self) -> Result<(), FsError> {
        if Instant::now() >= self.deadline { Err(FsError::DeadlineExceeded) } else { Ok(()) }
    }

    /// Open `rel` beneath the root, every component without following symlinks.
    fn open_beneath(&self, rel: &str, last: OFlag) -> Result<OwnedFd, FsError> {
        self.check_deadline()?;
        let parts: Vec<&str> = rel.split('/').filter(|c| !c.is_empty() && *c != ".").collect();
        let mut fd = self.root.try_clone().map_err(|e| FsError::Other(e.to_string()))?;
        for (i, c) in parts.iter().enumerate() {
            if *c == ".." {
                return Err(FsError::Other(format!("{rel:?} contains '..'")));
            }
            // A file is opened without waiting on a pipe or device (`regular_file` refuses one).
            let kind = if i + 1 == parts.len() { last | OFlag::O_NONBLOCK } else { OFlag::O_DIRECTORY };
            fd = openat(fd.as_fd(), *c, kind | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_RDONLY, Mode::empty())
                .map_err(errno)?;
        }
        Ok(fd)
    }

    fn regular_file(&self, rel: &str) -> Result<File, FsError> {
        let file = File::from(self.open_beneath(rel, OFlag::empty())?);
        let meta = file.metadata().map_err(|e| FsError::Other(e.to_string()))?;
        if !meta.is_file() {
            return Err(FsError::Other(format!("{rel}: not a regular file")));
        }
        Ok(file)
    }
}

fn entry_kind(dir: &OwnedFd, name: &std::ffi::CStr) -> (EntryKind, u64) {
    match fstatat(dir.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => match SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) {
            SFlag::S_IFREG => (EntryKind::File, st.st_size.max(0) as u64),
            SFlag::S_IFDIR => (EntryKind::Dir, 0),
            _ => (EntryKind::Other, 0),
        },
        Err(_) => (EntryKind::Other, 0),
    }
}

impl ModelFiles for FdModelFiles {
    fn list_dir(&mut self, rel_dir: &str) -> Result<Vec<Entry>, FsError> {
        let fd = if rel_dir.is_empty() {
            self.root.try_clone().map_err(|e| FsError::Other(e.to_string()))?
        } else {
            self.open_beneath(rel_dir, OFlag::O_DIRECTORY)?
        };
        let stat_fd = fd.try_clone().map_err(|e| FsError::Other(e.to_string()))?;
        let mut dir = Dir::from_fd(fd).map_err(errno)?;
        let mut out = Vec::new();
        for entry in dir.iter() {
            self.check_deadline()?;
            let entry = entry.map_err(errno)?;
            let name = entry.file_name();
            let Ok(text) = name.to_str() else { continue };
            if text == "." || text == ".." {
                continue;
            }
            let (kind, size_bytes) = entry_kind(&stat_fd, name);
            out.push(Entry { name: text.to_string(), kind, size_bytes });
        }
        Ok(out)
    }

    fn read_file(&mut self, rel_path: &str, cap_bytes: u64) -> Result<Vec<u8>, FsError> {
        let file = self.regular_file(rel_path)?;
        let size_bytes = file.metadata().map_err(|e| FsError::Other(e.to_string()))?.len();
        if size_bytes > cap_bytes {
            return Err(FsError::TooLarge { size_bytes, cap_bytes });
        }
        self.read_at(&file, 0, size_bytes)
    }

    fn read_range(&mut self, rel_path: &str, offset_bytes: u64, len_bytes: u64) -> Result<Vec<u8>, FsError> {
        let file = self.regular_file(rel_path)?;
        let size_bytes = file.metadata().map_err(|e| FsError::Other(e.to_string()))?.len();
        let len_bytes = len_bytes.min(size_bytes.saturating_sub(offset_bytes));
        self.read_at(&file, offset_bytes, len_bytes)
    }
}

/// Reads in 1 MiB steps so the deadline is looked at during large reads.
const READ_STEP_BYTES: u64 = 1024 * 1024;

impl FdModelFiles {
    fn read_at(&self, file: &File, offset_bytes: u64, len_bytes: u64) -> Result<Vec<u8>, FsError> {
        let mut buf = vec![0u8; len_bytes as usize];
        let mut done = 0usize;
        while done < buf.len() {
            self.check_deadline()?;
            let end = (done + READ_STEP_BYTES as usize).min(buf.len());
            let n = file
                .read_at(&mut buf[done..end], offset_bytes + done as u64)
                .map_err(|e| FsError::Other(e.to_string()))?;
            if n == 0 {
                break;
            }
            done += n;
        }
        buf.truncate(done);
        Ok(buf)
    }
}

/// What `model-agent inspect` prints, one JSON object: `config` exactly as the agent would
/// publish it (Go's field order and escaping), the spec fields it would fill on an empty spec,
/// where the config was found and how the parameters were counted; or why there is no config.
pub fn inspect(dir: &Path, annotations: &std::collections::BTreeMap<String, String>) -> Result<String, String> {
    use model_agent_metadata::{Outcome, parse_model_dir, spec_fill, to_go_json};
    let deadline = Instant::now() + std::time::Duration::from_millis(PARSE_DEADLINE_MS);
    let mut files = FdModelFiles::open(dir, deadline)?;
    let text = |s: &str| serde_json::Value::from(s).to_string();
    Ok(match parse_model_dir(&mut files, annotations) {
        Outcome::Parsed(m) => format!(
            "{{\"config\":{},\"specFill\":{},\"configPath\":{},\"parameterSource\":{}}}",
            to_go_json(&m.config),
            to_go_json(&spec_fill(&serde_json::Map::new(), &m)),
            text(&m.config_path),
            text(&m.parameter_source)
        ),
        Outcome::Skipped => {
            format!("{{\"skipped\":{}}}", text("annotation ome.oracle.com/skip-config-parsing is true"))
        }
        Outcome::WithoutConfig { reason } => format!("{{\"withoutConfig\":{}}}", text(&reason)),
    })
}

/// What a model directory's config files say, for its Ready entry's `config`. `Err` says why
/// there is none; that is never a failure of the model (OME's agent publishes it Ready too).
pub fn model_config(models_root: &Path, dir: &Path) -> Result<model_agent_core::wire::ModelConfig, String> {
    use model_agent_core::wire;
    let parsed = parse(models_root, dir)?;
    let config: wire::ModelConfig = serde_json::from_str(&model_agent_metadata::to_go_json(&parsed.config))
        .map_err(|e| format!("metadata: {e}"))?;
    if !wire::model_config_fits(&config) {
        return Err(format!("its metadata is larger than {} bytes as JSON", wire::MODEL_CONFIG_BYTES_MAX));
    }
    Ok(config)
}

/// Everything the config files in `dir` say, or why they say nothing.
pub fn parse(models_root: &Path, dir: &Path) -> Result<Box<model_agent_metadata::Metadata>, String> {
    use model_agent_metadata::{Outcome, parse_model_dir};
    let deadline = Instant::now() + std::time::Duration::from_millis(PARSE_DEADLINE_MS);
    let mut files = FdModelFiles::open_under(models_root, dir, deadline)?;
    match parse_model_dir(&mut files, &std::collections::BTreeMap::new()) {
        Outcome::Parsed(parsed) => Ok(parsed),
        Outcome::Skipped => Err("annotation ome.oracle.com/skip-config-parsing is true".into()),
        Outcome::WithoutConfig { reason } => Err(reason),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("model-agent-modelfiles-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn reads_config_and_safetensors_header_through_the_dir_fd() {
        let dir = temp_dir("read");
        std::fs::write(dir.join("config.json"), r#"{"model_type": "llama", "max_position_embeddings": 8192}"#).unwrap();
        let header = br#"{"w":{"dtype":"BF16","shape":[1000,1000],"data_offsets":[0,2000000]}}"#;
        let mut st = (header.len() as u64).to_le_bytes().to_vec();
        st.extend_from_slice(header);
        std::fs::write(dir.join("model.safetensors"), st).unwrap();
        let out = inspect(&dir, &Default::default()).unwrap();
        assert!(out.contains(r#""modelParameterSize":"1M","maxTokens":8192"#), "{out}");
        assert!(out.contains(r#""parameterSource":"safetensors""#), "{out}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_dir_beneath_the_models_root_is_opened_from_the_root_without_symlinks() {
        let root = temp_dir("root");
        let outside = temp_dir("elsewhere");
        std::fs::create_dir_all(root.join("org/model")).unwrap();
        std::fs::write(root.join("org/model/config.json"), r#"{"model_type": "llama"}"#).unwrap();
        std::fs::write(outside.join("config.json"), r#"{"model_type": "bert"}"#).unwrap();
        assert_eq!(model_config(&root, &root.join("org/model")).unwrap().model_type, "llama");
        // A component swapped for a symlink to somewhere else is refused, not followed.
        std::os::unix::fs::symlink(&outside, root.join("org/link")).unwrap();
        let err = model_config(&root, &root.join("org/link")).unwrap_err();
        assert!(err.contains("org/link"), "{err}");
        std::os::unix::fs::symlink(&outside, root.join("via")).unwrap();
        std::fs::create_dir_all(outside.join("deeper")).unwrap();
        assert!(model_config(&root, &root.join("via/deeper")).is_err(), "an intermediate symlink is refused too");
        // Outside the models root (a local:// share) the directory is opened by its real path,
        // as the check reached it.
        assert_eq!(model_config(&root, &outside).unwrap().model_type, "bert");
        let share_link = temp_dir("share-link").join("current");
        std::os::unix::fs::symlink(&outside, &share_link).unwrap();
        assert_eq!(model_config(&root, &share_link).unwrap().model_type, "bert");
        std::fs::remove_dir_all(share_link.parent().unwrap()).unwrap();
        std::fs::remove_dir_all(&root).unwrap();
        std::fs::remove_dir_all(&outside).unwrap();
    }

    #[test]
    fn symlinks_are_never_followed_out_of_the_model_dir() {
        let dir = temp_dir("symlink");
        let outside = temp_dir("outside");
        std::fs::write(outside.join("config.json"), r#"{"model_type": "llama"}"#).unwrap();
        std::os::unix::fs::symlink(outside.join("config.json"), dir.join("config.json")).unwrap();
        std::os::unix::fs::symlink(&outside, dir.join("model")).unwrap();
        let out = inspect(&dir, &Default::default()).unwrap();
        assert!(out.contains("withoutConfig"), "{out}");
        let mut files = FdModelFiles::open(&dir, Instant::now() + std::time::Duration::from_secs(5)).unwrap();
        assert!(files.read_file("model/config.json", 1024).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::remove_dir_all(&outside).unwrap();
    }

    #[test]
    fn a_passed_deadline_stops_reading() {
        let dir = temp_dir("deadline");
        std::fs::write(dir.join("config.json"), r#"{"model_type": "llama"}"#).unwrap();
        let mut files = FdModelFiles::open(&dir, Instant::now()).unwrap();
        assert_eq!(files.read_file("config.json", 1024), Err(FsError::DeadlineExceeded));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A review: a shard that the safetensors index names (not checked against the listing) is
    /// opened without O_NONBLOCK: a FIFO there blocks open(2) for good, past the parse deadline
    /// (the deadline is only looked at between reads). In the agent each such parse keeps one of
    /// the filesystem gate's 8 threads for good; 8 of them and every call on the root (the
    /// readiness probe included) is refused.
    #[test]
    fn a_pipe_named_by_the_safetensors_index_never_hangs_the_parse() {
        let root = temp_dir("pipe-shard");
        let dir = root.join("m");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("config.json"), r#"{"model_type": "llama"}"#).unwrap();
        std::fs::write(dir.join("model.safetensors.index.json"), r#"{"weight_map":{"w":"model-00001.safetensors"}}"#)
            .unwrap();
        let fifo = dir.join("model-00001.safetensors");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let (r, d) = (root.clone(), dir.clone());
        std::thread::spawn(move || {
            let _ = tx.send(model_config(&r, &d).map(|c| c.model_type));
        });
        // Past the parse deadline (10 s).
        let got = rx.recv_timeout(std::time::Duration::from_millis(PARSE_DEADLINE_MS + 2_000));
        {
            use std::os::unix::fs::OpenOptionsExt;
            let _ = std::fs::OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK).open(&fifo);
        }
        assert!(got.is_ok(), "the parse had not returned 2 s past its deadline: blocked opening a FIFO shard");
    }
}
