//! The XDP program that steers chimed's UDP to its AF_XDP sockets, assembled here in Rust, and the
//! few `bpf(2)` calls that load and attach it.
//!
//! The program is small enough to write as instructions: it reads the clock, checks that a frame is
//! plain Ethernet + IPv4 (no options, not a fragment) or IPv6 (no extension header) + UDP to one of
//! the served addresses and ports, and if so writes the clock reading into the frame's metadata and
//! redirects it to the AF_XDP socket of its receive queue. Everything else (ARP, neighbour
//! discovery, ICMP, TCP, other ports, VLAN-tagged frames, fragments, IP options) is passed to the
//! kernel untouched. Assembling it here means no BPF toolchain (clang, bpf-linker) at build time
//! and no object file in the repository; the instructions are checked by the kernel's verifier at
//! load, and the tests load it.
//!
//! The program is attached with a BPF link (`BPF_LINK_CREATE`), not the older netlink call: the
//! link belongs to a file descriptor, so the kernel detaches the program when chimed exits however
//! it exits, `kill -9` included, and nothing is left on the interface.

use std::{
    ffi::CStr,
    io,
    mem::size_of,
    net::IpAddr,
    os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd},
    ptr,
};

use crate::sys::cvt;

/// What the program writes ahead of each frame it redirects (XDP metadata, read back by the
/// worker at the frame's address minus [`META_LEN`]): the receive time on `CLOCK_MONOTONIC` in
/// nanoseconds, then [`META_MAGIC`].
pub(crate) const META_LEN: usize = 16;
/// Marks metadata as written by this program for this frame; the worker clears it after reading,
/// so that a frame whose metadata was not copied cannot pass off a stale time as its own.
pub(crate) const META_MAGIC: u64 = 0x6368_696d_6578_6470; // "chimexdp"

/// One BPF instruction, as the kernel reads it (`struct bpf_insn`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub(crate) struct Insn {
    code: u8,
    /// Destination register in the low nibble, source register in the high one.
    regs: u8,
    off: i16,
    imm: i32,
}

// Opcodes (include/uapi/linux/bpf.h, bpf_common.h): class | size/op | mode/source.
const ALU64_MOV_K: u8 = 0xb7;
const ALU64_MOV_X: u8 = 0xbf;
const ALU64_ADD_K: u8 = 0x07;
const ALU64_AND_K: u8 = 0x57;
const LDX_W: u8 = 0x61;
const LDX_H: u8 = 0x69;
const LDX_B: u8 = 0x71;
const STX_DW: u8 = 0x7b;
const LD_IMM64: u8 = 0x18;
const JMP_JA: u8 = 0x05;
const JMP_JGT_X: u8 = 0x2d;
const JMP32_JEQ_K: u8 = 0x16;
const JMP32_JNE_K: u8 = 0x56;
const JMP_CALL: u8 = 0x85;
const JMP_EXIT: u8 = 0x95;
const PSEUDO_MAP_FD: u8 = 1;

// Helpers by number (the `___BPF_FUNC_MAPPER` order).
const FN_KTIME_GET_NS: i32 = 5;
const FN_REDIRECT_MAP: i32 = 51;
const FN_XDP_ADJUST_META: i32 = 54;

const XDP_PASS: i32 = 2;

// `struct xdp_md` offsets.
const MD_DATA: i16 = 0;
const MD_DATA_END: i16 = 4;
const MD_DATA_META: i16 = 8;
const MD_RX_QUEUE_INDEX: i16 = 16;

/// A jump target, resolved when the program is finished.
#[derive(Clone, Copy, Debug)]
struct Label(usize);

/// Builds a program instruction by instruction, with forward jumps to labels.
#[derive(Debug, Default)]
struct Asm {
    insns: Vec<Insn>,
    /// Where each label points, once placed.
    labels: Vec<Option<usize>>,
    /// Jumps to patch: the instruction's index and its label.
    fixups: Vec<(usize, Label)>,
}

