//! The checkpoint store: a region's checkpoints in an object store (a local
//! directory by default, S3 by configuration), shared by the region and its
//! agents (docs/jobs.md, docs/architecture.md).
//!
//! # Layout
//! One checkpoint is one prefix,
//! `jobs/{job_id}/epoch-{epoch}/seq-{seq:08}-attempt-{attempt}` (its *key*):
//! - `{key}/data/{path…}`: the files of the checkpoint directory the job
//!   wrote, each under its path relative to that directory;
//! - `{key}/manifest.json`: the [`Manifest`], written **last**. It is the
//!   commit point: a prefix without a manifest (an upload killed half way)
//!   is not a checkpoint, and nothing — [`CheckpointStore::manifest`],
//!   [`CheckpointStore::newest`], the region recording it, an agent
//!   restoring it — ever takes it for one. Such orphans may be swept later.
//!
//! A key is never reused for other contents while it is committed: an
//! upload to a key first deletes any manifest there (uncommitting it), and
//! the seq and attempt in the key keep two writers apart (docs/jobs.md).
//!
//! Every file's size and SHA-256 is in the manifest, with a SHA-256 over the
//! whole file list; [`CheckpointStore::fetch`] checks them all before it
//! hands a checkpoint over.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use futures::StreamExt;
use gangway_shared::agent::CheckpointRecord;
use object_store::path::Path as ObjPath;
use object_store::{ObjectStore, PutPayload, WriteMultipart};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use uuid::Uuid;

/// The manifest's name under a checkpoint's key.
pub const MANIFEST: &str = "manifest.json";
/// The manifest format this code writes and reads.
pub const MANIFEST_FORMAT: u32 = 1;
/// Files at most this big go up in one request; bigger ones in parts of
/// this size (S3 wants parts of at least 5 MiB).
const PART: usize = 8 * 1024 * 1024;
/// Parts of one file in flight at once.
const PARTS_IN_FLIGHT: usize = 4;

/// One file of a checkpoint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestFile {
    /// Relative to the checkpoint directory, `/`-separated.
    pub path: String,
    pub size: u64,
    /// Hex.
    pub sha256: String,
}

/// What `{key}/manifest.json` says: the commit record of one checkpoint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    pub job_id: Uuid,
    pub epoch: i32,
    pub seq: u64,
    pub attempt: i32,
    pub key: String,
    /// The checkpoint directory's name as the job wrote it.
    pub name: String,
    /// Sorted by path.
    pub files: Vec<ManifestFile>,
    pub size_bytes: u64,
    /// SHA-256 (hex) over the JSON of `files`: [`files_digest`].
    pub sha256: String,
    /// When the upload began.
    pub created_at: DateTime<Utc>,
    /// Who uploaded it.
    pub agent_id: String,
    pub node_id: String,
    pub rank: u32,
}

/// Who uploads what: everything of a [`Manifest`] but its contents.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Upload {
    pub job_id: Uuid,
    pub epoch: i32,
    pub seq: u64,
    pub attempt: i32,
    pub agent_id: String,
    pub node_id: String,
    pub rank: u32,
    /// The user (uid) every file must belong to, checked on the open file:
    /// the directory is a job's, written by hostile code while the agent
    /// (root) reads it, and a symbolic link or a swapped directory must not
    /// make the agent upload a file that is not the job's. `None`: any.
    pub owner: Option<u32>,
}

/// The parts of a checkpoint key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct KeyParts {
    pub job_id: Uuid,
    pub epoch: i32,
    pub seq: u64,
    pub attempt: i32,
}

/// The key of a checkpoint.
pub fn key(job_id: Uuid, epoch: i32, seq: u64, attempt: i32) -> String {
    format!("jobs/{job_id}/epoch-{epoch}/seq-{seq:08}-attempt-{attempt}")
}

/// Whether `s` names a checkpoint in the store (rather than a path on an
/// agent or a simulated executor's `sim:` marker).
pub fn is_store_key(s: &str) -> bool {
    s.starts_with("jobs/")
}

