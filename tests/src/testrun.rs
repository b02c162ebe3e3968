//! The real object loaded (not attached) and run on crafted frames with
//! BPF_PROG_TEST_RUN, which aya 0.14 does not wrap: the call is the daemon's
//! own (`ratelimit_user::kernel::sys`).

use std::{
    os::fd::{AsFd, AsRawFd, BorrowedFd},
    sync::{Mutex, MutexGuard, TryLockError},
};

use aya::{Ebpf, EbpfLoader, programs::Xdp};
use ratelimit_common::{Counter, PROGRAM_NAME, REASON_COUNT, Reason};
use ratelimit_user::{
    kernel::{Maps, sys},
    model::rules::RuleSet,
};

/// The XDP verdicts.
pub const XDP_DROP: u32 = 1;
/// Pass.
pub const XDP_PASS: u32 = 2;

/// The program and its maps: [`Loaded::new`] shares one loaded object
/// between the tests of a process (the kernel tier loads it once per kernel:
/// under emulation a load takes up to a minute), [`Loaded::with_capacity`]
/// loads one of its own.
pub struct Loaded {
    /// The maps, a view of this test's own.
    pub maps: Maps,
    prog_fd: i32,
    object: Object,
}

/// Who holds the loaded object.
enum Object {
    /// This test alone.
    Own(Box<Ebpf>),
    /// The process's shared object, held for as long as this test runs.
    Shared(MutexGuard<'static, Option<Shared>>),
}

/// The process's shared object: the program and the first view of its
/// maps, from which each test's view is opened again.
pub struct Shared {
    ebpf: Ebpf,
    maps: Maps,
    prog_fd: i32,
}

/// The source capacity of the shared object.
const SHARED_SOURCES: u32 = 4096;

static SHARED: Mutex<Option<Shared>> = Mutex::new(None);

/// Loads the embedded object with room for `sources`: the program verified,
/// the maps typed.
fn load(sources: u32) -> (Ebpf, Maps, i32) {
    let mut ebpf = EbpfLoader::new()
        // Room for `sources` of each family.
        .map_max_entries(
            ratelimit_common::MAP_TABLE,
            2 * ratelimit_common::state_lines(sources),
        )
        .map_max_entries(
            ratelimit_common::MAP_BORN,
            2 * ratelimit_common::state_lines(sources),
        )
        .load(ratelimit_user::EBPF_OBJECT)
        .expect("loading the object");
    let maps =
        Maps::from_ebpf(&mut ebpf, Some(ratelimit_common::state_lines(sources))).expect("maps");
    let prog: &mut Xdp = ebpf
        .program_mut(PROGRAM_NAME)
        .expect("program in object")
        .try_into()
        .expect("an XDP program");
    prog.load().expect("the verifier accepts the program");
    let prog_fd = prog.fd().expect("fd").as_fd().as_raw_fd();
    (ebpf, maps, prog_fd)
}

impl Loaded {
    /// The shared object with room for 4096 sources, every map emptied, and
    /// `rules` written: what a fresh load with them would be. A test that
    /// already holds it (two at once) gets an object of its own.
    pub fn new(rules: &RuleSet) -> Self {
        let mut guard = match SHARED.try_lock() {
            Ok(g) => g,
            // A test that failed while holding it: the maps are emptied
            // below all the same.
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return Self::with_capacity(rules, SHARED_SOURCES),
        };
        let shared = guard.get_or_insert_with(|| {
            let (ebpf, maps, prog_fd) = load(SHARED_SOURCES);
            Shared {
                ebpf,
                maps,
                prog_fd,
            }
        });
        for (name, fd) in shared.maps.descriptors() {
            sys::clear_map(fd).unwrap_or_else(|e| panic!("emptying map {name}: {e}"));
        }
        let mut maps = shared.maps.reopen().expect("the maps opened again");
        let prog_fd = shared.prog_fd;
        maps.apply(rules).expect("writing rules");
        Self {
            maps,
            prog_fd,
            object: Object::Shared(guard),
        }
    }

    /// Loads the embedded object with room for `sources` and writes `rules`.
    pub fn with_capacity(rules: &RuleSet, sources: u32) -> Self {
        let (ebpf, mut maps, prog_fd) = load(sources);
        maps.apply(rules).expect("writing rules");
        Self {
            maps,
            prog_fd,
            object: Object::Own(Box::new(ebpf)),
        }
    }

