//! What the kernel says of a filesystem and a file: its device, its free space, a file's size;
//! and a finished file made to outlast a power cut.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Free and total bytes of the filesystem holding `path` (for an unprivileged user: what
/// `df` shows as available).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Space {
    pub free: u64,
    pub size: u64,
}

pub(super) fn space(path: &Path) -> std::io::Result<Space> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c` is a NUL-terminated path that outlives the call, and `st` is a valid place
    // for the kernel to write one `statvfs` into; it is read only when the call succeeded.
    let st = unsafe {
        if libc::statvfs(c.as_ptr(), st.as_mut_ptr()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        st.assume_init()
    };
    let unit = st.f_frsize as u64;
    Ok(Space {
        free: (st.f_bavail as u64).saturating_mul(unit),
        size: (st.f_blocks as u64).saturating_mul(unit),
    })
}

/// The device (filesystem) of `path`.
pub(super) fn device(path: &Path) -> std::io::Result<u64> {
    Ok(std::fs::metadata(path)?.dev())
}

/// The size of a regular file at `path`, not following a symbolic link; `None` if there is
/// none (or something else is there).
pub(super) fn file_size(path: &Path) -> Option<u64> {
    std::fs::symlink_metadata(path)
        .ok()
        .filter(std::fs::Metadata::is_file)
        .map(|m| m.len())
}

/// Whether an error says the filesystem is full (or the user's quota is).
pub fn is_full(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
}

/// Makes a finished file outlast a power cut: its data (`fsync`), then its folder's entry that
/// names it (a new file's name is in its folder, which the file's own `fsync` does not write).
/// Blocks while the disk writes what the kernel still holds of them.
pub fn sync_with_folder(path: &Path) -> std::io::Result<()> {
    std::fs::File::open(path)?.sync_all()?;
    match path.parent() {
        Some(folder) if !folder.as_os_str().is_empty() => std::fs::File::open(folder)?.sync_all(),
        _ => std::fs::File::open(".")?.sync_all(),
    }
}
