use super::*;

fn upload(job_id: Uuid, seq: u64) -> Upload {
    Upload {
        job_id,
        epoch: 1,
        seq,
        attempt: 1,
        agent_id: "agent-a".into(),
        node_id: "node-a".into(),
        rank: 0,
        owner: None,
    }
}

/// A checkpoint directory `name` under `root` with a few files, one nested.
fn checkpoint_dir(root: &Path, name: &str, step: &str) -> PathBuf {
    let dir = root.join(name);
    std::fs::create_dir_all(dir.join("shards")).unwrap();
    std::fs::write(dir.join("step"), step).unwrap();
    std::fs::write(dir.join("shards/0.bin"), vec![7u8; 1000]).unwrap();
    std::fs::write(dir.join("empty"), b"").unwrap();
    dir
}

fn local_store(root: &Path) -> CheckpointStore {
    CheckpointStore::open(&format!("file://{}", root.join("store").display())).unwrap()
}

#[test]
fn keys_round_trip_and_only_canonical_ones_parse() {
    let job = Uuid::new_v4();
    let k = key(job, 2, 17, 3);
    assert_eq!(k, format!("jobs/{job}/epoch-2/seq-00000017-attempt-3"));
    assert_eq!(
        parse_key(&k),
        Some(KeyParts {
            job_id: job,
            epoch: 2,
            seq: 17,
            attempt: 3
        })
    );
    assert!(is_store_key(&k));
    for bad in [
        format!("jobs/{job}/epoch-2/seq-17-attempt-3"),
        format!("jobs/{job}/epoch-2/seq-00000017-attempt-3/data"),
        format!("jobs/{job}/epoch-x/seq-00000017-attempt-3"),
        "jobs/not-a-uuid/epoch-1/seq-00000001-attempt-1".to_string(),
        "/ckpt/step-7".to_string(),
    ] {
        assert_eq!(parse_key(&bad), None, "{bad}");
    }
    assert!(!is_store_key("sim:0.5"));
    assert_eq!(step_of_name("step-1200"), Some(1200));
    assert_eq!(step_of_name("step_3"), Some(3));
    assert_eq!(step_of_name("step42"), Some(42));
    assert_eq!(step_of_name("step-"), None);
    assert_eq!(step_of_name("ckpt-attempt-1-rank-0"), None);
    assert_eq!(step_of_name("step-12a"), None);
}

#[tokio::test]
async fn an_upload_commits_with_a_manifest_and_fetches_back_verified() {
    let tmp = tempfile::tempdir().unwrap();
    let store = local_store(tmp.path());
    let job = Uuid::new_v4();
    let dir = checkpoint_dir(tmp.path(), "step-5", "5");

    let m = store.upload(&dir, &upload(job, 5)).await.unwrap();
    assert_eq!(m.key, key(job, 1, 5, 1));
    assert_eq!(m.name, "step-5");
    let paths: Vec<&str> = m.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(paths, ["empty", "shards/0.bin", "step"]);
    assert_eq!(m.size_bytes, 1001);
    assert_eq!(m.sha256, files_digest(&m.files));
    m.validate().unwrap();
    // The manifest is an object of its own, as the layout says.
    assert!(tmp
        .path()
        .join("store")
        .join(&m.key)
        .join(MANIFEST)
        .is_file());
    assert_eq!(store.manifest(&m.key).await.unwrap(), m);
    assert_eq!(store.newest(job).await.unwrap(), Some(m.clone()));

    let dest = tmp.path().join("restore").join("step-5");
    let fetched = store.fetch(&m.key, &dest).await.unwrap();
    assert_eq!(fetched, m);
    assert_eq!(std::fs::read_to_string(dest.join("step")).unwrap(), "5");
    assert_eq!(
        std::fs::read(dest.join("shards/0.bin")).unwrap(),
        vec![7u8; 1000]
    );
    // Nothing half-fetched is left beside it.
    let left: Vec<_> = std::fs::read_dir(tmp.path().join("restore"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["step-5"]);
}

#[tokio::test]
async fn a_partial_upload_is_never_a_checkpoint_nor_the_newest() {
    let tmp = tempfile::tempdir().unwrap();
    let store = local_store(tmp.path());
    let job = Uuid::new_v4();
    let old = checkpoint_dir(tmp.path(), "step-1", "1");
    let committed = store.upload(&old, &upload(job, 1)).await.unwrap();

    // The next upload's objects are all written, but the manifest never
    // is (the agent was killed before the commit).
    let new = checkpoint_dir(tmp.path(), "step-2", "2");
    let partial = store.upload_data(&new, &upload(job, 2)).await.unwrap();
    assert!(tmp
        .path()
        .join("store")
        .join(&partial.key)
        .join("data/step")
        .is_file());

    assert_eq!(store.newest(job).await.unwrap(), Some(committed));
    let e = store.manifest(&partial.key).await.unwrap_err();
    assert!(matches!(e, Error::NoManifest { .. }), "{e}");
    let e = store
        .fetch(&partial.key, &tmp.path().join("restore/step-2"))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("never committed"), "{e}");
    assert!(!tmp.path().join("restore/step-2").exists());
}