impl Asm {
    fn emit(&mut self, code: u8, dst: u8, src: u8, off: i16, imm: i32) {
        self.insns.push(Insn {
            code,
            regs: (src << 4) | dst,
            off,
            imm,
        });
    }

    fn label(&mut self) -> Label {
        self.labels.push(None);
        Label(self.labels.len() - 1)
    }

    fn place(&mut self, l: Label) {
        self.labels[l.0] = Some(self.insns.len());
    }

    fn jump(&mut self, code: u8, dst: u8, src: u8, imm: i32, to: Label) {
        self.fixups.push((self.insns.len(), to));
        self.emit(code, dst, src, 0, imm);
    }

    fn mov_imm(&mut self, dst: u8, imm: i32) {
        self.emit(ALU64_MOV_K, dst, 0, 0, imm);
    }

    fn mov(&mut self, dst: u8, src: u8) {
        self.emit(ALU64_MOV_X, dst, src, 0, 0);
    }

    fn ld_imm64(&mut self, dst: u8, src: u8, value: u64) {
        self.emit(LD_IMM64, dst, src, 0, value as u32 as i32);
        self.emit(0, 0, 0, 0, (value >> 32) as u32 as i32);
    }

    /// `if dst + len > data_end goto to`, with `scratch` clobbered: the bounds check the verifier
    /// wants before any read of the frame.
    fn check_len(&mut self, scratch: u8, data: u8, data_end: u8, len: i32, to: Label) {
        self.mov(scratch, data);
        self.emit(ALU64_ADD_K, scratch, 0, 0, len);
        self.jump(JMP_JGT_X, scratch, data_end, 0, to);
    }

    fn finish(mut self) -> Vec<Insn> {
        for &(at, label) in &self.fixups {
            let target = self.labels[label.0].expect("every label used is placed");
            let off = target as isize - at as isize - 1;
            self.insns[at].off = i16::try_from(off).expect("the program is short");
        }
        self.insns
    }
}

/// A UDP destination the program steers to the sockets; `None` as the address matches any.
pub(crate) type Target = (Option<IpAddr>, u16);

/// Assembles the program for `targets`, redirecting through the XSKMAP whose file descriptor is
/// `map_fd`.
pub(crate) fn program(map_fd: RawFd, targets: &[Target]) -> Vec<Insn> {
    // Registers: r1-r5 arguments and scratch (clobbered by calls), r6 the context, r9 the clock
    // reading, r2 data and r3 data_end while parsing.
    let mut a = Asm::default();
    let pass = a.label();
    let redirect = a.label();
    let v4 = a.label();
    let v6 = a.label();

    a.mov(6, 1);
    a.emit(JMP_CALL, 0, 0, 0, FN_KTIME_GET_NS);
    a.mov(9, 0);
    a.emit(LDX_W, 2, 6, MD_DATA, 0);
    a.emit(LDX_W, 3, 6, MD_DATA_END, 0);
    // Ethernet (14) + IPv4 (20) + UDP (8): the shortest frame of interest.
    a.check_len(4, 2, 3, 42, pass);
    a.emit(LDX_H, 4, 2, 12, 0);
    // The EtherType as a little-endian load of its network-order bytes.
    a.jump(JMP32_JEQ_K, 4, 0, i32::from(0x0800u16.swap_bytes()), v4);
    a.jump(JMP32_JEQ_K, 4, 0, i32::from(0x86ddu16.swap_bytes()), v6);
    a.jump(JMP_JA, 0, 0, 0, pass);

    a.place(v4);
    ipv4(&mut a, targets, (redirect, pass));
    a.place(v6);
    ipv6(&mut a, targets, (redirect, pass));
    a.place(redirect);
    to_socket(&mut a, map_fd, pass);
    a.place(pass);
    a.mov_imm(0, XDP_PASS);
    a.emit(JMP_EXIT, 0, 0, 0, 0);
    a.finish()
}

