//! What the verifier will think of the XDP object, read from the object
//! itself: each function's stack frame and the largest combined stack of any
//! call chain, counted as the oldest kernels count it.
//!
//! The verifier adds up the frames of every chain of BPF-to-BPF calls
//! (static and global functions alike) and refuses a program whose deepest
//! chain passes 512 bytes. Kernels before ~6.9 round each frame up to 32
//! bytes (later ones with a JIT to 16): Debian 12's 6.1 refused a chain of
//! 144 + 168 + 184 = 496 bytes as 544. The figure here rounds to 32, so it
//! is the one the oldest kernel of the matrix sees, on every kernel.
//!
//! A frame is the deepest stack slot the function's code names: a load or
//! store at `r10 - N`, or a pointer `r10 - N` made for a helper or a callee
//! (`rX = r10; rX += -N`, as LLVM writes it). The kernel counts only slots
//! its walk reaches, so this is an upper bound, never an underestimate.
//!
//! Enters: the object's bytes. Leaves: [`StackReport`]. Used by the kernel
//! tier (its budget test) and the bench.

use std::collections::BTreeMap;

use object::{
    Object as _, ObjectSection as _, ObjectSymbol as _, RelocationTarget, SectionIndex, SymbolKind,
};

/// The stack the verifier allows a chain of calls.
pub const STACK_LIMIT: u32 = 512;
/// Each frame is rounded up to this by the oldest kernels of the matrix.
pub const FRAME_ROUNDING: u32 = 32;

/// One function of the object.
#[derive(Clone, Debug)]
pub struct Frame {
    /// Its symbol.
    pub name: String,
    /// Bytes of stack its code names.
    pub bytes: u32,
    /// The functions it calls, by index in [`StackReport::frames`].
    pub calls: Vec<usize>,
}

/// The frames of an object and its deepest chain from one entry.
#[derive(Clone, Debug)]
pub struct StackReport {
    /// Every function with code.
    pub frames: Vec<Frame>,
    /// The deepest chain from the entry: function names, outermost first.
    pub chain: Vec<String>,
    /// Its combined stack, each frame rounded to [`FRAME_ROUNDING`].
    pub combined: u32,
}

impl StackReport {
    /// The chain as `a 144 → b 168 → c 184`, with each frame's own bytes.
    pub fn chain_text(&self) -> String {
        self.chain
            .iter()
            .map(|n| {
                let f = self.frames.iter().find(|f| &f.name == n);
                format!("{n} {}", f.map_or(0, |f| f.bytes))
            })
            .collect::<Vec<_>>()
            .join(" → ")
    }
}

const BPF_JMP_CALL: u8 = 0x85;
const BPF_PSEUDO_CALL: u8 = 1;
const FP: u8 = 10;

/// An instruction's fields.
#[derive(Clone, Copy)]
struct Insn {
    code: u8,
    dst: u8,
    src: u8,
    off: i16,
    imm: i32,
}

fn insn(b: &[u8]) -> Insn {
    Insn {
        code: b[0],
        dst: b[1] & 0x0f,
        src: b[1] >> 4,
        off: i16::from_le_bytes([b[2], b[3]]),
        imm: i32::from_le_bytes([b[4], b[5], b[6], b[7]]),
    }
}

/// The deepest slot below r10 that `code` names.
fn frame_bytes(code: &[Insn]) -> u32 {
    let mut deepest = 0i64;
    // Registers holding r10 + offset, as LLVM makes them for pointers to
    // the stack.
    let mut fp_at: [Option<i64>; 11] = [None; 11];
    let mut skip = false;
    for i in code {
        if skip {
            // The second half of a 16-byte load of an immediate.
            skip = false;
            continue;
        }
        let class = i.code & 0x07;
        let dst = usize::from(i.dst.min(10));
        match class {
            // LDX: a load from r10 + off.
            0x01 if i.src == FP => deepest = deepest.max(-i64::from(i.off)),
            // ST, STX: a store to r10 + off.
            0x02 | 0x03 if i.dst == FP => deepest = deepest.max(-i64::from(i.off)),
            _ => {}
        }
        match (class, i.code) {
            // mov64 dst, r10
            (0x07, 0xbf) if i.src == FP => fp_at[dst] = Some(0),
            // add64 dst, imm on a pointer to the stack
            (0x07, 0x07) if fp_at[dst].is_some() => {
                let at = fp_at[dst].unwrap_or(0) + i64::from(i.imm);
                fp_at[dst] = Some(at);
                deepest = deepest.max(-at);
            }
            // Any other write of a register forgets what it held.
            (0x07 | 0x04, _) => fp_at[dst] = None,
            (0x01, _) | (0x00, _) => {
                fp_at[dst] = None;
                // lddw takes two slots.
                skip = i.code == 0x18;
            }
            // A call clobbers r0-r5.
            (0x05, BPF_JMP_CALL) => fp_at[..6].iter_mut().for_each(|r| *r = None),
            _ => {}
        }
    }
    deepest.max(0) as u32
}

