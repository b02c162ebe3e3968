//! The `bpf(2)` commands aya 0.14 does not wrap, in one place: opening a
//! pinned object and a link by id, pinning an fd, an XDP link's info,
//! counting a hash map's entries in batches, emptying a map (for the
//! tests' shared object), and `BPF_PROG_TEST_RUN` (for the tests and the
//! bench). Each builds its `union bpf_attr` member as a
//! `#[repr(C)]` struct and goes through [`bpf`], the one `unsafe` call.
//!
//! Called by [`super::enforcer`] (links and pins), [`super::Maps`] (counts)
//! and the `tests` crate (test runs).

use std::{
    ffi::CString,
    io,
    os::{
        fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
        unix::ffi::OsStrExt as _,
    },
    path::Path,
};

const BPF_OBJ_PIN: libc::c_long = 6;
const BPF_OBJ_GET: libc::c_long = 7;
const BPF_PROG_TEST_RUN: libc::c_long = 10;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_MAP_GET_NEXT_KEY: libc::c_long = 4;

/// Calls `bpf(cmd, attr, size_of::<A>())`: its return value, or the error.
///
/// # Safety
/// `attr` must be the member of `union bpf_attr` that `cmd` reads, and every
/// pointer in it valid for what the kernel reads or writes there during the
/// call.
unsafe fn bpf<A>(cmd: libc::c_long, attr: &mut A) -> io::Result<libc::c_long> {
    // SAFETY: the caller's contract.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *mut A, std::mem::size_of::<A>()) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// An fd the kernel just returned, owned.
fn owned(fd: libc::c_long) -> OwnedFd {
    // SAFETY: a fresh fd nobody else owns.
    unsafe { OwnedFd::from_raw_fd(fd as i32) }
}

/// `union bpf_attr` for BPF_OBJ_PIN and BPF_OBJ_GET.
#[repr(C)]
#[derive(Default)]
struct ObjAttr {
    pathname: u64,
    bpf_fd: u32,
    file_flags: u32,
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)
}

/// The object pinned at `path` (BPF_OBJ_GET).
pub fn obj_get(path: &Path) -> io::Result<OwnedFd> {
    let c = c_path(path)?;
    let mut attr = ObjAttr {
        pathname: c.as_ptr() as u64,
        ..Default::default()
    };
    // SAFETY: the C string outlives the call.
    unsafe { bpf(BPF_OBJ_GET, &mut attr) }.map(owned)
}

/// Pins the object of `fd` at `path` (BPF_OBJ_PIN).
pub fn obj_pin(fd: BorrowedFd<'_>, path: &Path) -> io::Result<()> {
    let c = c_path(path)?;
    let mut attr = ObjAttr {
        pathname: c.as_ptr() as u64,
        bpf_fd: fd.as_raw_fd() as u32,
        file_flags: 0,
    };
    // SAFETY: the C string outlives the call.
    unsafe { bpf(BPF_OBJ_PIN, &mut attr) }.map(drop)
}

/// `union bpf_attr` for BPF_OBJ_GET_INFO_BY_FD.
#[repr(C)]
#[derive(Default)]
struct InfoAttr {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

/// An XDP link's id and interface index (0 once its interface is gone)
/// (BPF_OBJ_GET_INFO_BY_FD).
pub fn xdp_link_info(fd: BorrowedFd<'_>) -> io::Result<(u32, u32)> {
    // struct bpf_link_info: type, id, prog_id, then (8-aligned) the union whose
    // xdp member starts with the ifindex.
    let mut info = [0u8; 64];
    let mut attr = InfoAttr {
        bpf_fd: fd.as_raw_fd() as u32,
        info_len: info.len() as u32,
        info: info.as_mut_ptr() as u64,
    };
    // SAFETY: the buffer is `info_len` bytes and outlives the call.
    unsafe { bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr) }?;
    let word = |at: usize| u32::from_ne_bytes([info[at], info[at + 1], info[at + 2], info[at + 3]]);
    Ok((word(4), word(16)))
}

/// `union bpf_attr` for BPF_MAP_LOOKUP_BATCH and BPF_MAP_UPDATE_BATCH.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// The entries of the hash map `fd` (keys of `key_size` bytes, values of
/// `value_size`), counted with BPF_MAP_LOOKUP_BATCH: a few calls per million
/// entries, where iterating takes two per entry.
pub fn count_entries(fd: BorrowedFd<'_>, key_size: usize, value_size: usize) -> io::Result<usize> {
    const BATCH: usize = 16 * 1024;
    let value_size = value_size.next_multiple_of(8);
    let mut keys = vec![0u8; BATCH * key_size];
    let mut values = vec![0u8; BATCH * value_size];
    // The batch token is a bucket index (u32) for hash maps.
    let (mut token_in, mut token_out) = ([0u8; 8], [0u8; 8]);
    let mut first = true;
    let mut total = 0usize;
    loop {
        let mut attr = BatchAttr {
            in_batch: if first { 0 } else { token_in.as_ptr() as u64 },
            out_batch: token_out.as_mut_ptr() as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: BATCH as u32,
            map_fd: fd.as_raw_fd() as u32,
            ..Default::default()
        };
        // SAFETY: the buffers hold BATCH keys and values and outlive the call.
        let rc = unsafe { bpf(BPF_MAP_LOOKUP_BATCH, &mut attr) };
        total += attr.count as usize;
        match rc {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(total),
            Err(e) => return Err(e),
        }
        token_in = token_out;
        first = false;
    }
}

/// `union bpf_attr` for BPF_PROG_TEST_RUN.
#[repr(C)]
#[derive(Default)]
struct TestRunAttr {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
    flags: u32,
    cpu: u32,
    batch_size: u32,
    _pad: u32,
}

