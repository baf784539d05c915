//! Checking a camera path before GStreamer opens it: that it is a V4L2 device that captures
//! video. A path that is not one (`/dev/null`, a sound card, a camera's metadata node) is as
//! permanent as a missing one, so it is refused at start (exit 69) rather than retried forever.

use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// `struct v4l2_capability` (linux/videodev2.h).
#[repr(C)]
struct Capability {
    driver: [u8; 16],
    card: [u8; 32],
    bus_info: [u8; 32],
    version: u32,
    capabilities: u32,
    device_caps: u32,
    reserved: [u32; 3],
}

/// `VIDIOC_QUERYCAP`: `_IOR('V', 0, struct v4l2_capability)`.
const VIDIOC_QUERYCAP: libc::c_ulong = (2 << 30)
    | ((std::mem::size_of::<Capability>() as libc::c_ulong) << 16)
    | ((b'V' as libc::c_ulong) << 8);
const CAP_VIDEO_CAPTURE: u32 = 0x0000_0001;
const CAP_VIDEO_CAPTURE_MPLANE: u32 = 0x0000_1000;
/// `capabilities` covers the whole device; `device_caps` this node, when set.
const CAP_DEVICE_CAPS: u32 = 0x8000_0000;

/// Why `device` cannot be a camera, if it cannot.
pub(super) fn check_camera(device: &Path) -> Result<(), String> {
    let meta = std::fs::metadata(device).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => {
            "no such camera device (is it plugged in, and is the user in group \"video\"?)"
                .to_owned()
        }
        _ => format!("cannot open camera device: {e}"),
    })?;
    if !meta.file_type().is_char_device() {
        return Err("not a camera: not a device file".to_owned());
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(device)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::PermissionDenied => {
                format!("cannot open camera device: {e} (is the user in group \"video\"?)")
            }
            _ => format!("cannot open camera device: {e}"),
        })?;
    let mut cap = Capability {
        driver: [0; 16],
        card: [0; 32],
        bus_info: [0; 32],
        version: 0,
        capabilities: 0,
        device_caps: 0,
        reserved: [0; 3],
    };
    // SAFETY: VIDIOC_QUERYCAP writes one `struct v4l2_capability` (this repr(C) layout, 104
    // bytes) to the pointer, which is valid and writable for the call; a device that is not
    // V4L2 refuses the request (ENOTTY) and writes nothing.
    let rc = unsafe {
        libc::ioctl(
            std::os::fd::AsRawFd::as_raw_fd(&file),
            VIDIOC_QUERYCAP,
            std::ptr::from_mut(&mut cap),
        )
    };
    if rc != 0 {
        return Err(format!(
            "not a V4L2 camera (the device does not answer V4L2's query: {})",
            std::io::Error::last_os_error()
        ));
    }
    let caps = if cap.capabilities & CAP_DEVICE_CAPS != 0 {
        cap.device_caps
    } else {
        cap.capabilities
    };
    if caps & (CAP_VIDEO_CAPTURE | CAP_VIDEO_CAPTURE_MPLANE) == 0 {
        let card = String::from_utf8_lossy(&cap.card);
        return Err(format!(
            "V4L2 device \"{}\" does not capture video (a camera's metadata or output node? \
             its capture node is usually the one before)",
            card.trim_end_matches('\0')
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_query_is_videodev2s_request_number() {
        assert_eq!(std::mem::size_of::<Capability>(), 104);
        assert_eq!(VIDIOC_QUERYCAP, 0x8068_5600);
    }

    #[test]
    fn paths_that_are_not_cameras_say_what_they_are() {
        let e = check_camera(Path::new("/dev/null")).unwrap_err();
        assert!(e.starts_with("not a V4L2 camera"), "{e}");
        let e = check_camera(Path::new("/dev")).unwrap_err();
        assert!(e.contains("not a device file"), "{e}");
        let e = check_camera(Path::new("/dev/video-none")).unwrap_err();
        assert!(e.contains("no such camera device"), "{e}");
    }
}