/// An IPv4 frame: UDP without options or fragments, to one of `targets`, jumps to `redirect`;
/// anything else to `pass`.
fn ipv4(a: &mut Asm, targets: &[Target], (redirect, pass): (Label, Label)) {
    a.emit(LDX_B, 4, 2, 14, 0);
    // Version 4 and a 20-byte header: frames with options go to the kernel.
    a.jump(JMP32_JNE_K, 4, 0, 0x45, pass);
    a.emit(LDX_H, 4, 2, 20, 0);
    // More-fragments and the fragment offset (0x3fff in network order): fragments go to the kernel.
    a.emit(ALU64_AND_K, 4, 0, 0, i32::from(0x3fffu16.swap_bytes()));
    a.jump(JMP32_JNE_K, 4, 0, 0, pass);
    a.emit(LDX_B, 4, 2, 23, 0);
    a.jump(JMP32_JNE_K, 4, 0, i32::from(libc::IPPROTO_UDP as u8), pass);
    a.emit(LDX_W, 4, 2, 30, 0);
    a.emit(LDX_H, 5, 2, 36, 0);
    for &(addr, port) in targets {
        let ip = match addr {
            None => None,
            Some(IpAddr::V4(ip)) => Some(ip),
            Some(IpAddr::V6(_)) => continue,
        };
        let next = a.label();
        if let Some(ip) = ip {
            a.jump(
                JMP32_JNE_K,
                4,
                0,
                u32::from_ne_bytes(ip.octets()) as i32,
                next,
            );
        }
        a.jump(JMP32_JEQ_K, 5, 0, i32::from(port.swap_bytes()), redirect);
        a.place(next);
    }
    a.jump(JMP_JA, 0, 0, 0, pass);
}

/// An IPv6 frame: UDP with no extension header, to one of `targets`, jumps to `redirect`;
/// anything else to `pass`.
fn ipv6(a: &mut Asm, targets: &[Target], (redirect, pass): (Label, Label)) {
    // Ethernet (14) + IPv6 (40) + UDP (8).
    a.check_len(4, 2, 3, 62, pass);
    a.emit(LDX_B, 4, 2, 14, 0);
    a.emit(ALU64_AND_K, 4, 0, 0, 0xf0);
    a.jump(JMP32_JNE_K, 4, 0, 0x60, pass);
    // Next header UDP: any extension header (fragments among them) goes to the kernel.
    a.emit(LDX_B, 4, 2, 20, 0);
    a.jump(JMP32_JNE_K, 4, 0, i32::from(libc::IPPROTO_UDP as u8), pass);
    a.emit(LDX_H, 5, 2, 56, 0);
    for &(addr, port) in targets {
        let ip = match addr {
            None => None,
            Some(IpAddr::V6(ip)) => Some(ip),
            Some(IpAddr::V4(_)) => continue,
        };
        let next = a.label();
        a.jump(JMP32_JNE_K, 5, 0, i32::from(port.swap_bytes()), next);
        if let Some(ip) = ip {
            for (i, word) in ip.octets().chunks_exact(4).enumerate() {
                let word = u32::from_ne_bytes(word.try_into().expect("4 bytes"));
                a.emit(LDX_W, 4, 2, 38 + 4 * i as i16, 0);
                a.jump(JMP32_JNE_K, 4, 0, word as i32, next);
            }
        }
        a.jump(JMP_JA, 0, 0, 0, redirect);
        a.place(next);
    }
    a.jump(JMP_JA, 0, 0, 0, pass);
}