/// `struct xdp_md`, the context of an XDP test run.
#[repr(C)]
#[derive(Default)]
struct XdpMd {
    data: u32,
    data_end: u32,
    data_meta: u32,
    ingress_ifindex: u32,
    rx_queue_index: u32,
    egress_ifindex: u32,
}

/// `BPF_F_TEST_XDP_LIVE_FRAMES`: frames the program returns XDP_TX or
/// XDP_REDIRECT for really leave through `ingress_ifindex`.
const BPF_F_TEST_XDP_LIVE_FRAMES: u32 = 1 << 1;

/// Runs the XDP program `prog_fd` `repeat` times on `frame` on this CPU
/// (BPF_PROG_TEST_RUN): the last verdict and the mean ns per run the kernel
/// measured.
pub fn test_run(prog_fd: BorrowedFd<'_>, frame: &[u8], repeat: u32) -> io::Result<(u32, u32)> {
    let mut attr = TestRunAttr {
        prog_fd: prog_fd.as_raw_fd() as u32,
        data_size_in: frame.len() as u32,
        data_in: frame.as_ptr() as u64,
        repeat,
        ..Default::default()
    };
    // SAFETY: the frame outlives the call; no output buffers.
    unsafe { bpf(BPF_PROG_TEST_RUN, &mut attr) }?;
    Ok((attr.retval, attr.duration))
}

/// Runs the XDP program `prog_fd` in live-frames mode `frames` times on
/// `frame`, as if it arrived on `ifindex` (of the calling thread's
/// namespace), `batch` frames at a time (at most 256): a traffic generator.
pub fn test_run_live(
    prog_fd: BorrowedFd<'_>,
    frame: &[u8],
    ifindex: u32,
    frames: u32,
    batch: u32,
) -> io::Result<()> {
    let ctx = XdpMd {
        data_end: frame.len() as u32,
        ingress_ifindex: ifindex,
        ..Default::default()
    };
    let mut attr = TestRunAttr {
        prog_fd: prog_fd.as_raw_fd() as u32,
        data_size_in: frame.len() as u32,
        data_in: frame.as_ptr() as u64,
        repeat: frames,
        ctx_size_in: std::mem::size_of::<XdpMd>() as u32,
        ctx_in: &ctx as *const XdpMd as u64,
        flags: BPF_F_TEST_XDP_LIVE_FRAMES,
        batch_size: batch,
        ..Default::default()
    };
    // SAFETY: the frame and the context outlive the call.
    unsafe { bpf(BPF_PROG_TEST_RUN, &mut attr) }.map(drop)
}

/// `union bpf_attr` for BPF_MAP_GET_NEXT_KEY and BPF_MAP_DELETE_ELEM.
#[repr(C)]
#[derive(Default)]
struct ElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    next_key: u64,
    flags: u64,
}

const MAP_TYPE_ARRAY: u32 = 2;
const MAP_TYPE_PERCPU_ARRAY: u32 = 6;
const MAP_TYPE_RINGBUF: u32 = 27;

/// Empties the map `fd` as a fresh one is: an array (per CPU or not) zeroed
/// in one batch, a hash or a trie with every key deleted. A ring buffer is
/// left as it is (its reader takes what it holds). For the tests, which
/// share one loaded object and start each test from its maps emptied.
pub fn clear_map(fd: BorrowedFd<'_>) -> io::Result<()> {
    // struct bpf_map_info: type, id, key_size, value_size, max_entries, …
    let mut info = [0u32; 20];
    let mut attr = InfoAttr {
        bpf_fd: fd.as_raw_fd() as u32,
        info_len: size_of_val(&info) as u32,
        info: info.as_mut_ptr() as u64,
    };
    // SAFETY: the buffer is `info_len` bytes and outlives the call.
    unsafe { bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr) }?;
    let [kind, _, key_size, value_size, max_entries, ..] = info;
    match kind {
        MAP_TYPE_RINGBUF => Ok(()),
        MAP_TYPE_ARRAY | MAP_TYPE_PERCPU_ARRAY => {
            let per = if kind == MAP_TYPE_PERCPU_ARRAY {
                let cpus = aya::util::nr_cpus().map_err(|(_, e)| e)?;
                (value_size as usize).div_ceil(8) * 8 * cpus
            } else {
                value_size as usize
            };
            let keys: Vec<u32> = (0..max_entries).collect();
            let values = vec![0u8; per * max_entries as usize];
            let mut attr = BatchAttr {
                keys: keys.as_ptr() as u64,
                values: values.as_ptr() as u64,
                count: max_entries,
                map_fd: fd.as_raw_fd() as u32,
                ..Default::default()
            };
            // SAFETY: `count` keys and values, both outliving the call.
            unsafe { bpf(BPF_MAP_UPDATE_BATCH, &mut attr) }.map(|_| ())
        }
        _ => {
            let mut key = vec![0u8; key_size as usize];
            loop {
                // The first key each time (a null key): the one before it
                // was deleted.
                let mut attr = ElemAttr {
                    map_fd: fd.as_raw_fd() as u32,
                    next_key: key.as_mut_ptr() as u64,
                    ..Default::default()
                };
                // SAFETY: `next_key` has the map's key size and outlives the call.
                match unsafe { bpf(BPF_MAP_GET_NEXT_KEY, &mut attr) } {
                    Ok(_) => {}
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(()),
                    Err(e) => return Err(e),
                }
                let mut attr = ElemAttr {
                    map_fd: fd.as_raw_fd() as u32,
                    key: key.as_ptr() as u64,
                    ..Default::default()
                };
                // SAFETY: as above.
                unsafe { bpf(BPF_MAP_DELETE_ELEM, &mut attr) }?;
            }
        }
    }
}