/// Reads `object` (an eBPF ELF object) and follows the calls of the
/// program `entry`.
pub fn stack_report(object: &[u8], entry: &str) -> Result<StackReport, String> {
    let file = object::File::parse(object).map_err(|e| format!("parsing the object: {e}"))?;
    // Functions: (section, first instruction, instruction count, name).
    let mut funcs: Vec<(SectionIndex, usize, usize, String)> = Vec::new();
    for sym in file.symbols() {
        if sym.kind() != SymbolKind::Text || sym.size() == 0 {
            continue;
        }
        let Some(section) = sym.section_index() else {
            continue;
        };
        let name = sym.name().map_err(|e| format!("a symbol's name: {e}"))?;
        funcs.push((
            section,
            (sym.address() / 8) as usize,
            (sym.size() / 8) as usize,
            name.to_string(),
        ));
    }
    funcs.sort_by_key(|f| (f.0.0, f.1));
    let find = |section: SectionIndex, at: usize| {
        funcs
            .iter()
            .position(|(s, start, len, _)| *s == section && at >= *start && at < start + len)
    };
    let mut frames = Vec::with_capacity(funcs.len());
    for (section, start, len, name) in &funcs {
        let sec = file
            .section_by_index(*section)
            .map_err(|e| format!("section of {name}: {e}"))?;
        let data = sec.data().map_err(|e| format!("code of {name}: {e}"))?;
        // Calls resolved by a relocation: the instruction's offset → where
        // it lands (section, instruction).
        let mut relocated = BTreeMap::new();
        for (offset, rel) in sec.relocations() {
            if let RelocationTarget::Symbol(idx) = rel.target()
                && let Ok(sym) = file.symbol_by_index(idx)
                && let Some(target_section) = sym.section_index()
            {
                relocated.insert(
                    offset as usize / 8,
                    (target_section, sym.address(), sym.kind()),
                );
            }
        }
        let code: Vec<Insn> = (*start..start + len)
            .filter_map(|i| data.get(i * 8..i * 8 + 8).map(insn))
            .collect();
        let mut calls = Vec::new();
        for (k, i) in code.iter().enumerate() {
            if i.code != BPF_JMP_CALL || i.src != BPF_PSEUDO_CALL {
                continue;
            }
            let pc = start + k;
            let (target_section, target) = match relocated.get(&pc) {
                // A section symbol: the immediate counts from it.
                Some((s, addr, SymbolKind::Section)) => {
                    (*s, (*addr / 8) as i64 + i64::from(i.imm) + 1)
                }
                // A function's symbol.
                Some((s, addr, _)) => (*s, (*addr / 8) as i64),
                None => (*section, pc as i64 + i64::from(i.imm) + 1),
            };
            let callee = find(target_section, target.max(0) as usize)
                .ok_or_else(|| format!("{name} calls an instruction that is in no function"))?;
            if !calls.contains(&callee) {
                calls.push(callee);
            }
        }
        frames.push(Frame {
            name: name.clone(),
            bytes: frame_bytes(&code),
            calls,
        });
    }
    let root = frames
        .iter()
        .position(|f| f.name == entry)
        .ok_or_else(|| format!("no function {entry} in the object"))?;
    let mut memo: BTreeMap<usize, (u32, Vec<usize>)> = BTreeMap::new();
    let (combined, path) = deepest(&frames, root, &mut memo, &mut Vec::new())?;
    Ok(StackReport {
        chain: path.iter().map(|&i| frames[i].name.clone()).collect(),
        frames,
        combined,
    })
}

fn rounded(bytes: u32) -> u32 {
    bytes.max(1).div_ceil(FRAME_ROUNDING) * FRAME_ROUNDING
}

/// The deepest chain from `f`: its combined stack and its functions.
fn deepest(
    frames: &[Frame],
    f: usize,
    memo: &mut BTreeMap<usize, (u32, Vec<usize>)>,
    open: &mut Vec<usize>,
) -> Result<(u32, Vec<usize>), String> {
    if let Some(known) = memo.get(&f) {
        return Ok(known.clone());
    }
    if open.contains(&f) {
        return Err(format!(
            "{} calls itself (the verifier refuses recursion)",
            frames[f].name
        ));
    }
    open.push(f);
    let mut below = (0, Vec::new());
    for &c in &frames[f].calls {
        let d = deepest(frames, c, memo, open)?;
        if d.0 > below.0 {
            below = d;
        }
    }
    open.pop();
    let mut path = vec![f];
    path.extend(below.1);
    let out = (rounded(frames[f].bytes) + below.0, path);
    memo.insert(f, out.clone());
    Ok(out)
}