#[tokio::test]
async fn a_file_that_does_not_match_its_sha256_fails_the_fetch() {
    let tmp = tempfile::tempdir().unwrap();
    let store = local_store(tmp.path());
    let job = Uuid::new_v4();
    let dir = checkpoint_dir(tmp.path(), "step-3", "3");
    let m = store.upload(&dir, &upload(job, 3)).await.unwrap();

    // Same size, other bytes: only the hash can tell.
    let object = tmp.path().join("store").join(&m.key).join("data/step");
    std::fs::write(&object, "4").unwrap();
    let dest = tmp.path().join("restore/step-3");
    let e = store.fetch(&m.key, &dest).await.unwrap_err();
    let text = e.to_string();
    assert!(
        matches!(&e, Error::Corrupt { path, .. } if path == "step"),
        "{text}"
    );
    assert!(text.contains("does not match the manifest"), "{text}");
    assert!(!dest.exists(), "nothing is handed over");

    // A missing object fails it too.
    std::fs::remove_file(&object).unwrap();
    let e = store.fetch(&m.key, &dest).await.unwrap_err();
    assert!(e.to_string().contains("missing from the store"), "{e}");
}

#[tokio::test]
async fn a_tampered_manifest_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let store = local_store(tmp.path());
    let job = Uuid::new_v4();
    let dir = checkpoint_dir(tmp.path(), "step-3", "3");
    let m = store.upload(&dir, &upload(job, 3)).await.unwrap();
    let path = tmp.path().join("store").join(&m.key).join(MANIFEST);

    let mut escaping = m.clone();
    escaping.files[0].path = "../../etc/passwd".into();
    std::fs::write(&path, serde_json::to_vec(&escaping).unwrap()).unwrap();
    let e = store.manifest(&m.key).await.unwrap_err();
    assert!(e.to_string().contains("leaves the checkpoint"), "{e}");

    let mut resized = m.clone();
    resized.files[2].size = 2;
    std::fs::write(&path, serde_json::to_vec(&resized).unwrap()).unwrap();
    let e = store.manifest(&m.key).await.unwrap_err();
    assert!(matches!(e, Error::BadManifest { .. }), "{e}");
    // A bad manifest is not the newest either.
    assert_eq!(store.newest(job).await.unwrap(), None);
}

#[tokio::test]
async fn a_reupload_to_a_key_uncommits_it_first() {
    let tmp = tempfile::tempdir().unwrap();
    let store = local_store(tmp.path());
    let job = Uuid::new_v4();
    let a = checkpoint_dir(tmp.path(), "a/step-1", "1");
    let m = store.upload(&a, &upload(job, 1)).await.unwrap();
    let b = checkpoint_dir(tmp.path(), "b/step-1", "one");
    // Killed after its data: the old manifest must not vouch for new files.
    store.upload_data(&b, &upload(job, 1)).await.unwrap();
    let e = store.manifest(&m.key).await.unwrap_err();
    assert!(matches!(e, Error::NoManifest { .. }), "{e}");
}

