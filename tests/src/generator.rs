//! A flood generator: the floors object's `gen_tx`, an XDP program run with
//! BPF_PROG_RUN in live-frames mode. Each frame it gets a source from a counter
//! (IPv4: 198.18.0.0/15; IPv6: the /64 after 2001:db8::/32) and sends it out
//! of a veth with XDP_TX, millions a second from one CPU.
//!
//! A live-frames run puts its program into the kernel's XDP dispatcher when it
//! starts and takes it out when it ends; each of those rewrites the dispatcher
//! and waits for an RCU grace period, ~22 ms a call on a 2-vCPU VM whatever
//! the call sends: the receiver then idles a third of the time and its floor
//! is the generator's, not its own. The generator is therefore also attached
//! to a veth of its own that carries no traffic (in a namespace of its own),
//! which keeps it in the dispatcher: a call then costs ~1 ms per 16 384
//! frames and the generator offers ~14 Mpps from one CPU, which saturates an
//! XDP_DROP receiver on the other (95–97 % busy).

use std::time::Instant;

use aya::{Ebpf, EbpfLoader};

use crate::{
    net::{NetNs, Pair},
    testrun::{load_xdp, pin_to_cpu, test_run_live_batched},
};

/// The generator, loaded.
pub struct Generator {
    obj: Ebpf,
    fd: i32,
    /// The namespace of the veth the generator is attached to (deleted on
    /// drop, which detaches it).
    _anchor: NetNs,
}

impl Default for Generator {
    fn default() -> Self {
        Self::new()
    }
}

impl Generator {
    /// Loads it.
    pub fn new() -> Self {
        let mut obj = EbpfLoader::new()
            .load(crate::FLOORS_OBJECT)
            .expect("loading the floors object");
        let fd = load_xdp(&mut obj, "gen_tx");
        let anchor = NetNs::new(&crate::unique_tag(), "g");
        std::thread::scope(|s| {
            s.spawn(|| {
                anchor.enter();
                let ok = std::process::Command::new("ip")
                    .args([
                        "link", "add", "rlgen0", "type", "veth", "peer", "name", "rlgen1",
                    ])
                    .status()
                    .is_ok_and(|st| st.success());
                assert!(ok, "creating the generator's anchor veth failed");
                let prog: &mut aya::programs::Xdp = obj
                    .program_mut("gen_tx")
                    .expect("gen_tx")
                    .try_into()
                    .expect("an XDP program");
                prog.attach("rlgen0", aya::programs::XdpMode::Driver)
                    .expect("attaching the generator to its anchor veth");
            })
            .join()
            .expect("anchoring the generator");
        });
        Self {
            obj,
            fd,
            _anchor: anchor,
        }
    }

    /// Sources cycle through `mask + 1` values (a power of two): 0 is one
    /// source, 2^26 − 1 is 67 M of them.
    pub fn set_mask(&mut self, mask: u64) {
        let map = self.obj.map_mut("GEN_CFG").expect("GEN_CFG");
        let mut cfg: aya::maps::Array<&mut aya::maps::MapData, u64> =
            aya::maps::Array::try_from(map).expect("GEN_CFG is an array");
        cfg.set(0, mask, 0).expect("setting GEN_CFG");
    }

    /// Sends one frame in `every` of the generator's runs (1: all): an even
    /// pace below its best, the other runs dropped on its own CPU.
    pub fn set_pace(&mut self, every: u64) {
        let map = self.obj.map_mut("GEN_CFG").expect("GEN_CFG");
        let mut cfg: aya::maps::Array<&mut aya::maps::MapData, u64> =
            aya::maps::Array::try_from(map).expect("GEN_CFG is an array");
        cfg.set(1, every.max(1), 0).expect("setting GEN_CFG");
    }

    /// Sends copies of `frame` (its source rewritten) out of `pair`'s sending
    /// veth from CPU `cpu` for `secs` seconds; answers the frames offered
    /// (sent by the generator; the veth drops those its receiver's queue has
    /// no room for). Bounded in time, and each call into the
    /// kernel sends at most [`FRAMES_PER_CALL`] frames.
    pub fn flood(&self, pair: &Pair, frame: &[u8], secs: f64, cpu: usize) -> u64 {
        self.flood_with(pair, frame, secs, cpu, FRAMES_PER_CALL, BATCH)
    }

    /// [`Generator::flood`] with `frames` frames a call into the kernel (at
    /// most 2^22) in batches of `batch` (1 to 256).
    pub fn flood_with(
        &self,
        pair: &Pair,
        frame: &[u8],
        secs: f64,
        cpu: usize,
        frames: u32,
        batch: u32,
    ) -> u64 {
        assert!(frames <= 1 << 22 && (1..=256).contains(&batch));
        let before = self.offered();
        let tx_if = pair.tx_if.clone();
        let fd = self.fd;
        std::thread::scope(|s| {
            s.spawn(|| {
                pair.tx.enter();
                pin_to_cpu(cpu);
                let c = std::ffi::CString::new(tx_if.as_str()).expect("interface name");
                // SAFETY: a valid C string.
                let ifindex = unsafe { libc::if_nametoindex(c.as_ptr()) };
                assert!(ifindex != 0, "no {tx_if} in the sending namespace");
                let t0 = Instant::now();
                while t0.elapsed().as_secs_f64() < secs {
                    test_run_live_batched(fd, frame, ifindex, frames, batch);
                }
            })
            .join()
            .expect("generator thread");
        });
        self.offered() - before
    }

    /// Frames the generator sent so far, all CPUs.
    pub fn offered(&self) -> u64 {
        let m: aya::maps::PerCpuArray<&aya::maps::MapData, u64> =
            aya::maps::PerCpuArray::try_from(self.obj.map("GEN_SEQ").expect("GEN_SEQ"))
                .expect("GEN_SEQ is a per-CPU array");
        m.get(&1, 0).map_or(0, |v| v.iter().sum())
    }
}

/// Frames per call into the kernel: ~5 ms at the generator's best, so a
/// round's end is never more than that late.
pub const FRAMES_PER_CALL: u32 = 1 << 16;

/// Frames per batch: the kernel's most.
pub const BATCH: u32 = 256;