/// The parts of a key written by [`key`]; `None` for anything else.
pub fn parse_key(k: &str) -> Option<KeyParts> {
    let mut it = k.split('/');
    let (jobs, job, epoch, seq) = (it.next()?, it.next()?, it.next()?, it.next()?);
    if jobs != "jobs" || it.next().is_some() {
        return None;
    }
    let job_id = Uuid::parse_str(job).ok()?;
    let epoch: i32 = epoch.strip_prefix("epoch-")?.parse().ok()?;
    let (seq, attempt) = seq.strip_prefix("seq-")?.split_once("-attempt-")?;
    let parts = KeyParts {
        job_id,
        epoch,
        seq: seq.parse().ok()?,
        attempt: attempt.parse().ok()?,
    };
    // Only the canonical spelling (no `+1`, no missing zero padding).
    (key(parts.job_id, parts.epoch, parts.seq, parts.attempt) == k).then_some(parts)
}

/// The step a checkpoint directory's name gives, if it gives one:
/// `step-1200`, `step_1200` or `step1200`.
pub fn step_of_name(name: &str) -> Option<u64> {
    let rest = name.strip_prefix("step")?;
    let digits = rest
        .strip_prefix('-')
        .or_else(|| rest.strip_prefix('_'))
        .unwrap_or(rest);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// SHA-256 (hex) over the JSON of a manifest's file list.
pub fn files_digest(files: &[ManifestFile]) -> String {
    hex(&Sha256::digest(
        serde_json::to_vec(files).expect("a file list serialises"),
    ))
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// Whether `path` is a relative, `/`-separated path that stays inside the
/// directory it is relative to.
fn safe_relative(path: &str) -> bool {
    !path.is_empty()
        && path
            .split('/')
            .all(|p| !p.is_empty() && p != "." && p != ".." && !p.contains('\0'))
}

impl Manifest {
    /// The summary an agent reports and the region records.
    pub fn record(&self) -> CheckpointRecord {
        CheckpointRecord {
            job_id: self.job_id,
            epoch: self.epoch,
            seq: self.seq,
            attempt: self.attempt,
            key: self.key.clone(),
            name: self.name.clone(),
            size_bytes: self.size_bytes,
            files: self.files.len().try_into().unwrap_or(u32::MAX),
            sha256: self.sha256.clone(),
            created_at: self.created_at,
            node_id: self.node_id.clone(),
            rank: self.rank,
        }
    }

    /// Checks that the manifest is whole and consistent: its key is the
    /// canonical one for its job, epoch, seq and attempt, its paths stay
    /// inside the checkpoint, and its sizes and digest add up.
    pub fn validate(&self) -> Result<(), String> {
        if self.format != MANIFEST_FORMAT {
            return Err(format!(
                "format {} (this Gangway reads {MANIFEST_FORMAT})",
                self.format
            ));
        }
        let want = key(self.job_id, self.epoch, self.seq, self.attempt);
        if self.key != want {
            return Err(format!("key {:?} should be {want:?}", self.key));
        }
        if self.name.is_empty() || self.name.contains('/') || !safe_relative(&self.name) {
            return Err(format!(
                "directory name {:?} is not a plain name",
                self.name
            ));
        }
        let mut total = 0u64;
        for (i, f) in self.files.iter().enumerate() {
            if !safe_relative(&f.path) {
                return Err(format!("file path {:?} leaves the checkpoint", f.path));
            }
            if i > 0 && self.files[i - 1].path >= f.path {
                return Err(format!("file list not sorted or repeats {:?}", f.path));
            }
            total = total.saturating_add(f.size);
        }
        if total != self.size_bytes {
            return Err(format!(
                "files add up to {total} bytes, size_bytes says {}",
                self.size_bytes
            ));
        }
        let digest = files_digest(&self.files);
        if digest != self.sha256 {
            return Err(format!(
                "file list digest {digest} does not match sha256 {}",
                self.sha256
            ));
        }
        Ok(())
    }
}

/// What can go wrong with a checkpoint; every message names the checkpoint
/// and what to look at.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("checkpoint store {url:?}: {why}")]
    Url { url: String, why: String },
    #[error(
        "checkpoint {key}: no manifest in the checkpoint store, so it was never committed \
         (a partial or unfinished upload, or a store other than the one it was uploaded to)"
    )]
    NoManifest { key: String },
    #[error("checkpoint {key}: its manifest is invalid: {why}")]
    BadManifest { key: String, why: String },
    #[error("checkpoint {key}: file {path}: {why}")]
    Corrupt {
        key: String,
        path: String,
        why: String,
    },
    #[error("checkpoint directory {}: {why}", path.display())]
    Dir { path: PathBuf, why: String },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("checkpoint store: {what}: {source}")]
    Store {
        what: String,
        #[source]
        source: object_store::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn store_err(what: impl Into<String>) -> impl FnOnce(object_store::Error) -> Error {
    let what = what.into();
    move |source| Error::Store { what, source }
}

/// A region's checkpoint store.
#[derive(Clone, Debug)]
pub struct CheckpointStore {
    store: Arc<dyn ObjectStore>,
    url: String,
}

impl CheckpointStore {
    /// Opens the store at `url`:
    /// - `file:///path` (or a bare absolute path): a local directory,
    ///   created if missing;
    /// - `s3://bucket` or `s3://bucket/prefix`: S3 or an S3-compatible
    ///   server, configured by the standard `AWS_*` environment variables
    ///   (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`,
    ///   `AWS_ENDPOINT`, `AWS_ALLOW_HTTP` …);
    /// - `memory://`: in this process only (tests).
    pub fn open(url: &str) -> Result<Self> {
        let bad = |why: String| Error::Url {
            url: url.to_string(),
            why,
        };
        let store: Arc<dyn ObjectStore> = if url.starts_with('/') {
            return Self::open(&format!("file://{url}"));
        } else if let Some(path) = url.strip_prefix("file://") {
            if !path.starts_with('/') {
                return Err(bad(
                    "a file:// URL needs an absolute path (file:///var/lib/gangway/checkpoints)"
                        .into(),
                ));
            }
            std::fs::create_dir_all(path).map_err(|e| bad(format!("cannot create {path}: {e}")))?;
            Arc::new(
                object_store::local::LocalFileSystem::new_with_prefix(path)
                    .map_err(|e| bad(e.to_string()))?,
            )
        } else if url.starts_with("s3://") {
            let parsed = url::Url::parse(url).map_err(|e| bad(e.to_string()))?;
            let bucket = parsed
                .host_str()
                .filter(|b| !b.is_empty())
                .ok_or_else(|| bad("an s3:// URL names a bucket: s3://bucket/prefix".into()))?;
            let s3 = object_store::aws::AmazonS3Builder::from_env()
                .with_bucket_name(bucket)
                .build()
                .map_err(|e| bad(e.to_string()))?;
            let prefix = parsed.path().trim_matches('/');
            if prefix.is_empty() {
                Arc::new(s3)
            } else {
                Arc::new(object_store::prefix::PrefixStore::new(s3, prefix))
            }
        } else if url == "memory://" {
            Arc::new(object_store::memory::InMemory::new())
        } else {
            return Err(bad(
                "use file:///path, s3://bucket/prefix or memory://".into()
            ));
        };
        Ok(CheckpointStore {
            store,
            url: url.to_string(),
        })
    }

    /// The URL it was opened with.
    pub fn url(&self) -> &str {
        &self.url
    }

    fn location(key: &str, rel: &str) -> ObjPath {
        ObjPath::from_iter(key.split('/').chain(rel.split('/')))
    }

    fn data_location(key: &str, path: &str) -> ObjPath {
        Self::location(key, &format!("data/{path}"))
    }

    /// Uploads `dir` and then commits it: [`Self::upload_data`], then
    /// [`Self::commit`].
    pub async fn upload(&self, dir: &Path, up: &Upload) -> Result<Manifest> {
        let manifest = self.upload_data(dir, up).await?;
        self.commit(&manifest).await?;
        Ok(manifest)
    }

    /// Uploads every file of the checkpoint directory `dir` under the key
    /// `up` names, hashing as it streams, and returns the manifest that
    /// would commit it — without writing it: until [`Self::commit`] the
    /// objects are no checkpoint. Any manifest already at the key is
    /// deleted first, so a key is never committed while its files change.
    /// Symbolic links in `dir` are skipped.
    pub async fn upload_data(&self, dir: &Path, up: &Upload) -> Result<Manifest> {
        let created_at = Utc::now();
        let key = key(up.job_id, up.epoch, up.seq, up.attempt);
        let name = dir
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| Error::Dir {
                path: dir.to_path_buf(),
                why: "its name is not UTF-8".into(),
            })?
            .to_string();
        let listed = {
            let owned = dir.to_path_buf();
            tokio::task::spawn_blocking(move || list_files(&owned))
                .await
                .map_err(|e| Error::Dir {
                    path: dir.to_path_buf(),
                    why: format!("listing it failed: {e}"),
                })??
        };
        // A directory being removed (its files unlinked before it goes) or
        // replaced lists empty for a moment: that is no checkpoint.
        if listed.is_empty() {
            return Err(Error::Dir {
                path: dir.to_path_buf(),
                why: "it holds no files (being written or removed?)".into(),
            });
        }
        match self.store.delete(&Self::location(&key, MANIFEST)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(store_err(format!("uncommitting {key}"))(e)),
        }
        let mut files = Vec::with_capacity(listed.len());
        for rel in listed {
            let local = rel.split('/').fold(dir.to_path_buf(), |p, c| p.join(c));
            let loc = Self::data_location(&key, &rel);
            let (size, sha256) = self.put_file(&local, &loc, up.owner).await?;
            files.push(ManifestFile {
                path: rel,
                size,
                sha256,
            });
        }
        let size_bytes = files.iter().map(|f| f.size).sum();
        Ok(Manifest {
            format: MANIFEST_FORMAT,
            job_id: up.job_id,
            epoch: up.epoch,
            seq: up.seq,
            attempt: up.attempt,
            sha256: files_digest(&files),
            key,
            name,
            files,
            size_bytes,
            created_at,
            agent_id: up.agent_id.clone(),
            node_id: up.node_id.clone(),
            rank: up.rank,
        })
    }

    /// Copies in a checkpoint another store holds, its files fetched into
    /// `dir` (named as the manifest's `name`): they are uploaded under the
    /// manifest's key and, only if every one's size and SHA-256 match the
    /// manifest, the manifest is committed as it is (its provenance kept).
    /// A copy that does not match is never committed. How a region's
    /// checkpoints reach the region holding its jobs' intent.
    pub async fn upload_copy(&self, dir: &Path, manifest: &Manifest) -> Result<()> {
        manifest.validate().map_err(|why| Error::BadManifest {
            key: manifest.key.clone(),
            why,
        })?;
        let up = Upload {
            job_id: manifest.job_id,
            epoch: manifest.epoch,
            seq: manifest.seq,
            attempt: manifest.attempt,
            agent_id: manifest.agent_id.clone(),
            node_id: manifest.node_id.clone(),
            rank: manifest.rank,
            owner: None,
        };
        let copied = self.upload_data(dir, &up).await?;
        if copied.key != manifest.key || copied.files != manifest.files {
            return Err(Error::BadManifest {
                key: manifest.key.clone(),
                why: "the copied files do not match the manifest".into(),
            });
        }
        self.commit(manifest).await
    }

    /// Writes the manifest: from now on the checkpoint exists.
    pub async fn commit(&self, manifest: &Manifest) -> Result<()> {
        manifest.validate().map_err(|why| Error::BadManifest {
            key: manifest.key.clone(),
            why,
        })?;
        let body = serde_json::to_vec_pretty(manifest).expect("a manifest serialises");
        self.store
            .put(
                &Self::location(&manifest.key, MANIFEST),
                PutPayload::from(body),
            )
            .await
            .map_err(store_err(format!("writing {}/{MANIFEST}", manifest.key)))?;
        Ok(())
    }

    /// Streams one file up; returns its size and SHA-256.
    async fn put_file(
        &self,
        local: &Path,
        loc: &ObjPath,
        owner: Option<u32>,
    ) -> Result<(u64, String)> {
        let mut file = open_regular(local, owner).await?;
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; PART];
        let n = read_full(&mut file, &mut buf).await.map_err(io(local))?;
        hasher.update(&buf[..n]);
        if n < PART {
            self.store
                .put(loc, PutPayload::from(Bytes::copy_from_slice(&buf[..n])))
                .await
                .map_err(store_err(format!("uploading {loc}")))?;
            return Ok((n as u64, hex(&hasher.finalize())));
        }
        let upload = self
            .store
            .put_multipart(loc)
            .await
            .map_err(store_err(format!("starting the upload of {loc}")))?;
        let mut writer = WriteMultipart::new_with_chunk_size(upload, PART);
        writer.write(&buf[..n]);
        let mut size = n as u64;
        let result: Result<()> = async {
            loop {
                let n = read_full(&mut file, &mut buf).await.map_err(io(local))?;
                if n == 0 {
                    return Ok(());
                }
                hasher.update(&buf[..n]);
                size += n as u64;
                writer
                    .wait_for_capacity(PARTS_IN_FLIGHT)
                    .await
                    .map_err(store_err(format!("uploading {loc}")))?;
                writer.write(&buf[..n]);
            }
        }
        .await;
        match result {
            Ok(()) => {
                writer
                    .finish()
                    .await
                    .map_err(store_err(format!("finishing the upload of {loc}")))?;
                Ok((size, hex(&hasher.finalize())))
            }
            Err(e) => {
                let _ = writer.abort().await;
                Err(e)
            }
        }
    }

    /// The committed manifest at `key`, checked ([`Manifest::validate`],
    /// and that it is the one for `key`).
    pub async fn manifest(&self, key: &str) -> Result<Manifest> {
        let bad = |why: String| Error::BadManifest {
            key: key.to_string(),
            why,
        };
        if parse_key(key).is_none() {
            return Err(bad(
                "not a checkpoint key (jobs/{job}/epoch-{e}/seq-{n}-attempt-{a})".into(),
            ));
        }
        let got = match self.store.get(&Self::location(key, MANIFEST)).await {
            Ok(got) => got,
            Err(object_store::Error::NotFound { .. }) => {
                return Err(Error::NoManifest {
                    key: key.to_string(),
                })
            }
            Err(e) => return Err(store_err(format!("reading {key}/{MANIFEST}"))(e)),
        };
        let bytes = got
            .bytes()
            .await
            .map_err(store_err(format!("reading {key}/{MANIFEST}")))?;
        let manifest: Manifest =
            serde_json::from_slice(&bytes).map_err(|e| bad(format!("not a manifest: {e}")))?;
        manifest.validate().map_err(bad)?;
        if manifest.key != key {
            return Err(bad(format!("it names key {:?}", manifest.key)));
        }
        Ok(manifest)
    }

    /// Fetches the checkpoint at `key` into the directory `dest` (created;
    /// its parent must be writable) and verifies every file's size and
    /// SHA-256 against the manifest. The files land in a temporary sibling
    /// first and `dest` appears only once all are verified, so an existing
    /// `dest` is a whole, verified copy and is reused as it is.
    pub async fn fetch(&self, key: &str, dest: &Path) -> Result<Manifest> {
        let manifest = self.manifest(key).await?;
        if tokio::fs::metadata(dest).await.is_ok_and(|m| m.is_dir()) {
            return Ok(manifest);
        }
        let parent = dest.parent().unwrap_or(Path::new("."));
        tokio::fs::create_dir_all(parent)
            .await
            .map_err(io(parent))?;
        let tmp = parent.join(format!(
            ".{}.partial-{}",
            dest.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            Uuid::new_v4().simple()
        ));
        let result = self.fetch_into(&manifest, &tmp).await;
        if let Err(e) = result {
            let _ = tokio::fs::remove_dir_all(&tmp).await;
            return Err(e);
        }
        if let Err(e) = tokio::fs::rename(&tmp, dest).await {
            let _ = tokio::fs::remove_dir_all(&tmp).await;
            // Another worker of the job on this machine fetched it first.
            if !tokio::fs::metadata(dest).await.is_ok_and(|m| m.is_dir()) {
                return Err(io(dest)(e));
            }
        }
        Ok(manifest)
    }

    async fn fetch_into(&self, manifest: &Manifest, dir: &Path) -> Result<()> {
        tokio::fs::create_dir_all(dir).await.map_err(io(dir))?;
        for f in &manifest.files {
            let corrupt = |why: String| Error::Corrupt {
                key: manifest.key.clone(),
                path: f.path.clone(),
                why,
            };
            let local = f.path.split('/').fold(dir.to_path_buf(), |p, c| p.join(c));
            if let Some(parent) = local.parent() {
                tokio::fs::create_dir_all(parent)
                    .await
                    .map_err(io(parent))?;
            }
            let loc = Self::data_location(&manifest.key, &f.path);
            let got = match self.store.get(&loc).await {
                Ok(got) => got,
                Err(object_store::Error::NotFound { .. }) => {
                    return Err(corrupt("missing from the store".into()))
                }
                Err(e) => return Err(store_err(format!("downloading {loc}"))(e)),
            };
            let mut out = tokio::fs::File::create(&local).await.map_err(io(&local))?;
            let mut hasher = Sha256::new();
            let mut size = 0u64;
            let mut stream = got.into_stream();
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(store_err(format!("downloading {loc}")))?;
                hasher.update(&chunk);
                size += chunk.len() as u64;
                if size > f.size {
                    return Err(corrupt(format!(
                        "longer than the {} bytes the manifest says",
                        f.size
                    )));
                }
                out.write_all(&chunk).await.map_err(io(&local))?;
            }
            out.flush().await.map_err(io(&local))?;
            let sha = hex(&hasher.finalize());
            if size != f.size {
                return Err(corrupt(format!(
                    "{size} bytes, the manifest says {}",
                    f.size
                )));
            }
            if sha != f.sha256 {
                return Err(corrupt(format!(
                    "sha256 {sha} does not match the manifest's {}",
                    f.sha256
                )));
            }
        }
        Ok(())
    }

    /// The job's newest committed checkpoint in the store: the highest
    /// (epoch, seq, attempt) with a valid manifest. Prefixes without one
    /// (partial uploads) are passed over.
    pub async fn newest(&self, job_id: Uuid) -> Result<Option<Manifest>> {
        let prefix = ObjPath::from(format!("jobs/{job_id}"));
        let mut committed: Vec<(KeyParts, String)> = Vec::new();
        let mut listing = self.store.list(Some(&prefix));
        while let Some(meta) = listing.next().await {
            let meta = meta.map_err(store_err(format!("listing {prefix}")))?;
            let loc = meta.location.as_ref();
            let Some(k) = loc.strip_suffix(&format!("/{MANIFEST}")) else {
                continue;
            };
            if let Some(parts) = parse_key(k) {
                committed.push((parts, k.to_string()));
            }
        }
        committed.sort();
        while let Some((_, k)) = committed.pop() {
            match self.manifest(&k).await {
                Ok(m) => return Ok(Some(m)),
                Err(e @ (Error::BadManifest { .. } | Error::NoManifest { .. })) => {
                    tracing::warn!(error = %e, "passing over a checkpoint with a bad manifest");
                }
                Err(e) => return Err(e),
            }
        }
        Ok(None)
    }
}

