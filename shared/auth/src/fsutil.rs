//! Atomic file writes: a reader sees the old file or the new one, never half
//! of one, and a private file is never readable by others, not even briefly.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write as _};
use std::path::Path;

/// Who may read a file we write.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Mode {
    /// 0600: private keys.
    Private,
    /// 0644: certificates and public keys.
    Public,
}

/// Writes `contents` to `path` through a temporary file in the same
/// directory, fsynced and renamed over the target, then fsyncs the directory.
pub fn write_atomic(path: &Path, contents: &[u8], mode: Mode) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path has no file name"))?;
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let result = (|| {
        let mut options = OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt as _;
            options.mode(match mode {
                Mode::Private => 0o600,
                Mode::Public => 0o644,
            });
        }
        let mut file = options.open(&tmp)?;
        // A stale temporary file from a crashed run keeps its old mode; set it.
        set_mode(&tmp, mode)?;
        file.write_all(contents)?;
        file.sync_all()?;
        drop(file);
        fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result?;
    // Make the rename itself durable. Directories cannot be opened for this
    // everywhere; where they cannot, the rename is still atomic.
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Sets a file's permission bits (no-op off Unix).
pub(crate) fn set_mode(path: &Path, mode: Mode) -> io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let bits = match mode {
            Mode::Private => 0o600,
            Mode::Public => 0o644,
        };
        fs::set_permissions(path, fs::Permissions::from_mode(bits))?;
    }
    #[cfg(not(unix))]
    let _ = (path, mode);
    Ok(())
}

/// Reads a UTF-8 file, `None` if it does not exist.
pub(crate) fn read_opt(path: &Path) -> io::Result<Option<String>> {
    match fs::read_to_string(path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    #[test]
    fn private_files_are_0600_and_replaced_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k.pem");
        write_atomic(&path, b"one", Mode::Private).unwrap();
        write_atomic(&path, b"two", Mode::Private).unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "two");
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        // No temporary files left behind.
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
        assert_eq!(read_opt(&dir.path().join("absent")).unwrap(), None);
    }
}