/// A frame for the sockets: the clock reading goes into its metadata, then it is redirected to
/// its receive queue's socket through the XSKMAP `map_fd` (to `pass` if there is no room).
fn to_socket(a: &mut Asm, map_fd: RawFd, pass: Label) {
    a.mov(1, 6);
    a.mov_imm(2, -(META_LEN as i32));
    a.emit(JMP_CALL, 0, 0, 0, FN_XDP_ADJUST_META);
    // Without room for the metadata the frame goes to the kernel, whose socket answers it.
    a.jump(JMP32_JNE_K, 0, 0, 0, pass);
    a.emit(LDX_W, 2, 6, MD_DATA_META, 0);
    a.emit(LDX_W, 3, 6, MD_DATA, 0);
    a.check_len(4, 2, 3, META_LEN as i32, pass);
    a.emit(STX_DW, 2, 9, 0, 0);
    a.ld_imm64(4, 0, META_MAGIC);
    a.emit(STX_DW, 2, 4, 8, 0);
    a.ld_imm64(1, PSEUDO_MAP_FD, map_fd as u32 as u64);
    a.emit(LDX_W, 2, 6, MD_RX_QUEUE_INDEX, 0);
    // The low bits of the flags are the action when the queue has no socket: the kernel's.
    a.mov_imm(3, XDP_PASS);
    a.emit(JMP_CALL, 0, 0, 0, FN_REDIRECT_MAP);
    a.emit(JMP_EXIT, 0, 0, 0, 0);
}

// bpf(2) commands and the types and flags used with them.
const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_MAP_TYPE_XSKMAP: u32 = 17;
const BPF_PROG_TYPE_XDP: u32 = 6;
const BPF_XDP: u32 = 37;
/// `XDP_FLAGS_DRV_MODE`: the driver's own XDP hook, not the generic one after the stack has
/// built an skb (which would leave nothing to gain).
pub(crate) const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;

/// The leading fields of `union bpf_attr` for `BPF_MAP_CREATE`.
#[repr(C)]
#[derive(Default)]
struct MapCreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    inner_map_fd: u32,
    numa_node: u32,
    map_name: [u8; 16],
}

/// `union bpf_attr` for `BPF_MAP_UPDATE_ELEM`.
#[repr(C)]
#[derive(Default)]
struct MapElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

/// The leading fields of `union bpf_attr` for `BPF_PROG_LOAD`.
#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

/// The leading fields of `union bpf_attr` for `BPF_LINK_CREATE`.
#[repr(C)]
#[derive(Default)]
struct LinkCreateAttr {
    prog_fd: u32,
    target_ifindex: u32,
    attach_type: u32,
    flags: u32,
}

/// Calls `bpf(cmd, attr, sizeof attr)`; returns the new file descriptor for the commands that
/// make one.
fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<RawFd> {
    // SAFETY: `attr` is a live, initialised `#[repr(C)]` prefix of `union bpf_attr` for `cmd`,
    // and the size passed is its own, so the kernel reads (and for some commands writes) only
    // its bytes; the kernel treats the union's fields beyond that size as zero. Pointers inside
    // it point at buffers the caller keeps alive across this call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            ptr::from_mut(attr),
            size_of::<T>() as libc::c_uint,
        )
    };
    // bpf returns a file descriptor or 0, or -1 with errno.
    cvt(i32::try_from(ret).unwrap_or(-1)).map(|fd| fd as RawFd)
}