/// Most instructions the verifier may process for the program on any
/// kernel (its own limit is 1 000 000): what is left is for the next
/// features and for kernels whose verifier walks further.
pub const MAX_INSTRUCTIONS: u64 = 700_000;
/// Most combined stack of any chain, counted with 32-byte frames.
pub const MAX_STACK: u64 = 448;
/// How much a figure may grow over the one recorded for its kernel, in
/// percent.
pub const GROWTH_PERCENT: u64 = 5;

/// The figures of the program on one kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Figures {
    /// The kernel's release (`uname -r`).
    pub release: String,
    /// Instructions the verifier processed.
    pub instructions: u64,
    /// The deepest chain's combined stack, 32-byte frames.
    pub stack: u64,
}

impl Figures {
    /// The line `cargo xtask vm` reads from a guest's output (and `--record`
    /// writes to the budget file, with a date).
    pub fn line(&self) -> String {
        format!(
            "ratelimit-kernel-figures release={} instructions={} stack={}",
            self.release, self.instructions, self.stack
        )
    }
}

/// The budget file: one line per kernel, `RELEASE INSTRUCTIONS STACK DATE`,
/// `#` comments. Answers the figures recorded for each release.
pub fn parse_budget(text: &str) -> Result<Vec<Figures>, String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        let bad = || {
            format!(
                "line {}: `{line}`: expected RELEASE INSTRUCTIONS STACK DATE, like `6.1.0-44-amd64 160213 448 2026-11-27`",
                n + 1
            )
        };
        if f.len() != 4 {
            return Err(bad());
        }
        out.push(Figures {
            release: f[0].to_string(),
            instructions: f[1].parse().map_err(|_| bad())?,
            stack: f[2].parse().map_err(|_| bad())?,
        });
    }
    Ok(out)
}

/// Checks `now` against the absolute limits and, when its kernel has a
/// record, against that record's figures plus [`GROWTH_PERCENT`]. Answers
/// every broken bound, one per line.
pub fn check_budget(now: &Figures, recorded: Option<&Figures>) -> Result<(), String> {
    let mut broken = Vec::new();
    if now.instructions > MAX_INSTRUCTIONS {
        broken.push(format!(
            "{} instructions on {}: over the budget of {MAX_INSTRUCTIONS} on any kernel",
            now.instructions, now.release
        ));
    }
    if now.stack > MAX_STACK {
        broken.push(format!(
            "a combined stack of {} bytes: over the budget of {MAX_STACK} (32-byte frames)",
            now.stack
        ));
    }
    if let Some(r) = recorded {
        let grown = |now: u64, was: u64| now * 100 > was * (100 + GROWTH_PERCENT);
        if grown(now.instructions, r.instructions) {
            broken.push(format!(
                "{} instructions on {}: more than {GROWTH_PERCENT} % over the {} recorded (say why in the commit and `cargo xtask vm --record`)",
                now.instructions, now.release, r.instructions
            ));
        }
        if grown(now.stack, r.stack) {
            broken.push(format!(
                "a combined stack of {} bytes on {}: more than {GROWTH_PERCENT} % over the {} recorded",
                now.stack, now.release, r.stack
            ));
        }
    }
    if broken.is_empty() {
        Ok(())
    } else {
        Err(broken.join("\n"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(instructions: u64, stack: u64) -> Figures {
        Figures {
            release: "6.1.0-44-amd64".into(),
            instructions,
            stack,
        }
    }

    #[test]
    fn a_figure_that_grows_past_five_percent_or_the_limits_fails() {
        let rec = f(200_000, 416);
        assert!(check_budget(&f(210_000, 416), Some(&rec)).is_ok());
        let e = check_budget(&f(210_001, 416), Some(&rec)).unwrap_err();
        assert!(e.contains("210001 instructions"), "{e}");
        assert!(check_budget(&f(150_000, 448), Some(&rec)).is_err());
        // A kernel with no record: the absolute limits alone.
        assert!(check_budget(&f(699_000, 448), None).is_ok());
        assert!(check_budget(&f(700_001, 100), None).is_err());
        assert!(check_budget(&f(100, 449), None).is_err());
    }

    #[test]
    fn the_budget_file_is_read_and_a_bad_line_named() {
        let text = "# comment\n\n6.1.0-44-amd64 160213 448 2026-11-27\n";
        assert_eq!(parse_budget(text).unwrap(), vec![f(160_213, 448)]);
        let e = parse_budget("6.1 12 x 2026-11-27\n").unwrap_err();
        assert!(e.starts_with("line 1:"), "{e}");
    }
}