/// Opens a checkpoint's file to read, following no symbolic link in its
/// place (nor waiting on a FIFO), and only if it is a regular file that
/// `owner` (when given) owns — whatever path led to it.
async fn open_regular(path: &Path, owner: Option<u32>) -> Result<tokio::fs::File> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(io(path))?;
    let meta = file.metadata().map_err(io(path))?;
    let refuse = |why: String| Error::Dir {
        path: path.to_path_buf(),
        why,
    };
    if !meta.is_file() {
        return Err(refuse("not a regular file".into()));
    }
    if let Some(owner) = owner.filter(|o| *o != meta.uid()) {
        return Err(refuse(format!(
            "it belongs to uid {}, not the job's user (uid {owner})",
            meta.uid()
        )));
    }
    Ok(tokio::fs::File::from_std(file))
}

/// Reads until `buf` is full or the file ends; returns the bytes read.
async fn read_full(file: &mut tokio::fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read(&mut buf[n..]).await? {
            0 => break,
            m => n += m,
        }
    }
    Ok(n)
}

/// Every regular file under `dir`, as sorted `/`-separated relative paths.
fn list_files(dir: &Path) -> Result<Vec<String>> {
    fn walk(root: &Path, rel: &str, out: &mut Vec<String>) -> Result<()> {
        let here = if rel.is_empty() {
            root.to_path_buf()
        } else {
            root.join(rel)
        };
        for entry in std::fs::read_dir(&here).map_err(io(&here))? {
            let entry = entry.map_err(io(&here))?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else {
                return Err(Error::Dir {
                    path: entry.path(),
                    why: "file names in a checkpoint must be UTF-8".into(),
                });
            };
            let path = if rel.is_empty() {
                name.to_string()
            } else {
                format!("{rel}/{name}")
            };
            let kind = entry.file_type().map_err(io(&entry.path()))?;
            if kind.is_dir() {
                walk(root, &path, out)?;
            } else if kind.is_file() {
                out.push(path);
            } else {
                tracing::warn!(path = %entry.path().display(), "not a regular file: left out of the checkpoint");
            }
        }
        Ok(())
    }
    if !dir.is_dir() {
        return Err(Error::Dir {
            path: dir.to_path_buf(),
            why: "not a directory".into(),
        });
    }
    let mut out = Vec::new();
    walk(dir, "", &mut out)?;
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests;