fn owned(fd: RawFd) -> OwnedFd {
    // SAFETY: `fd` was just returned by a successful bpf() call that creates a file descriptor,
    // so it is open and owned by nobody else.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

fn name16(name: &str) -> [u8; 16] {
    let mut out = [0u8; 16];
    // The kernel wants at most 15 bytes of [A-Za-z0-9_.] and a NUL.
    for (o, b) in out[..15].iter_mut().zip(name.bytes()) {
        *o = b;
    }
    out
}

/// Makes an XSKMAP with one entry per receive queue.
pub(crate) fn create_xskmap(queues: u32) -> io::Result<OwnedFd> {
    let mut attr = MapCreateAttr {
        map_type: BPF_MAP_TYPE_XSKMAP,
        key_size: 4,
        value_size: 4,
        max_entries: queues,
        map_name: name16("chimed_xsks"),
        ..Default::default()
    };
    bpf(BPF_MAP_CREATE, &mut attr).map(owned)
}

/// Puts the AF_XDP socket `xsk` in `map` for receive queue `queue`.
pub(crate) fn set_xskmap(map: &OwnedFd, queue: u32, xsk: RawFd) -> io::Result<()> {
    let key = queue;
    let value = xsk as u32;
    let mut attr = MapElemAttr {
        map_fd: map.as_raw_fd() as u32,
        key: ptr::from_ref(&key) as u64,
        value: ptr::from_ref(&value) as u64,
        ..Default::default()
    };
    bpf(BPF_MAP_UPDATE_ELEM, &mut attr).map(drop)
}

/// Loads `insns` as an XDP program. On a verifier rejection the error carries the verifier's
/// last lines.
pub(crate) fn load_xdp(insns: &[Insn]) -> io::Result<OwnedFd> {
    const LICENSE: &CStr = c"Dual MIT/GPL";
    let mut log = vec![0u8; 64 * 1024];
    let mut attr = ProgLoadAttr {
        prog_type: BPF_PROG_TYPE_XDP,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: LICENSE.as_ptr() as u64,
        prog_name: name16("chimed_xdp"),
        expected_attach_type: BPF_XDP,
        ..Default::default()
    };
    match bpf(BPF_PROG_LOAD, &mut attr) {
        Ok(fd) => Ok(owned(fd)),
        Err(e)
            if e.raw_os_error() == Some(libc::EACCES) || e.raw_os_error() == Some(libc::EINVAL) =>
        {
            // Load again with the verifier's log, only to say why.
            attr.log_level = 1;
            attr.log_size = log.len() as u32;
            attr.log_buf = log.as_mut_ptr() as u64;
            let again = bpf(BPF_PROG_LOAD, &mut attr);
            if let Ok(fd) = again {
                return Ok(owned(fd));
            }
            let text = String::from_utf8_lossy(&log);
            let text = text.trim_end_matches('\0').trim();
            let tail: Vec<&str> = text.lines().rev().take(3).collect();
            Err(io::Error::new(
                e.kind(),
                format!(
                    "the kernel's verifier refused the XDP program ({e}): {}",
                    tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
                ),
            ))
        }
        Err(e) => Err(e),
    }
}

/// Attaches `prog` to interface `ifindex` in driver mode, through a link that detaches it when
/// the returned descriptor (and any duplicate) is closed.
pub(crate) fn attach_xdp(prog: &OwnedFd, ifindex: u32) -> io::Result<OwnedFd> {
    let mut attr = LinkCreateAttr {
        prog_fd: prog.as_raw_fd() as u32,
        target_ifindex: ifindex,
        attach_type: BPF_XDP,
        flags: XDP_FLAGS_DRV_MODE,
    };
    bpf(BPF_LINK_CREATE, &mut attr).map(owned)
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use super::*;

    #[test]
    fn every_jump_lands_inside_the_program() {
        let targets = [
            (None, 123),
            (Some(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1))), 2002),
            (Some(IpAddr::V6(Ipv6Addr::LOCALHOST)), 123),
        ];
        let insns = program(3, &targets);
        for (i, insn) in insns.iter().enumerate() {
            let class = insn.code & 0x07;
            let is_jump =
                (class == 0x05 || class == 0x06) && insn.code != JMP_CALL && insn.code != JMP_EXIT;
            if is_jump {
                let target = i as isize + 1 + insn.off as isize;
                assert!(
                    (0..insns.len() as isize).contains(&target),
                    "jump at {i} to {target}"
                );
            }
        }
        assert_eq!(insns.last().unwrap().code, JMP_EXIT);
    }

    #[test]
    fn the_instruction_layout_is_the_kernels() {
        assert_eq!(size_of::<Insn>(), 8);
        let mut a = Asm::default();
        a.emit(LDX_H, 4, 2, 12, 0);
        let i = a.finish()[0];
        // dst r4 in the low nibble, src r2 in the high one.
        assert_eq!(i.regs, 0x24);
    }
}
