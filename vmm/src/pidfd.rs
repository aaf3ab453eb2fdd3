//! Taking another process's file descriptors (Linux 5.6: `pidfd_open`,
//! `pidfd_getfd`): how PyTorch's receiver of an expandable segment gets
//! the sender's exported page handles, which are POSIX file descriptors
//! of the sender.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// Copies in this process of descriptors `fds` of process `pid`, in order.
/// On a failure none is kept (those already taken are closed) and the
/// error names the call: `ENOSYS` means a kernel without the syscall
/// (PyTorch then suggests `expandable_segments:False`), `ESRCH` a process
/// that is gone, `EBADF` a descriptor it has closed, `EPERM` a process
/// this one may not trace.
pub fn take_fds(pid: u32, fds: &[i32]) -> Result<Vec<OwnedFd>, (&'static str, io::Error)> {
    // SAFETY: a syscall with integer arguments; no memory is passed.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0u32) };
    if pidfd < 0 {
        return Err(("pidfd_open", io::Error::last_os_error()));
    }
    // SAFETY: a descriptor the kernel just returned, owned by nothing else.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as i32) };
    let mut taken = Vec::with_capacity(fds.len());
    for &fd in fds {
        // SAFETY: a syscall with integer arguments; no memory is passed.
        let r = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0u32) };
        if r < 0 {
            return Err(("pidfd_getfd", io::Error::last_os_error()));
        }
        // SAFETY: a descriptor the kernel just returned, owned by nothing else.
        taken.push(unsafe { OwnedFd::from_raw_fd(r as i32) });
    }
    Ok(taken)
}

/// What a failure of [`take_fds`] means, for an error message: for
/// `ENOSYS`, that the kernel lacks the syscall (PyTorch's hint).
pub fn take_fds_message(call: &str, e: &io::Error) -> String {
    if e.raw_os_error() == Some(libc::ENOSYS) {
        format!(
            "the kernel on this machine does not support the {call} syscall needed to share \
             expandable segments between processes"
        )
    } else {
        e.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, Write};

    #[test]
    fn a_descriptor_of_this_process_comes_back_with_its_file() {
        let mut f = tempfile_in_tmp();
        f.write_all(b"page").unwrap();
        let taken = take_fds(std::process::id(), &[f.as_raw_fd()]).unwrap();
        let mut g = std::fs::File::from(taken.into_iter().next().unwrap());
        g.rewind().unwrap();
        let mut s = String::new();
        g.read_to_string(&mut s).unwrap();
        assert_eq!(s, "page");
        let (call, e) = take_fds(std::process::id(), &[1 << 20]).unwrap_err();
        assert_eq!((call, e.raw_os_error()), ("pidfd_getfd", Some(libc::EBADF)));
    }

    fn tempfile_in_tmp() -> std::fs::File {
        let p = std::env::temp_dir().join(format!("cachealloc-pidfd-{}", std::process::id()));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&p)
            .unwrap();
        let _ = std::fs::remove_file(&p);
        f
    }
}
