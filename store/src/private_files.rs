//! Files private to the daemon's user.
//!
//! Every local user is a possible attacker, so the data dir is the daemon's
//! alone: directories are created 0700 and files 0600 whatever the umask,
//! nothing in the data dir is reached through a symbolic link (a link
//! planted by whoever can write there would redirect the daemon's writes,
//! as root, onto any file), and a file or directory owned by another user
//! is refused, since its owner can read it or change it under the daemon.

use std::fs::{self, DirBuilder, File, Metadata, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Mode of every file cubed creates in its data dir (and of a backup's).
pub const FILE_MODE: u32 = 0o600;
/// Mode of every directory cubed creates.
pub const DIR_MODE: u32 = 0o700;
/// Permission bits that let the group or others read or write.
pub const SHARED_BITS: u32 = 0o066;

/// The effective uid: files must be owned by it.
pub fn daemon_uid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// Opens `path` without following a symbolic link in its last component,
/// creating it 0600 if `options` create. Refuses anything but a regular
/// file owned by the daemon's user. Opened for writing (`writable`), its
/// mode is set to exactly 0600: the umask may have taken owner bits off a
/// new file, and a file of an older cubed was 0644. A read-only open
/// (`cubed --verify`) changes nothing.
pub fn open_private_file(
    path: &Path,
    options: &mut OpenOptions,
    writable: bool,
) -> io::Result<File> {
    options
        .mode(FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC);
    let file = options.open(path).map_err(|e| explain_link(path, e))?;
    let meta = file.metadata()?;
    check_owner(&meta)?;
    if !meta.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file; cubed keeps only regular files there (remove it)",
        ));
    }
    if writable && meta.mode() & 0o777 != FILE_MODE {
        file.set_permissions(fs::Permissions::from_mode(FILE_MODE))?;
    }
    Ok(file)
}

/// Reads a whole file through [`open_private_file`].
pub fn read_private_file(path: &Path) -> io::Result<Vec<u8>> {
    use std::io::Read;
    let mut file = open_private_file(path, OpenOptions::new().read(true), false)?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Creates `dir` and any missing parents 0700 (the ones it creates; an
/// existing parent keeps its mode), then checks `dir` with
/// [`open_private_dir`].
pub fn create_private_dir_all(dir: &Path) -> io::Result<()> {
    let existed = fs::symlink_metadata(dir).is_ok();
    DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(dir)
        .map_err(|e| explain_link(dir, e))?;
    let handle = open_private_dir(dir)?;
    // The umask only narrows a new directory; it is set to exactly 0700
    // so that the daemon can always enter what it made.
    if !existed {
        handle.set_permissions(fs::Permissions::from_mode(DIR_MODE))?;
    }
    Ok(())
}

/// Opens a directory (`O_DIRECTORY | O_NOFOLLOW`): refuses a symbolic link
/// and a directory owned by another user. The handle is for `fsync` and
/// for `fchmod`.
pub fn open_private_dir(dir: &Path) -> io::Result<File> {
    let handle = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir)
        .map_err(|e| explain_link(dir, e))?;
    check_owner(&handle.metadata()?)?;
    Ok(handle)
}

/// Refuses `meta` unless the daemon's user owns it. The error (like every
/// error here) leaves the path to the caller, which names it.
pub fn check_owner(meta: &Metadata) -> io::Result<()> {
    let ours = daemon_uid();
    if meta.uid() == ours {
        return Ok(());
    }
    Err(io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!(
            "owned by uid {}, but cubed runs as uid {ours}: its owner could read it or change \
             it under cubed, so cubed refuses it. Run cubed as uid {}, or give the data dir to \
             uid {ours} (`chown -R {ours} DIR`)",
            meta.uid(),
            meta.uid()
        ),
    ))
}

/// Turns the `ELOOP` of `O_NOFOLLOW` on a symbolic link into a message
/// that says so.
fn explain_link(path: &Path, e: io::Error) -> io::Error {
    let is_link = fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
    if e.raw_os_error() == Some(libc::ELOOP) || (is_link && e.kind() != io::ErrorKind::NotFound) {
        return link_refused(path);
    }
    e
}

/// Why `path`, a symbolic link, is not used.
pub fn link_refused(path: &Path) -> io::Error {
    let target = fs::read_link(path)
        .map(|t| format!(" (to {})", t.display()))
        .unwrap_or_default();
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!(
            "a symbolic link{target}; cubed follows no links in its data dir, since one \
             planted there would redirect its writes. Replace it with the real file or \
             directory, or pass the real path"
        ),
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_new_file_is_0600_and_an_old_one_is_narrowed() {
        let tmp = tempfile::tempdir().unwrap();
        let new = tmp.path().join("new");
        open_private_file(&new, OpenOptions::new().write(true).create_new(true), true).unwrap();
        assert_eq!(fs::metadata(&new).unwrap().mode() & 0o777, 0o600);
        let old = tmp.path().join("old");
        fs::write(&old, b"x").unwrap();
        fs::set_permissions(&old, fs::Permissions::from_mode(0o644)).unwrap();
        open_private_file(&old, OpenOptions::new().write(true), true).unwrap();
        assert_eq!(fs::metadata(&old).unwrap().mode() & 0o777, 0o600);
    }

    #[test]
    fn a_link_is_refused_naming_it() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("target");
        fs::write(&target, b"precious").unwrap();
        let link = tmp.path().join("LOCK");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let err = open_private_file(&link, OpenOptions::new().write(true).truncate(true), true)
            .unwrap_err()
            .to_string();
        assert!(err.contains("a symbolic link (to "), "{err}");
        assert_eq!(fs::read(&target).unwrap(), b"precious");
        let dir_link = tmp.path().join("wal");
        std::os::unix::fs::symlink(tmp.path(), &dir_link).unwrap();
        let err = open_private_dir(&dir_link).unwrap_err().to_string();
        assert!(err.contains("a symbolic link"), "{err}");
    }
}