    /// The loaded object.
    pub fn ebpf(&self) -> &Ebpf {
        match &self.object {
            Object::Own(e) => e,
            Object::Shared(g) => &g.as_ref().expect("loaded").ebpf,
        }
    }

    /// The program's fd.
    pub fn prog_fd(&self) -> i32 {
        self.prog_fd
    }

    /// Runs `frame` through the program `repeat` times on this CPU; returns the
    /// last verdict and the mean ns per run the kernel measured.
    pub fn run(&self, frame: &[u8], repeat: u32) -> (u32, u32) {
        test_run(self.prog_fd, frame, repeat)
    }

    /// Instructions the verifier processed, and the program's size in
    /// instructions after translation.
    pub fn verifier_stats(&self) -> (Option<u32>, Option<u32>) {
        let prog: &Xdp = self
            .ebpf()
            .program(PROGRAM_NAME)
            .expect("program")
            .try_into()
            .expect("xdp");
        let info = prog.info().expect("program info");
        (
            info.verified_instruction_count(),
            info.size_translated().map(|b| b / 8),
        )
    }

    /// One run: the verdict.
    pub fn verdict(&self, frame: &[u8]) -> u32 {
        self.run(frame, 1).0
    }

    /// Counters by reason.
    pub fn counters(&self) -> [Counter; REASON_COUNT as usize] {
        self.maps.counters().expect("reading counters")
    }

    /// Packets counted under `reason`.
    pub fn packets(&self, reason: Reason) -> u64 {
        self.counters()[reason as usize].packets
    }
}

/// The fd `prog_fd`, borrowed for a call.
fn prog(prog_fd: i32) -> BorrowedFd<'static> {
    // SAFETY: the callers' program fds stay open while they run it.
    unsafe { BorrowedFd::borrow_raw(prog_fd) }
}

/// Runs `frame` through the program `prog_fd` `repeat` times on this CPU; returns
/// the last verdict and the mean ns per run the kernel measured.
pub fn test_run(prog_fd: i32, frame: &[u8], repeat: u32) -> (u32, u32) {
    sys::test_run(prog(prog_fd), frame, repeat)
        .unwrap_or_else(|e| panic!("BPF_PROG_TEST_RUN on a {}-byte frame: {e}", frame.len()))
}

/// Runs `prog_fd` in live-frames mode `frames` times on `frame`, arriving on
/// `ifindex` (of the calling thread's namespace): a traffic generator.
pub fn test_run_live(prog_fd: i32, frame: &[u8], ifindex: u32, frames: u32) {
    test_run_live_batched(prog_fd, frame, ifindex, frames, 64);
}

/// [`test_run_live`] with `batch` frames per batch (at most 256): the kernel
/// sends each batch at once, and a bigger batch costs the sending CPU less
/// per frame.
pub fn test_run_live_batched(prog_fd: i32, frame: &[u8], ifindex: u32, frames: u32, batch: u32) {
    sys::test_run_live(prog(prog_fd), frame, ifindex, frames, batch)
        .unwrap_or_else(|e| panic!("BPF_PROG_TEST_RUN in live-frames mode: {e}"));
}

/// A program of an object loaded for BPF_PROG_TEST_RUN.
pub fn load_xdp(ebpf: &mut Ebpf, name: &str) -> i32 {
    let prog: &mut Xdp = ebpf
        .program_mut(name)
        .unwrap_or_else(|| panic!("{name} not in the object"))
        .try_into()
        .expect("an XDP program");
    prog.load()
        .unwrap_or_else(|e| panic!("loading {name}: {e}"));
    prog.fd().expect("fd").as_fd().as_raw_fd()
}

/// Pins the calling thread to `cpu`.
pub fn pin_to_cpu(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is valid; CPU_SET on it is in bounds.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        let rc = libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        assert_eq!(
            rc,
            0,
            "sched_setaffinity({cpu}): {}",
            std::io::Error::last_os_error()
        );
    }
}

/// Lets the calling thread run on every CPU again.
pub fn unpin() {
    // SAFETY: a zeroed cpu_set_t is valid; CPU_SET within CPU_SETSIZE is in bounds.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        let n = libc::sysconf(libc::_SC_NPROCESSORS_ONLN).clamp(1, 1024) as usize;
        for cpu in 0..n {
            libc::CPU_SET(cpu, &mut set);
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}