#[tokio::test]
async fn big_files_go_up_in_parts_and_come_back_whole() {
    let tmp = tempfile::tempdir().unwrap();
    let store = local_store(tmp.path());
    let job = Uuid::new_v4();
    let dir = tmp.path().join("step-9");
    std::fs::create_dir_all(&dir).unwrap();
    let big: Vec<u8> = (0..(PART * 2 + 12345)).map(|i| (i % 251) as u8).collect();
    std::fs::write(dir.join("weights"), &big).unwrap();
    let m = store.upload(&dir, &upload(job, 9)).await.unwrap();
    assert_eq!(m.size_bytes, big.len() as u64);
    let dest = tmp.path().join("restore/step-9");
    store.fetch(&m.key, &dest).await.unwrap();
    assert_eq!(std::fs::read(dest.join("weights")).unwrap(), big);
}

#[test]
fn urls_say_what_is_wrong() {
    for (url, want) in [
        ("ftp://x", "use file:///path"),
        ("file://relative/dir", "absolute path"),
        ("s3://", "names a bucket"),
    ] {
        let e = CheckpointStore::open(url).unwrap_err().to_string();
        assert!(e.contains(want), "{url}: {e}");
    }
    CheckpointStore::open("memory://").unwrap();
}

#[tokio::test]
async fn an_empty_or_vanishing_directory_is_never_a_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let store = local_store(tmp.path());
    let job = Uuid::new_v4();
    // A checkpoint directory caught between its files' removal and its own.
    let empty = tmp.path().join("step-5");
    std::fs::create_dir_all(&empty).unwrap();
    let err = store.upload(&empty, &upload(job, 1)).await.unwrap_err();
    assert!(err.to_string().contains("no files"), "{err}");
    // One that is gone by the time it is read.
    let gone = checkpoint_dir(tmp.path(), "step-6", "6");
    std::fs::remove_dir_all(&gone).unwrap();
    assert!(store.upload(&gone, &upload(job, 2)).await.is_err());
    assert!(store.newest(job).await.unwrap().is_none());
    // A whole one uploads.
    let whole = checkpoint_dir(tmp.path(), "step-7", "7");
    store.upload(&whole, &upload(job, 3)).await.unwrap();
    assert_eq!(store.newest(job).await.unwrap().unwrap().seq, 3);
}

/// A job's checkpoint directory is written by hostile code while the
/// agent (root) uploads it: a file that is not the job's user's, however
/// it got there, is never uploaded.
#[tokio::test]
async fn an_upload_for_a_user_takes_only_that_users_files() {
    use std::os::unix::fs::MetadataExt;
    let root = tempfile::tempdir().unwrap();
    let store = local_store(root.path());
    let dir = checkpoint_dir(root.path(), "step-1", "1");
    let mine = std::fs::metadata(dir.join("step")).unwrap().uid();
    let job = Uuid::new_v4();
    // The files are this process's user's: an upload for it goes through.
    let mut up = upload(job, 1);
    up.owner = Some(mine);
    store.upload(&dir, &up).await.unwrap();
    // For another user the same files are refused, and nothing commits.
    let mut up = upload(job, 2);
    up.owner = Some(mine + 4242);
    let err = store.upload(&dir, &up).await.unwrap_err().to_string();
    assert!(err.contains("not the job's user"), "{err}");
    assert!(store.manifest(&up_key(&up)).await.is_err());
}

#[tokio::test]
async fn a_file_swapped_for_a_symbolic_link_is_not_read_through_it() {
    let root = tempfile::tempdir().unwrap();
    let secret = root.path().join("secret");
    std::fs::write(&secret, "not the job's").unwrap();
    let dir = checkpoint_dir(root.path(), "step-1", "1");
    // Listed as a file, then swapped before the agent opens it.
    std::fs::remove_file(dir.join("step")).unwrap();
    std::os::unix::fs::symlink(&secret, dir.join("step")).unwrap();
    let err = open_regular(&dir.join("step"), None).await.unwrap_err();
    assert!(err.to_string().contains("step"), "{err}");
}

fn up_key(up: &Upload) -> String {
    key(up.job_id, up.epoch, up.seq, up.attempt)
}
